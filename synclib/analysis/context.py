"""What the analysis blocks share: the settings of one :func:`~synclib.analysis.analyze`
call, its notes, its progress bar, and the ridge fit of one split."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from synclib.analysis.ridge import ComputeOptions, GridFit, Penalty, r2_grid, relative_alphas
from synclib.analysis.samples import HiddenCache, PairedSamples
from synclib.splits import RidgeInputError, episode_split

__all__ = ["Context", "SplitFit", "GenuineFits"]


@dataclass
class SplitFit:
    """The ridge maps of one (condition, direction) on one split seed."""
    samples: PairedSamples
    seed: int
    train: np.ndarray   # (n_train,) indices into the samples
    test: np.ndarray    # (n_test,)
    r2: np.ndarray      # (L_src, L_tgt) test R^2; NaN when the fit was not possible
    alpha: np.ndarray   # (L_src,) the penalty of each source layer
    train_r2: np.ndarray | None = None  # (L_src, L_tgt) training R^2, when asked for
    split: dict | None = None           # the ``info`` of :func:`synclib.splits.episode_split`
    test_loss: tuple | None = None      # (episodes (G,), losses (G, L_src, L_tgt), samples (G,)) per group of one
                                        # test episode and round, when asked for (r2_grid's test_groups)
    test_rounds: np.ndarray | None = None  # (G,) the round of each of those groups
    alpha_relative: np.ndarray | None = None  # (L_src,) with a CV penalty: the penalty over the layer's scale


@dataclass
class GenuineFits:
    """The genuine condition, which the appendix blocks re-use (no fit where the split failed)."""
    samples: dict = field(default_factory=dict)   # direction -> PairedSamples
    fits: dict = field(default_factory=dict)      # (direction, split seed) -> SplitFit, on all genuine's samples


@dataclass
class Context:
    """The settings, notes and progress bar shared by the blocks of one analysis."""
    cube: object                        # xarray.Dataset in the cube schema
    directions: tuple
    split_seeds: list
    n_samples: int | None
    penalty: Penalty                    # the analysis' ridge penalty
    device: object
    precision: str
    max_resident_bytes: int | None
    progress: bool
    log: Callable[[str], None]
    arrays: HiddenCache
    n_boot: int = 0                     # resamples of whole episodes (0: no dialog-level resampling)
    notes: list = field(default_factory=list)
    bar: object = None                  # the tqdm bar of the SyncR^2 grids

    def note(self, msg: str) -> None:
        """Record ``msg`` for the result's ``notes`` attribute (once) and log it."""
        if msg not in self.notes:
            self.notes.append(msg)
            self.log("note: " + msg)

    def split(self, groups, n_groups: int, seed: int, what: str, n_samples: int | None | str = "default"):
        """The reference split (:func:`synclib.splits.episode_split`) of samples in ``groups`` (codes ``0 ..
        n_groups-1``) for ``seed`` at ``n_samples`` (default: the analysis'): ``(train, test, info, rs)``, ``rs`` the
        ``RandomState`` as the split left it (the shuffled control continues it); None and a note where impossible."""
        rs = np.random.RandomState(seed)
        n = self.n_samples if n_samples == "default" else n_samples
        try:
            tr, te, info = episode_split(groups, n, rs, n_groups=n_groups)
        except RidgeInputError as exc:
            self.note(f"{what}: not split ({exc}); left NaN")
            return None
        return tr, te, info, rs

    def fit(self, samples: PairedSamples, seed: int, train, test, what: str, *,
            train_r2: bool = False, split: dict | None = None, penalty=None,
            episode_loss: bool = False) -> SplitFit:
        """The R^2 grid of ``samples`` fitted on ``train``, scored on ``test`` (sample indices); with ``train_r2``
        also on ``train``, with ``episode_loss`` each test episode's and round's share of the test loss
        (``test_loss``, ``test_rounds``: the episode bootstrap, the scores per round).  ``split`` is kept on the
        result; ``penalty`` (a :class:`~synclib.analysis.ridge.Penalty` or a fixed (L_src,) array) replaces the
        analysis'.  A split too small or degenerate to fit gives NaN and a note."""
        Ls, Lt = samples.X.shape[1], samples.Y.shape[1]
        R = int(samples.round.max(initial=0)) + 1
        try:
            penalty = self.penalty if penalty is None else Penalty.of(penalty)
            X, Y, tr, te = samples.ridge_inputs(train, test)
            out = r2_grid(X, Y, tr, te, penalty, groups=samples.episode[train] if penalty.cv else None,
                          test_groups=samples.episode[test] * R + samples.round[test] if episode_loss else None,
                          train_r2=train_r2, compute=ComputeOptions(precision=self.precision, device=self.device))
            relative = relative_alphas(X, tr, out.alpha) if penalty.cv else None
        except RidgeInputError as exc:
            self.note(f"{what}: not fitted ({exc}); left NaN")
            nan = np.full((Ls, Lt), np.nan)
            out, relative = GridFit(nan, np.full(Ls, np.nan), nan if train_r2 else None), None
        loss = rounds = None
        if out.test_loss is not None:
            g = out.test_loss
            loss, rounds = (g.labels // R, g.loss, g.sizes), g.labels % R
        return SplitFit(samples, seed, np.asarray(train), np.asarray(test), out.r2, out.alpha,
                        out.train_r2, split, loss, rounds, relative)
