"""Planted differences (ours): which genuine-minus-control differences this run's test finds.

A paired test can miss a difference because there is none or because the run is too small to see it.  This block
plants differences of known size in the run's own states and asks how often the claims' test finds them (the power
curve of :func:`synclib.analysis.power.planted_power`).  The planted *control* is genuine with a share of its target
rows taken from a surrogate partner (:func:`synclib.analysis.surrogates.surrogate_rows`), so it keeps genuine's
source states, widths, rows and spread and loses the partner on that share.  Each replicate re-splits the run's
samples by the analysis' own rule (replicate 0: the run's own splits) with its own rows replaced and its own partner,
fitting genuine and every planted control on the same rows; the samples stay fixed, so the replicates measure the
test on this run's data, not the spread between runs of new dialogs.
"""
from __future__ import annotations

import numpy as np
import xarray as xr

from synclib.analysis.context import Context, GenuineFits
from synclib.analysis.ridge import ComputeOptions, r2_grid_targets
from synclib.analysis.scores import sync_r2_many
from synclib.analysis.surrogates import split_inputs, surrogate_rows
from synclib.splits import RidgeInputError

__all__ = ["PLANTED_SHARES", "PLANTED_LAYERS", "PLANTED_RULE", "planted_block"]

#: shares of the control's target rows taken from a surrogate partner; 0 is genuine itself
PLANTED_SHARES = (0.0, 0.01, 0.02, 0.03, 0.045, 0.065, 0.09, 0.13, 0.18)
#: layers of each model fitted, as source and as target (evenly spaced, the first and last among them): the planted
#: differences are SyncR² of that sub-grid, a replicate costing about (8 / 30)^2 of the models' whole grids
PLANTED_LAYERS = 8
#: seed of the rows each share replaces, per direction and replicate
PLANTED_SEED = 0

PLANTED_RULE = (
    "ours (the paper has no power analysis): a planted control is genuine with a share of its target rows "
    "replaced by a surrogate partner's target at the same round (replicate r takes the r-th surrogate partner "
    "of synclib.analysis.surrogates); the shares are nested (each replaces the first rows with a partner in one "
    "random order of the samples, numpy.random.default_rng([PLANTED_SEED, direction, r])). Replicate r splits "
    "the run's samples by the analysis' own rule at split seeds s + PLANTED_SPLIT_STRIDE * r for each split seed "
    "s of the run (replicate 0: the run's own splits); genuine and every share are fitted on the same rows at "
    "the genuine fit's penalties of split seed s (no CV of their own), on PLANTED_LAYERS evenly spaced source "
    "and target layers of each model, and scored as SyncR² of each split's grid.")

#: replicate r re-splits at the run's split seeds plus r times this
PLANTED_SPLIT_STRIDE = 1_000_003


def _layers(n: int, k: int) -> np.ndarray:
    """``k`` evenly spaced layers of ``n`` (all where ``n <= k``)."""
    return np.unique(np.linspace(0, n - 1, min(n, k)).round().astype(int))


def _shares_rows(y: np.ndarray, sur: np.ndarray, order: np.ndarray, shares) -> list[np.ndarray]:
    """The target rows of genuine (``y``) with, for each share, the first ``round(share * n)``
    samples of ``order`` that have a partner row (``sur >= 0``) taking it."""
    usable = order[sur[order] >= 0]
    out = []
    for f in shares:
        rows = y.copy()
        k = usable[:int(round(f * len(y)))]
        rows[k] = sur[k]
        out.append(rows)
    return out


def _scores(ctx: Context, samples, tr: np.ndarray, te: np.ndarray, y_sets: list, alpha: np.ndarray,
            layers: tuple) -> np.ndarray:
    """SyncR² (T,) of each target-row set of ``y_sets`` fitted on samples ``tr`` and scored on
    ``te`` at ``alpha`` (L_src,), on ``layers`` (source, target)."""
    sets = [(y[tr], y[te]) for y in y_sets]
    X, Y, xtr, xte, targets = split_inputs(samples, tr, te, sets, layers=layers)
    out = r2_grid_targets(X, Y, xtr, xte, targets, alpha[layers[0]],
                          compute=ComputeOptions(precision=ctx.precision, device=ctx.device))
    return sync_r2_many(out.r2)


def planted_block(ctx: Context, genuine: GenuineFits, n_reps: int, shares=PLANTED_SHARES,
                  max_layers: int = PLANTED_LAYERS) -> xr.Dataset:
    """Genuine against controls with planted differences, on re-splits of the run (:data:`PLANTED_RULE`), at
    ``genuine``'s penalties: ``n_reps`` replicates per direction (replicate 0 on the run's own split seeds), the
    ``shares`` (in [0, 1]; 0: genuine) of the control's target rows taken from a surrogate partner, ``max_layers``
    evenly spaced layers of each model.

    Returns
    -------
    xarray.Dataset
        ``planted_sync_r2`` (direction, replicate, split_seed, share), ``n_train_planted``, ``n_test_planted``
        (direction, replicate, split_seed); NaN and 0 where a direction or split could not be fitted.  Attributes
        ``planted_rule``, ``planted_layers_a`` and ``planted_layers_b`` (model A's and B's layers fitted).
    """
    shares = tuple(float(f) for f in shares)
    D, S, R, T = len(ctx.directions), len(ctx.split_seeds), int(n_reps), len(shares)
    value = np.full((D, R, S, T), np.nan)
    n_tr, n_te = np.zeros((D, R, S), dtype=np.int64), np.zeros((D, R, S), dtype=np.int64)
    E = ctx.cube.sizes["episode"]
    by_model = {m: _layers(ctx.cube.sizes[f"layer_{m}"], max_layers) for m in ("a", "b")}
    for di, d in enumerate(ctx.directions):
        samples = genuine.samples.get(d)
        if samples is None or samples.n == 0 or R == 0:
            continue
        sur, _ = surrogate_rows(ctx.cube, samples, R)
        if sur.shape[1] < R:
            ctx.note(f"planted {d}: the run has a single dialog, so there are no surrogate partners")
            continue
        src = d.split("->")[0].lower()
        layers = (by_model[src], by_model["b" if src == "a" else "a"])
        for r in range(R):
            rng = np.random.default_rng([PLANTED_SEED, di, r])
            y_sets = _shares_rows(samples.y_rows, sur[:, r], rng.permutation(samples.n), shares)
            for si, seed in enumerate(ctx.split_seeds):
                fit = genuine.fits.get((d, seed))
                if fit is None or not np.isfinite(fit.alpha).all():
                    continue
                what = f"planted {d} replicate {r} split {seed}"
                if r == 0:
                    tr, te = fit.train, fit.test
                else:
                    split = ctx.split(samples.episode, E, seed + PLANTED_SPLIT_STRIDE * r, what)
                    if split is None:
                        continue
                    tr, te = split[0], split[1]
                try:
                    value[di, r, si] = _scores(ctx, samples, tr, te, y_sets, fit.alpha, layers)
                except RidgeInputError as exc:
                    ctx.note(f"{what}: not fitted ({exc}); left NaN")
                    continue
                n_tr[di, r, si], n_te[di, r, si] = len(tr), len(te)
    dims = ("direction", "replicate", "split_seed")
    out = xr.Dataset({"planted_sync_r2": (dims + ("share",), value),
                      "n_train_planted": (dims, n_tr), "n_test_planted": (dims, n_te)},
                     coords={"direction": list(ctx.directions), "replicate": np.arange(R),
                             "split_seed": list(ctx.split_seeds), "share": list(shares)})
    out.attrs.update({"planted_rule": PLANTED_RULE,
                      **{f"planted_layers_{m}": " ".join(map(str, v)) for m, v in by_model.items()}})
    return out
