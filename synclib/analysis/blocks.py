"""The analysis blocks: one function per block, each returning an ``xarray.Dataset``.

* :func:`conditions_block`: genuine and controls (passive, shuffled, lags): grids, SyncR^2, top-k, unclipped, SyncR^2
  on resamples of whole episodes (ours), linear CKA per layer pair on all samples (ours); paper 3.3, figs 2-4, app. C.
* :func:`paper_alpha_block`: genuine at the paper's penalty (runs with another), clipped and not; fig 8.
* :func:`persona_block`: genuine, persona-disjoint split; table 2.
* :func:`sample_size_block`: genuine at smaller sample sizes; app. D.
* :func:`relationship_block`: genuine maps scored on test subsets by relationship; app. G.
* :func:`nonlinear_block`: MLP against the affine map on a few layer pairs; app. I.
* :func:`tom_block`: Theory-of-Mind decoding; app. J.

:func:`conditions_block` runs first and returns, with its Dataset, the genuine fits
(:class:`~synclib.analysis.context.GenuineFits`: samples per direction, splits, penalties and maps per split seed),
the ``genuine`` the other blocks re-use; their scores are aggregated over split seeds as the main SyncR^2.
Variables, dims and coordinates are documented in book/architecture.md ("Analysis results").
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import asdict, dataclass, replace

import numpy as np
import xarray as xr
from tqdm import tqdm

from synclib.analysis.cka import cka_grid, cka_null
from synclib.analysis.context import Context, GenuineFits, SplitFit
from synclib.analysis.contrasts import CONTRAST_RULE, SIDES, common_rows, contrast_fits, contrast_variables
from synclib.analysis.mlp import STOPPING_RULE, MLPOptions, mlp_r2_batch
from synclib.analysis.samples import (PairedSamples, build_dataset, persona_keys, shuffle_training_targets,
                                      sim_seed_rank)
from synclib.analysis.scores import (best_targets, seed_aggregate, sync_r2, sync_r2_at, sync_r2_many, sync_r2_noclip,
                                     sync_r2_topk)
from synclib.analysis.ridge import PAPER_ALPHA, ComputeOptions, r2_grid, r2_grid_subsets, resampled_r2
from synclib.analysis.tom import tom_decode
from synclib.splits import RidgeInputError, validation_split
from synclib.stats import BOOT_SEED, N_BOOT, episode_draws, mean_se
from synclib.tasks.scenarios import RELATIONSHIPS

__all__ = ["conditions_block", "own_splits", "episode_draws", "episode_bootstrap", "N_BOOT", "BOOT_SEED", "BOOT_RULE",
           "paper_alpha_block", "persona_block", "sample_size_block", "relationship_block",
           "nonlinear_block", "tom_block", "Conditions", "RELATIONSHIP_SOURCES", "AGGREGATION",
           "SPLIT_RULE", "PERSONA_SPLIT_RULE", "SHUFFLE_RULE", "CKA_RULE", "CKA_SHUFFLE_SEED", "CKA_PERMUTATIONS"]

#: appendix G: only these scenario sources enter the relationship analysis
RELATIONSHIP_SOURCES = ("social_iqa", "social_chemistry", "normbank")


def _mean_se_vars(name: str, values: np.ndarray, dims: tuple) -> dict:
    """``{name}_mean`` and ``{name}_se`` over the last axis (split seeds) of ``values``, as variables with ``dims``."""
    m, se = mean_se(values, axis=-1)
    return {f"{name}_mean": (dims, m), f"{name}_se": (dims, se)}


def _coords(ctx: Context, **more) -> dict:
    return {"direction": list(ctx.directions), "split_seed": ctx.split_seeds, **more}


_REF = "reference: per-seed grids averaged over split seeds first, then "
#: how each SyncR^2-type variable is aggregated over split seeds (its ``aggregation`` attribute; joined, the Dataset's)
AGGREGATION = {
    "r2": "per split seed: test R^2 of each layer pair",
    "train_r2": "per split seed: training R^2 of each layer pair (the same maps on their training rows); "
                "genuine condition only (NaN for the controls)",
    "r2_mean": "mean of r2 over split seeds (the reference's r2_mean)",
    "r2_var": "variance (ddof 0) of r2 over split seeds (the reference's r2_std**2)",
    "sync_r2": _REF + "mean over source layers of max(0, max over target layers) (data_analysis.py 406-427)",
    "sync_r2_se": "reference: sqrt(sum over source layers of r2_var at the best target of r2_mean, 0 where "
                  "that best mean is negative) / L_src (data_analysis.py 384-404); NaN for one split seed",
    "sync_r2_noclip": _REF + "mean over source layers of max over target layers, no clip (figure 8)",
    "sync_r2_noclip_se": "as sync_r2_se without the '0 where negative' rule (ours)",
    "sync_r2_topk": _REF + "mean over source layers of max(0, mean of the top-k target layers) "
                    "(appendix C; clipped, protocol correction 15)",
    "sync_r2_per_seed": "per split seed: sync_r2's formula on that seed's grid alone",
    "sync_r2_boot": "per resample of whole episodes (boot_rule): sync_r2 on the resampled test sets, the maps fixed",
    "sync_r2_round": "per round of the test episodes (round_rule): the maps of all rounds scored on one round's "
                     "test samples, averaged over split seeds, each source layer at its round_tgt_layer, mean over "
                     "source layers; no maximum and no clip on the round (the rounds average to sync_r2_noclip)",
    "sync_r2_round_boot": "per round and resample of whole episodes (round_rule, boot_rule)",
    "sync_r2_noclip_per_seed": "per split seed: sync_r2_noclip's formula on that seed's grid alone",
    "sync_r2_contrast": "per split seed and side: sync_r2's formula on that seed's grid, genuine and the control "
                        "on the rows both hold (contrast_rule)",
    "sync_r2_contrast_pooled": _REF + "as sync_r2, per side of each contrast (contrast_rule)",
    "sync_r2_contrast_boot": "per side of each contrast and resample of whole episodes (contrast_rule, boot_rule)",
    "sync_r2_topk_per_seed": "per split seed: sync_r2_topk's formula on that seed's grid alone",
    "paper_alpha_sync_r2": _REF + "as sync_r2, the genuine maps refitted at the paper's penalty 0.1",
    "paper_alpha_sync_r2_se": "as sync_r2_se, at the paper's penalty 0.1",
    "paper_alpha_sync_r2_noclip": _REF + "as sync_r2_noclip, at the paper's penalty 0.1 (figure 8)",
    "paper_alpha_sync_r2_noclip_se": "as sync_r2_noclip_se, at the paper's penalty 0.1",
    "persona_disjoint_sync_r2": _REF + "as sync_r2 (persona-disjoint split)",
    "persona_disjoint_sync_r2_se": "as sync_r2_se (persona-disjoint split)",
    "persona_disjoint_sync_r2_per_seed": "per split seed (persona-disjoint split)",
    "sample_size_sync_r2": _REF + "as sync_r2, at each sample size",
    "sample_size_sync_r2_se": "as sync_r2_se, at each sample size",
    "sample_size_sync_r2_per_seed": "per split seed, at each sample size",
    "relationship_sync_r2": "per split seed and subsampling seed: sync_r2's formula on one subset's grid",
    "relationship_sync_r2_mean": "relationship_sync_r2 averaged over subsampling seeds, then mean over split seeds",
    "relationship_sync_r2_se": "relationship_sync_r2 averaged over subsampling seeds, then synclib.stats.mean_se "
                               "over split seeds (ddof 1)",
}

#: the split rules, for the result's attributes
SPLIT_RULE = ("reference (affine_transformation.py sampling_with_full_episodes): per split seed, "
              "numpy.random.RandomState(seed).permutation over all cube episodes in cube order (episodes "
              "without samples included); the test set takes whole episodes until it holds >= "
              "N - int(0.8 N) samples, the training set then takes episodes until it holds >= int(0.8 N) "
              "or the episodes run out (short: fewer than N samples, training = all the rest). Ours: a "
              "split leaving no training sample is not fitted (NaN, note; the reference crashes there).")
PERSONA_SPLIT_RULE = ("ours (no reference code): the reference rule applied to unordered agent pairs instead "
                      "of episodes: RandomState(seed).permutation over the cube's distinct pairs in sorted "
                      "order, whole pairs to the test set, then to the training set.")
SHUFFLE_RULE = ("reference (affine_transformation.py 356-372): the genuine dataset and split; the split's "
                "RandomState continues: per training episode in split order, per simulation seed "
                "ascending, a dialog with m > 1 samples gets its targets permuted by rs.permutation(m); "
                "test set untouched.")
#: the seed of the shuffled control's permutation for CKA, and of the permutation null's (:data:`CKA_RULE`)
CKA_SHUFFLE_SEED = 0
#: permutations of genuine's target rows in CKA's null (``cka_null``)
CKA_PERMUTATIONS = 99
CKA_RULE = ("ours (the paper has no CKA): debiased linear CKA (synclib.analysis.cka.cka_grid: Kornblith et al. "
            "2019's CKA with the unbiased HSIC estimator, about 0 for unrelated states at any sample count) "
            "between the source and the target states of every layer pair. cka: on all samples of each condition's "
            "dataset (n_available; no split, nothing fitted, one value per condition and direction); shuffled: "
            "the genuine samples with every dialog's targets permuted as the shuffle rule permutes training "
            "targets (synclib.analysis.samples.shuffle_training_targets over all episodes in cube order, "
            f"numpy.random.RandomState({CKA_SHUFFLE_SEED})). cka_contrast: the mean over layer pairs of genuine and "
            "of each control on the samples both hold (synclib.analysis.contrasts.common_rows), side by side. "
            f"cka_null: genuine's mean over layer pairs with its target rows permuted, {CKA_PERMUTATIONS} times "
            f"(synclib.analysis.cka.cka_null, numpy.random.default_rng({CKA_SHUFFLE_SEED})).")


# --------------------------------------------------------------------------- genuine and controls
@dataclass
class Conditions:
    """What :func:`conditions_block` returns: its Dataset and the genuine fits."""
    dataset: xr.Dataset
    genuine: GenuineFits


def _score_vars(prefix: str, grids: np.ndarray, dims: tuple, variants: bool = False, noclip: bool = False) -> dict:
    """The SyncR^2 variables of ``grids`` (*lead, S, L, L), leading dims ``dims``: ``{prefix}``, ``{prefix}_se``
    (reference aggregation, ``dims``) and ``{prefix}_per_seed`` (``dims`` + split_seed); with ``noclip`` or
    ``variants`` the same three ``_noclip``; with ``variants`` also ``r2_mean``, ``r2_var`` (``dims`` + src_layer,
    tgt_layer), ``sync_r2_topk`` (``dims`` + k) and ``sync_r2_topk_per_seed``."""
    noclip = noclip or variants
    lead, (S, L) = grids.shape[:-3], grids.shape[-3::2]
    aggs = [seed_aggregate(grids[i]) for i in np.ndindex(*lead)]

    def stack(name):
        return np.stack([np.asarray(getattr(a, name), dtype=np.float64) for a in aggs]).reshape(
            lead + np.shape(getattr(aggs[0], name)))

    per = np.full(lead + (S,), np.nan)
    per_noclip = np.full(lead + (S,), np.nan)
    per_topk = np.full(lead + (S, L), np.nan)
    for i in np.ndindex(*lead + (S,)):
        per[i] = sync_r2(grids[i])
        if noclip:
            per_noclip[i] = sync_r2_noclip(grids[i])
        if variants:
            per_topk[i] = [sync_r2_topk(grids[i], k) for k in range(1, L + 1)]
    sd = dims + ("split_seed",)
    out = {prefix: (dims, stack("sync_r2")), f"{prefix}_se": (dims, stack("sync_r2_se")),
           f"{prefix}_per_seed": (sd, per)}
    if noclip:
        out.update({f"{prefix}_noclip": (dims, stack("noclip")), f"{prefix}_noclip_se": (dims, stack("noclip_se")),
                    f"{prefix}_noclip_per_seed": (sd, per_noclip)})
    if variants:
        out.update({"r2_mean": (dims + ("src_layer", "tgt_layer"), stack("mean")),
                    "r2_var": (dims + ("src_layer", "tgt_layer"), stack("var")),
                    "sync_r2_topk": (dims + ("k",), stack("topk")), "sync_r2_topk_per_seed": (sd + ("k",), per_topk)})
    return out


@dataclass
class _ConditionArrays:
    """The arrays of the conditions block; dims (C, Dir, S) = (condition, direction, split_seed)."""
    r2: np.ndarray          # (C, Dir, S, L, L), L = max(L_A, L_B); NaN padded
    train_r2: np.ndarray    # (C, Dir, S, L, L)
    alpha: np.ndarray       # (C, Dir, S, L)
    alpha_relative: np.ndarray  # (C, Dir, S, L): alpha="cv" only, the penalty over the layer's scale
    n_train: np.ndarray     # (C, Dir, S) int
    n_test: np.ndarray      # (C, Dir, S) int
    short: np.ndarray       # (C, Dir, S) int: 1 short rule, 0 not, -1 no split
    n_available: np.ndarray  # (C, Dir) int

    @classmethod
    def empty(cls, shape: tuple, n_layers: int) -> "_ConditionArrays":
        grid = shape + (n_layers, n_layers)
        return cls(np.full(grid, np.nan), np.full(grid, np.nan), np.full(shape + (n_layers,), np.nan),
                   np.full(shape + (n_layers,), np.nan), np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64),
                   np.full(shape, -1, dtype=np.int64), np.zeros(shape[:2], dtype=np.int64))

    def record(self, at: tuple, fit: SplitFit) -> None:
        """Store one fit at ``at = (condition, direction, split seed)`` positions."""
        Ls, Lt = fit.r2.shape
        self.r2[at + (slice(0, Ls), slice(0, Lt))] = fit.r2
        if fit.train_r2 is not None:
            self.train_r2[at + (slice(0, Ls), slice(0, Lt))] = fit.train_r2
        self.alpha[at + (slice(0, Ls),)] = fit.alpha
        if fit.alpha_relative is not None:
            self.alpha_relative[at + (slice(0, Ls),)] = fit.alpha_relative
        self.n_train[at], self.n_test[at] = len(fit.train), len(fit.test)
        self.short[at] = fit.split["short"]

    def to_dataset(self, ctx: Context, conditions: list) -> xr.Dataset:
        L = self.r2.shape[-1]
        cds = ("condition", "direction", "split_seed")
        return xr.Dataset(
            {
                "r2": (cds + ("src_layer", "tgt_layer"), self.r2),
                "train_r2": (cds + ("src_layer", "tgt_layer"), self.train_r2),
                "alpha": (cds + ("src_layer",), self.alpha),
                **({"alpha_relative": (cds + ("src_layer",), self.alpha_relative)} if ctx.penalty.cv else {}),
                "n_train": (cds, self.n_train),
                "n_test": (cds, self.n_test),
                "split_short": (cds, self.short),
                "n_available": (cds[:2], self.n_available),
                **_score_vars("sync_r2", self.r2, cds[:2], variants=True),
            },
            coords={"condition": conditions, **_coords(ctx), "src_layer": np.arange(L),
                    "tgt_layer": np.arange(L), "k": np.arange(1, L + 1)},
        )


def _cka_samples(ctx: Context, samples: PairedSamples, seed_rank: np.ndarray) -> PairedSamples:
    """The samples CKA reads for one (condition, direction): the shuffled control's targets permuted
    (:data:`CKA_RULE`), else the condition's own."""
    if samples.condition != "shuffled":
        return samples
    y = shuffle_training_targets(samples, range(ctx.cube.sizes["episode"]),
                                 np.random.RandomState(CKA_SHUFFLE_SEED), seed_rank)
    return replace(samples, y_rows=y)


def _cka_contrast(genuine: PairedSamples, control: PairedSamples) -> tuple[float, float]:
    """Genuine's and the control's CKA, each the mean over layer pairs, on the samples both hold."""
    gi, ci = common_rows(genuine, control)
    return tuple(cka_null(*s.take(i), 0)[0] for s, i in ((genuine, gi), (control, ci)))


# --------------------------------------------------------------------------- the episode as the unit
BOOT_RULE = ("ours: each resample draws the cube's episodes (tasks, each with all its simulation seeds) with "
             "replacement, as many as there are, from numpy.random.default_rng(BOOT_SEED); the same draws serve "
             "every condition, direction and split seed (and every run of the same task set). Each split's maps "
             "are held fixed and its test R^2 grid is recomputed on the drawn test episodes "
             "(synclib.analysis.ridge.resampled_r2: each column's test variance held at the whole test set's); the grids "
             "are then aggregated over split seeds as sync_r2 (seed mean, max, clip, mean).")


ROUND_RULE = ("ours (the paper has no score per round): each split's maps, fitted on all rounds of its training "
              "episodes, scored on the test samples of one round (the source state's round): one minus the mean "
              "over target columns of the round's mean squared error over the whole test set's variance (ddof 0; "
              "synclib.analysis.ridge.resampled_r2), so that the test R^2 is the rounds' mean weighted by their test samples; "
              "then averaged over split seeds and scored at each source layer's target layer chosen on the whole "
              "test set (round_tgt_layer: the best target of the seed-mean grid, as sync_r2 chooses it; -1 "
              "padding), averaged over source layers without a clip (synclib.analysis.scores.sync_r2_at). Nothing "
              "is chosen and nothing clipped on a round (a maximum over a round's few samples, or a clip of "
              "values near 0, would lift every round), so a round's value can be negative, and the rounds "
              "weighted by their test samples average to sync_r2_noclip (exactly for one split seed; sync_r2 "
              "where no source layer's best R^2 is negative). sync_r2_round_boot: the same on each resample of "
              "whole episodes (boot_rule), the targets fixed.")


def episode_bootstrap(fits: list, counts: np.ndarray, round_: int | None = None, targets=None) -> np.ndarray:
    """SyncR^2 of one (condition, direction) on each resample of whole episodes (:data:`BOOT_RULE`), or on the
    test samples of one round of them (:data:`ROUND_RULE`): (B,), NaN where no split seed has a drawn test sample.

    Parameters
    ----------
    fits : list of SplitFit or None
        One per split seed, with ``test_loss`` (None: not fitted).
    counts : array (B, E)
        :func:`episode_draws` (all ones, shape (1, E): the test set itself).
    round_ : int, optional
        Score only the test samples of this round (the source state's round).
    targets : int array (L_src,), optional
        Each source layer's target layer and clip, fixed (:func:`synclib.analysis.scores.best_targets` of the whole
        test set, :func:`synclib.analysis.scores.sync_r2_at`); None: each resampled grid's best target, clipped.
    """
    grids = []
    for fit in fits:
        if fit is None or fit.test_loss is None:
            continue
        episodes, loss, sizes = fit.test_loss
        if round_ is None:
            grids.append(resampled_r2(fit.r2, loss, sizes, counts[:, episodes]))  # (B, L_src, L_tgt)
        else:
            g = np.flatnonzero(fit.test_rounds == round_)
            grids.append(resampled_r2(fit.r2, loss, sizes, counts[:, episodes[g]], drawn=g))
    if not grids:
        return np.full(len(counts), np.nan)
    with warnings.catch_warnings():  # padding and undrawn seeds are NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(np.stack(grids), axis=0)
    return sync_r2_many(mean) if targets is None else sync_r2_at(mean, targets)


def _label(samples: PairedSamples) -> str:
    return f"{samples.condition} {samples.direction}"


def own_splits(ctx: Context, samples: PairedSamples, n_samples: int | None | str = "default") -> list:
    """The reference's split of ``samples`` per split seed of ``ctx``, at ``n_samples`` (default:
    the analysis'): ``(train, test, info, rs)`` (:meth:`Context.split`), None where none is possible."""
    label = _label(samples)
    n = ctx.n_samples if n_samples == "default" else n_samples
    if n is not None and samples.n < n:
        ctx.note(f"{label}: the cube holds {samples.n} samples, fewer than n_samples={n}; "
                 f"the test set takes >= {n - int(0.8 * n)} of them and the "
                 f"training set all the rest (the reference's rule)")
    return [ctx.split(samples.episode, ctx.cube.sizes["episode"], seed, f"{label} split {seed}", n_samples=n)
            for seed in ctx.split_seeds]


def _fit_splits(ctx: Context, samples: PairedSamples, seed_rank: np.ndarray, splits: list,
                alphas: list | None = None) -> list:
    """One fit per split of ``splits`` (:func:`own_splits`; None where there is none), with training R^2 and the
    test loss per episode and round; ``shuffled`` shuffles the training targets per split.  ``alphas``: one penalty
    array per split seed (another fit's: no CV, only the grid)."""
    label, fits = _label(samples), []
    for si, (seed, split) in enumerate(zip(ctx.split_seeds, splits)):
        alpha = None if alphas is None else alphas[si]
        if split is None or (alphas is not None and alpha is None):
            fits.append(None)
        else:
            tr, te, info, rs = split
            s = samples
            if samples.condition == "shuffled":
                s = replace(samples, y_rows=shuffle_training_targets(samples, info["train_groups"], rs, seed_rank))
            full = alphas is None
            fits.append(ctx.fit(s, seed, tr, te, f"{label} split {seed}", train_r2=full and samples.condition == "genuine",
                                split=info, episode_loss=full, penalty=alpha))
        ctx.bar.update(1)
    return fits


@dataclass
class _Rounds:
    """The scores per round of the conditions block (:data:`ROUND_RULE`); dims (C, Dir) as there."""
    score: np.ndarray    # (C, Dir, R)
    boot: np.ndarray     # (C, Dir, R, B)
    n_test: np.ndarray   # (C, Dir, S, R) int: test samples of each round
    tgt: np.ndarray      # (C, Dir, L) int: each source layer's target layer, chosen on the whole test set

    @classmethod
    def empty(cls, shape: tuple, n_rounds: int, n_boot: int, n_layers: int) -> "_Rounds":
        return cls(np.full(shape[:2] + (n_rounds,), np.nan), np.full(shape[:2] + (n_rounds, n_boot), np.nan),
                   np.zeros(shape + (n_rounds,), dtype=np.int64), np.full(shape[:2] + (n_layers,), -1))

    def record(self, at: tuple, fits: list, n_episodes: int, counts: np.ndarray | None) -> None:
        """Score the fits of ``at = (condition, direction)`` round by round, each source layer at
        the target layer the whole test set's seed-mean grid chose."""
        done = [f.r2 for f in fits if f is not None and f.test_loss is not None]
        if not done:
            return
        with warnings.catch_warnings():  # padding: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            targets = best_targets(np.nanmean(np.stack(done), axis=0))
        self.tgt[at + (slice(0, len(targets)),)] = targets
        for si, fit in enumerate(fits):
            if fit is not None and fit.test_rounds is not None:
                self.n_test[at + (si,)] = np.bincount(fit.test_rounds, fit.test_loss[2], self.score.shape[-1])
        for r in range(self.score.shape[-1]):
            self.score[at + (r,)] = episode_bootstrap(fits, np.ones((1, n_episodes)), r, targets)[0]
            if counts is not None:
                self.boot[at + (r,)] = episode_bootstrap(fits, counts, r, targets)

    def variables(self, with_boot: bool) -> dict:
        out = {"sync_r2_round": (("condition", "direction", "round"), self.score),
               "n_test_round": (("condition", "direction", "split_seed", "round"), self.n_test),
               "round_tgt_layer": (("condition", "direction", "src_layer"), self.tgt)}
        if with_boot:
            out["sync_r2_round_boot"] = (("condition", "direction", "round", "boot"), self.boot)
        return out


def conditions_block(ctx: Context, conditions: list, cka: bool = True) -> Conditions:
    """The genuine condition and its controls: test and training R^2 grids per (condition, direction, split seed)
    and their SyncR^2, aggregated over split seeds as the reference does (:mod:`synclib.analysis.scores`) and per
    seed, each condition on its own samples (the reference's design); and every control's contrast with genuine on
    the rows both hold (:mod:`synclib.analysis.contrasts`).  ``conditions``: ``genuine``, ``passive``,
    ``shuffled``, ``pseudo``, ``lagJ``, whose variables the cube has.

    Returns
    -------
    Conditions
        ``dataset``, with C, Dir, S = condition, direction, split_seed: ``r2``, ``train_r2`` (C, Dir, S, src_layer,
        tgt_layer; ``train_r2`` genuine only), ``alpha`` (..., src_layer), ``n_train``, ``n_test``, ``split_short``
        (C, Dir, S), ``n_available`` (C, Dir); reference aggregation: ``r2_mean``, ``r2_var`` (C, Dir, src_layer,
        tgt_layer), ``sync_r2``, ``sync_r2_se``, ``sync_r2_noclip``, ``sync_r2_noclip_se`` (C, Dir),
        ``sync_r2_topk`` (..., k); per seed: ``sync_r2_per_seed``, ``sync_r2_noclip_per_seed`` (C, Dir, S),
        ``sync_r2_topk_per_seed`` (..., k); with ``ctx.n_boot`` resamples, ``sync_r2_boot`` (C, Dir, boot;
        :func:`episode_bootstrap`, attribute ``boot_rule``); with genuine and a control, the contrasts
        (:func:`synclib.analysis.contrasts.contrast_variables`, attribute ``contrast_rule``); with the pseudo-dyads
        the attribute ``pseudo_partner`` (:func:`synclib.analysis.samples.pseudo_partners`) and ``pseudo_same_task``
        (Dir: the share of the pseudo-dyads' samples whose partner dialog plays the same task); per round of the test
        episodes (:data:`ROUND_RULE`, attribute ``round_rule``): ``sync_r2_round`` (C, Dir, round),
        ``n_test_round`` (C, Dir, S, round), ``round_tgt_layer`` (C, Dir, src_layer; -1: padding), with resamples
        ``sync_r2_round_boot`` (..., round, boot); with ``cka``, ``cka`` (C, Dir, src_layer, tgt_layer;
        :data:`CKA_RULE`, attribute ``cka_rule``), ``cka_null`` (Dir, permutation) and ``cka_contrast`` (contrast,
        Dir, side).  ``genuine``: the genuine fits, for the other blocks.
    """
    shape = (len(conditions), len(ctx.directions), len(ctx.split_seeds))
    arrays = _ConditionArrays.empty(shape, max(ctx.cube.sizes["layer_a"], ctx.cube.sizes["layer_b"]))
    genuine = GenuineFits()
    rank = sim_seed_rank(ctx.cube)
    counts = episode_draws(ctx.cube.sizes["episode"], ctx.n_boot) if ctx.n_boot else None
    boot = np.full(shape[:2] + (ctx.n_boot,), np.nan)
    E, R = ctx.cube.sizes["episode"], ctx.cube.sizes["round"]
    rounds = _Rounds.empty(shape, R, ctx.n_boot, arrays.r2.shape[-1])
    partner = None  # the pseudo-dyads' partner rule
    same_task = np.full(len(ctx.directions), np.nan)
    ckas = np.full(shape[:2] + arrays.r2.shape[-2:], np.nan)
    cka_nulls = np.full((len(ctx.directions), CKA_PERMUTATIONS), np.nan)
    cka_read, cka_pairs = {}, {}  # CKA's samples per (condition, direction); the contrasts' CKA
    contrasts = {}
    for di, d in enumerate(ctx.directions):
        datasets = [build_dataset(ctx.cube, d, c, ctx.arrays) for c in conditions]
        own = {}
        for ci, (c, samples) in enumerate(zip(conditions, datasets)):
            arrays.n_available[ci, di] = samples.n
            partner = samples.info.get("partner", partner)
            same_task[di] = samples.info.get("same_task", same_task[di])
            if cka:
                read = cka_read[(c, d)] = _cka_samples(ctx, samples, rank)
                grid = cka_grid(*read.take(np.arange(read.n)))
                ckas[ci, di, :grid.shape[0], :grid.shape[1]] = grid
                if c == "genuine":
                    cka_nulls[di] = cka_null(*read.take(np.arange(read.n)), CKA_PERMUTATIONS, CKA_SHUFFLE_SEED)[1]
            fits = own[c] = _fit_splits(ctx, samples, rank, own_splits(ctx, samples))
            for si, fit in enumerate(fits):
                if fit is not None:
                    arrays.record((ci, di, si), fit)
            if counts is not None:
                boot[ci, di] = episode_bootstrap(fits, counts)
            rounds.record((ci, di), fits, E, counts)
            if c == "genuine":
                genuine.samples[d] = samples
                genuine.fits.update({(d, f.seed): f for f in fits if f is not None})
        if "genuine" in own:  # every control against genuine on the rows both hold
            g = datasets[conditions.index("genuine")]
            for c, samples in zip(conditions, datasets):
                if c != "genuine":
                    contrasts[(c, d)] = contrast_fits(ctx, g, samples, own["genuine"], own[c])
                    if cka:
                        cka_pairs[(c, d)] = _cka_contrast(cka_read[("genuine", d)], cka_read[(c, d)])
        for samples in datasets:
            if samples.condition.startswith("passive"):  # not needed again: free it
                ctx.arrays.drop(samples.info["source_var"])
    ds = arrays.to_dataset(ctx, conditions)
    if contrasts:
        variables, names = contrast_variables(contrasts, tuple(ctx.directions), len(ctx.split_seeds),
                                              arrays.r2.shape[-1],
                                              (lambda fits: episode_bootstrap(fits, counts)) if counts is not None
                                              else None)
        ds = ds.assign_coords(contrast=names, side=list(SIDES)).assign(variables)
        ds.attrs["contrast_rule"] = CONTRAST_RULE
    if counts is not None:
        ds["sync_r2_boot"] = (("condition", "direction", "boot"), boot)
        ds.attrs["boot_rule"] = BOOT_RULE
    ds = ds.assign(rounds.variables(counts is not None)).assign_coords(round=np.arange(R))
    ds.attrs["round_rule"] = ROUND_RULE
    if partner:
        ds.attrs["pseudo_partner"] = partner
        ds["pseudo_same_task"] = (("direction",), same_task)
        ds["pseudo_same_task"].attrs["long_name"] = "share of the pseudo-dyads' samples whose partner plays the same task"
    if cka:
        ds["cka"] = (("condition", "direction", "src_layer", "tgt_layer"), ckas)
        ds["cka"].attrs["samples"] = "all samples of each condition's dataset (n_available); no split"
        ds["cka"].attrs["estimator"] = "debiased"
        ds.attrs["cka_rule"] = CKA_RULE
        if "genuine" in conditions:
            ds["cka_null"] = (("direction", "permutation"), cka_nulls)
        if cka_pairs:
            names = [str(c) for c in ds["contrast"].values]
            pairs = np.full((len(names), len(ctx.directions), 2), np.nan)
            for (c, d), sides in cka_pairs.items():
                pairs[names.index(c), list(ctx.directions).index(d)] = sides
            ds["cka_contrast"] = (("contrast", "direction", "side"), pairs)
    return Conditions(ds, genuine)


# --------------------------------------------------------------------------- the paper's penalty
def paper_alpha_block(ctx: Context, genuine: GenuineFits) -> xr.Dataset:
    """Genuine SyncR^2 at the paper's penalty (:data:`synclib.analysis.ridge.PAPER_ALPHA`) on the genuine splits,
    clipped and not, for a run whose own penalty is another: figure 8 (appendix C.2) shows what clipping does there,
    where maps fitted on few samples predict worse than the mean.  Variables ``paper_alpha_r2`` (direction,
    split_seed, src_layer, tgt_layer), ``paper_alpha_sync_r2``, ``..._se``, ``..._noclip``, ``..._noclip_se``
    (direction) and their ``_per_seed`` (direction, split_seed); attribute ``paper_alpha``."""
    L = max(ctx.cube.sizes["layer_a"], ctx.cube.sizes["layer_b"])
    grids = np.full((len(ctx.directions), len(ctx.split_seeds), L, L), np.nan)
    for di, d in enumerate(ctx.directions):
        for si, seed in enumerate(ctx.split_seeds):
            fit = genuine.fits.get((d, seed))
            if fit is not None:
                r2 = ctx.fit(fit.samples, seed, fit.train, fit.test, f"genuine {d} split {seed} at alpha "
                             f"{PAPER_ALPHA}", penalty=PAPER_ALPHA).r2
                grids[di, si, :r2.shape[0], :r2.shape[1]] = r2
            ctx.bar.update(1)
    ds = xr.Dataset({"paper_alpha_r2": (("direction", "split_seed", "src_layer", "tgt_layer"), grids),
                     **_score_vars("paper_alpha_sync_r2", grids, ("direction",), noclip=True)},
                    coords=_coords(ctx, src_layer=np.arange(L), tgt_layer=np.arange(L)))
    ds.attrs["paper_alpha"] = PAPER_ALPHA
    return ds


# --------------------------------------------------------------------------- table 2, appendix D
def persona_block(ctx: Context, genuine: GenuineFits) -> tuple[xr.Dataset, GenuineFits]:
    """Table 2: genuine SyncR^2 with a persona-disjoint split (ours; the reference has none): the reference's rule
    (:func:`synclib.splits.episode_split`) applied to the cube's unordered agent pairs in sorted order instead of
    episodes, so that no agent pair is in both sets.  Variables ``persona_disjoint_sync_r2``, ``..._se``
    (direction); ``..._per_seed``, ``persona_disjoint_n_train``, ``persona_disjoint_n_test`` (direction, split_seed).
    Also returns these fits (genuine's samples, the persona-disjoint splits), for the surrogate test under them.
    """
    fits = GenuineFits(samples=genuine.samples)
    labels, codes = np.unique(persona_keys(ctx.cube), return_inverse=True)
    L = max(ctx.cube.sizes["layer_a"], ctx.cube.sizes["layer_b"])
    shape = (len(ctx.directions), len(ctx.split_seeds))
    grids = np.full(shape + (L, L), np.nan)
    ntr = np.zeros(shape, dtype=np.int64)
    nte = np.zeros(shape, dtype=np.int64)
    for di, d in enumerate(ctx.directions):
        samples = genuine.samples[d]
        groups = codes.ravel()[samples.episode]
        for si, seed in enumerate(ctx.split_seeds):
            what = f"persona-disjoint {d} split {seed}"
            split = ctx.split(groups, len(labels), seed, what)
            if split is not None:
                fit = fits.fits[(d, seed)] = ctx.fit(samples, seed, split[0], split[1], what)
                grids[di, si, :fit.r2.shape[0], :fit.r2.shape[1]] = fit.r2
                ntr[di, si], nte[di, si] = len(split[0]), len(split[1])
            ctx.bar.update(1)
    dims = ("direction", "split_seed")
    return xr.Dataset({**_score_vars("persona_disjoint_sync_r2", grids, dims[:1]),
                       "persona_disjoint_n_train": (dims, ntr), "persona_disjoint_n_test": (dims, nte)},
                      coords=_coords(ctx)), fits


def sample_size_block(ctx: Context, genuine: GenuineFits, sample_sizes) -> xr.Dataset:
    """Appendix D: genuine SyncR^2 at smaller sample sizes, the reference's split at ``N`` = each of
    ``sample_sizes`` (NaN and a note where the cube has fewer samples).  Variables ``sample_size_sync_r2``,
    ``..._se`` (sample_size, direction); ``..._per_seed``, ``sample_size_n_used`` (sample_size, direction,
    split_seed)."""
    sizes = [int(s) for s in sample_sizes]
    L = max(ctx.cube.sizes["layer_a"], ctx.cube.sizes["layer_b"])
    shape = (len(sizes), len(ctx.directions), len(ctx.split_seeds))
    grids = np.full(shape + (L, L), np.nan)
    used = np.zeros(shape, dtype=np.int64)
    for zi, size in enumerate(sizes):
        for di, d in enumerate(ctx.directions):
            samples = genuine.samples[d]
            for si, seed in enumerate(ctx.split_seeds):
                what = f"sample size {size} {d} split {seed}"
                split = None
                if size > samples.n:
                    ctx.note(f"sample size {size} > available {samples.n} ({d}); left NaN")
                else:
                    split = ctx.split(samples.episode, ctx.cube.sizes["episode"], seed, what, n_samples=size)
                if split is not None:
                    r2 = ctx.fit(samples, seed, split[0], split[1], what).r2
                    grids[zi, di, si, :r2.shape[0], :r2.shape[1]] = r2
                    used[zi, di, si] = len(split[0]) + len(split[1])
                ctx.bar.update(1)
    dims = ("sample_size", "direction", "split_seed")
    return xr.Dataset({**_score_vars("sample_size_sync_r2", grids, dims[:2]), "sample_size_n_used": (dims, used)},
                      coords=_coords(ctx, sample_size=sizes))


# --------------------------------------------------------------------------- appendix G
def _test_by_relationship(ctx: Context, fit: SplitFit, codes: list) -> list:
    """The fit's test samples from :data:`RELATIONSHIP_SOURCES`, one index array per relationship code in ``codes``."""
    episode = fit.samples.episode
    rels = np.asarray(ctx.cube["relationship"].values).astype(int)
    srcs = np.asarray(ctx.cube["source"].values).astype(str)
    te = fit.test[np.isin(srcs[episode[fit.test]], RELATIONSHIP_SOURCES)]
    return [te[rels[episode[te]] == code] for code in codes]


def _subset_scores(ctx: Context, fit: SplitFit, groups: list, size: int, seeds) -> np.ndarray:
    """SyncR^2 of the fit's maps on a random ``size``-sample subset of each test group,
    per subsampling seed: (len(seeds), len(groups))."""
    subsets = []
    for q in seeds:
        rng = np.random.default_rng([int(fit.seed), int(q)])
        subsets += [rng.choice(g, size, replace=False) for g in groups]
    # read the rows once: training rows and all subsets, positions into them
    rows = np.concatenate([fit.train] + subsets)
    uniq, inv = np.unique(rows, return_inverse=True)
    X, Y = fit.samples.take(uniq)
    pos = np.split(inv, np.cumsum([len(fit.train)] + [len(s) for s in subsets])[:-1])
    grids = r2_grid_subsets(X, Y, pos[0], pos[1:], fit.alpha, compute=ComputeOptions(device=ctx.device))
    return np.array([sync_r2(g) for g in grids]).reshape(len(seeds), len(groups))


def relationship_block(ctx: Context, genuine: GenuineFits, seeds=(0, 1, 2), min_samples: int = 10) -> xr.Dataset:
    """Appendix G: the genuine maps scored on equal-sized test subsets per relationship.

    Test samples from :data:`RELATIONSHIP_SOURCES` are split by relationship
    (:data:`synclib.tasks.scenarios.RELATIONSHIPS`, in code order); relationships with at least ``min_samples`` of
    them are subsampled to the size of the smallest, once per subsampling seed of ``seeds``, the others stay NaN.
    ``genuine``'s fits on all its samples serve: the categories compare genuine with itself.

    Returns
    -------
    xarray.Dataset
        ``relationship_sync_r2`` (relationship, direction, split_seed, relationship_seed),
        ``relationship_subset_size`` (direction, split_seed), ``relationship_sync_r2_mean``/``_se`` (relationship,
        direction: mean over the subsampling seeds, then mean and SE over split seeds), ``relationship_n_episodes``
        and ``relationship_n_scenarios`` (relationship: the cube's episodes and distinct scenarios of each among the
        kept sources; a category from few scenarios confounds relationship with scenario).
    """
    codes = sorted(RELATIONSHIPS)
    v = np.full((len(codes), len(ctx.directions), len(ctx.split_seeds), len(seeds)), np.nan)
    size = np.zeros((len(ctx.directions), len(ctx.split_seeds)), dtype=np.int64)
    for di, d in enumerate(ctx.directions):
        for si, seed in enumerate(ctx.split_seeds):
            fit = genuine.fits.get((d, seed))  # a comparison within genuine: its fit on all its samples
            if fit is None:  # the genuine split failed (noted there)
                continue
            if not np.isfinite(fit.alpha).all():  # the split's maps could not be fitted (noted there)
                ctx.note(f"relationship {d} seed {seed}: the genuine maps of this split were not fitted; left NaN")
                continue
            by_rel = _test_by_relationship(ctx, fit, codes)
            present = [i for i, t in enumerate(by_rel) if len(t) >= min_samples]
            if not present:
                ctx.note(f"relationship {d} seed {seed}: no relationship has >= {min_samples} "
                         f"test samples from {RELATIONSHIP_SOURCES}")
                continue
            size[di, si] = min(len(by_rel[i]) for i in present)
            scores = _subset_scores(ctx, fit, [by_rel[i] for i in present], size[di, si], seeds)
            v[present, di, si, :] = scores.T
    rels = np.asarray(ctx.cube["relationship"].values).astype(int)
    keep = np.isin(np.asarray(ctx.cube["source"].values).astype(str), RELATIONSHIP_SOURCES)
    names = np.asarray(ctx.cube["codename"].values).astype(str)
    n_ep = [int((keep & (rels == c)).sum()) for c in codes]
    n_sc = [len(set(names[keep & (rels == c)])) for c in codes]
    dims = ("relationship", "direction", "split_seed", "relationship_seed")
    return xr.Dataset(
        {"relationship_sync_r2": (dims, v), "relationship_subset_size": (dims[1:3], size),
         "relationship_n_episodes": (dims[:1], np.array(n_ep)), "relationship_n_scenarios": (dims[:1], np.array(n_sc)),
         **_mean_se_vars("relationship_sync_r2", v.mean(axis=3), dims[:2])},
        coords=_coords(ctx, relationship=[RELATIONSHIPS[c] for c in codes], relationship_seed=list(seeds)))


# --------------------------------------------------------------------------- appendix I
#: source layers of the MLP comparison per direction: this many, evenly spaced
NONLINEAR_SOURCES = 4
NONLINEAR_SELECTION = (f"each of {NONLINEAR_SOURCES} evenly spaced source layers takes the target layer whose affine "
                       "map (the split's penalty) fitted on the fitting part of the split's training set has the "
                       "best R^2 on its validation part (synclib.splits.validation_split: whole episodes, 20 %); "
                       "both maps are then fitted on the whole training set and scored on the test set, which "
                       "the choice never saw")


def _sources(n_layers: int) -> list[int]:
    """:data:`NONLINEAR_SOURCES` evenly spaced source layers of ``n_layers``."""
    return [int(l) for l in np.unique(np.linspace(0, n_layers - 1, min(NONLINEAR_SOURCES, n_layers)).round())]


def _validation_targets(fit: SplitFit, xtr: np.ndarray, ytr: np.ndarray, sources: list, device) -> tuple:
    """Each source layer's target layer chosen on a validation part of the fit's training set
    (:data:`NONLINEAR_SELECTION`); ``xtr`` (n_train, L_src, D_src), ``ytr`` (n_train, L_tgt, D_tgt) are the fit's
    training samples.  Returns ``(targets, val_r2, val)``: each source's target, the validation R^2 it was chosen by
    and the validation rows."""
    part, val = validation_split(fit.samples.episode[fit.train], fit.seed)
    grid = r2_grid(xtr[:, sources], ytr, part, val, fit.alpha[sources], compute=ComputeOptions(device=device)).r2
    targets = [int(np.nanargmax(row)) for row in grid]
    return targets, [float(grid[i, t]) for i, t in enumerate(targets)], val


NONLINEAR_BOOT_RULE = ("the MLP's minus the affine map's test R², averaged over a split's layer pairs, on each "
                       "resample of whole episodes (boot_rule: the same draws as every other resample, the maps and "
                       "each column's test variance held fixed), averaged over the fitted split seeds")


def _nonlinear_gap_boot(r2, loss, fit, src, tgt, counts) -> np.ndarray:
    """The MLPs' (test R^2 ``r2`` (P,), losses ``loss`` per test episode) minus the affine maps' test R^2 at the
    same layer pairs ``src``, ``tgt`` (P,) of ``fit``, averaged over the pairs, on each resample ``counts`` (B, E):
    (B,)."""
    episodes, affine, sizes = fit.test_loss  # groups of one episode and round
    mlp = resampled_r2(r2[None], loss.loss[:, None], loss.sizes, counts[:, loss.labels])[:, 0]
    lin = resampled_r2(fit.r2[src, tgt][None], affine[:, src, tgt][:, None], sizes, counts[:, episodes])[:, 0]
    return (mlp - lin).mean(1)


def nonlinear_block(ctx: Context, genuine: GenuineFits, pairs=None, options: MLPOptions | dict | None = None,
                    n_seeds: int | None = None, counts: np.ndarray | None = None) -> xr.Dataset:
    """Appendix I: a 2-layer MLP against the affine map, on the genuine splits, for a few layer pairs.

    Parameters
    ----------
    pairs : list of (int, int), dict of them by direction, or None
        (source, target) layer pairs, the same on every split; None: chosen per split without its test set
        (:data:`NONLINEAR_SELECTION`).
    options : MLPOptions or a dict of its fields, optional
    n_seeds : int, optional
        Fit on the first ``n_seeds`` split seeds only (the MLPs cost far more than the affine grids); the others
        are NaN.  None: all.
    counts : array (B, E), optional
        :func:`episode_draws`: also the episode bootstrap of the difference (:data:`NONLINEAR_BOOT_RULE`).

    Returns
    -------
    xarray.Dataset
        ``nonlinear_r2`` and ``affine_r2`` (direction, split_seed, layer_pair: both maps' test R^2),
        ``nonlinear_src_layer`` (direction, layer_pair), ``nonlinear_tgt_layer`` and ``nonlinear_val_r2``
        (direction, split_seed, layer_pair: the target and the validation R^2 it was chosen by; NaN for given
        ``pairs``), ``nonlinear_epochs`` (the same dims: each MLP's epochs by early stopping on the validation part,
        :data:`synclib.analysis.mlp.STOPPING_RULE`) and ``nonlinear_steps_per_epoch`` (direction, split_seed); -1
        pads directions with fewer pairs and split seeds not fitted.  Attributes ``nonlinear_options``,
        ``nonlinear_selection``, ``nonlinear_stopping``, ``nonlinear_max_epochs``.  With ``counts``,
        ``nonlinear_gap_boot`` (direction, boot) and the attribute ``nonlinear_boot_rule``.
    """
    opts = MLPOptions.of(options)
    fixed = None if pairs is None else {d: [tuple(map(int, p)) for p in (pairs[d] if isinstance(pairs, dict) else pairs)]
                                        for d in ctx.directions}
    L_src = {d: genuine.samples[d].X.shape[1] for d in ctx.directions if d in genuine.samples}
    src_of = {d: [p[0] for p in fixed[d]] if fixed else _sources(L_src.get(d, 0)) for d in ctx.directions}
    nd, ns, npair = len(ctx.directions), len(ctx.split_seeds), max([len(v) for v in src_of.values()] + [0])
    nl, af, val_r2 = (np.full((nd, ns, npair), np.nan) for _ in range(3))
    src_layer = np.full((nd, npair), -1, dtype=np.int64)
    tgt_layer, epochs = (np.full((nd, ns, npair), -1, dtype=np.int64) for _ in range(2))
    n_steps = np.full((nd, ns), -1, dtype=np.int64)
    gap_boot = None if counts is None else np.full((nd, ns, len(counts)), np.nan)
    bs = opts.batch_size
    fitted = ctx.split_seeds[:n_seeds] if n_seeds is not None else ctx.split_seeds
    bar = tqdm(total=nd * len(fitted) * npair, desc="nonlinear maps", disable=None if ctx.progress else True,
               file=sys.stderr)
    for di, d in enumerate(ctx.directions):
        src = src_of[d]
        src_layer[di, :len(src)] = src
        for si, seed in enumerate(fitted):
            fit = genuine.fits.get((d, seed))
            if fit is None or not src:
                continue
            s = fit.samples
            xtr, ytr = s.X[s.x_rows[fit.train]], s.Y[s.y_rows[fit.train]]
            xte, yte = s.X[s.x_rows[fit.test]], s.Y[s.y_rows[fit.test]]
            try:
                if fixed:
                    tgt, val = [p[1] for p in fixed[d]], validation_split(s.episode[fit.train], fit.seed)[1]
                else:
                    tgt, chosen_by, val = _validation_targets(fit, xtr, ytr, src, ctx.device)
                    val_r2[di, si, :len(src)] = chosen_by
            except RidgeInputError as exc:
                ctx.note(f"nonlinear {d} split {seed}: no validation part to choose targets and epochs on "
                         f"({exc}); left NaN")
                continue
            # the split's layer pairs side by side (each as alone), epochs by early stopping (STOPPING_RULE)
            boot = gap_boot is not None and fit.test_loss is not None
            got = mlp_r2_batch(np.moveaxis(xtr[:, src], 1, 0), np.moveaxis(ytr[:, tgt], 1, 0),
                               np.moveaxis(xte[:, src], 1, 0), np.moveaxis(yte[:, tgt], 1, 0),
                               opts, seed=seed, device=ctx.device, val=val, return_epochs=True,
                               test_groups=s.episode[fit.test] if boot else None)
            nl[di, si, :len(src)], epochs[di, si, :len(src)] = got[:2]
            n_steps[di, si] = -(-len(fit.train) // (bs or len(fit.train)))
            tgt_layer[di, si, :len(src)] = tgt
            af[di, si, :len(src)] = fit.r2[src, tgt]
            if boot:
                gap_boot[di, si] = _nonlinear_gap_boot(got[0], got[2], fit, src, tgt, counts)
            bar.update(len(src))
    bar.close()
    dps, dp = ("direction", "split_seed", "layer_pair"), ("direction", "layer_pair")
    ds = xr.Dataset(
        {"nonlinear_src_layer": (dp, src_layer), "nonlinear_tgt_layer": (dps, tgt_layer),
         "nonlinear_val_r2": (dps, val_r2), "nonlinear_r2": (dps, nl), "affine_r2": (dps, af),
         "nonlinear_epochs": (dps, epochs), "nonlinear_steps_per_epoch": (dps[:2], n_steps)},
        coords=_coords(ctx, layer_pair=np.arange(npair)))
    if gap_boot is not None:
        with warnings.catch_warnings():  # directions and split seeds not fitted: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            ds["nonlinear_gap_boot"] = (("direction", "boot"), np.nanmean(gap_boot, axis=1))
        ds.attrs["nonlinear_boot_rule"] = NONLINEAR_BOOT_RULE
    ds.attrs["nonlinear_options"] = repr(asdict(opts))
    ds.attrs["nonlinear_selection"] = "given layer pairs" if fixed else NONLINEAR_SELECTION
    ds.attrs["nonlinear_stopping"] = STOPPING_RULE
    ds.attrs["nonlinear_max_epochs"] = int(opts.epochs)
    return ds


# --------------------------------------------------------------------------- appendix J
def tom_block(ctx: Context, options: dict | None = None) -> xr.Dataset:
    """Appendix J: Theory-of-Mind decoding (:func:`synclib.analysis.tom.tom_decode`, further keywords in
    ``options``) on the split seeds of ``ctx``; an empty Dataset and a note when the cube has too few ToM samples."""
    try:
        return tom_decode(ctx.cube, split_seeds=ctx.split_seeds, device=ctx.device, progress=ctx.progress,
                          max_resident_bytes=ctx.max_resident_bytes, **(options or {}))
    except RidgeInputError as exc:  # too few ToM samples
        ctx.note(f"ToM decoding: not done ({exc})")
        return xr.Dataset()
