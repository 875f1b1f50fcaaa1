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
from synclib.analysis.ridge import ComputeOptions, cv_penalties, r2_grid_targets
from synclib.analysis.scores import sync_r2_many
from synclib.analysis.surrogates import split_inputs, surrogate_rows
from synclib.splits import RidgeInputError

__all__ = ["PLANTED_SHARES", "PLANTED_LAYERS", "PLANTED_NULL_SHARE", "PLANTED_RULE", "planted_block"]

#: shares of the control's target rows taken from a surrogate partner; 0 is genuine itself
PLANTED_SHARES = (0.0, 0.01, 0.02, 0.03, 0.045, 0.065, 0.09, 0.13, 0.18)
#: layers of each model fitted, as source and as target (evenly spaced, the first and last among them): the planted
#: differences are SyncR² of that sub-grid, a replicate costing about (8 / 30)^2 of the models' whole grids
PLANTED_LAYERS = 8
#: seed of the rows each share replaces, per direction and replicate
PLANTED_SEED = 0
#: the share planted on both sides of the null comparison (the curve's share 0: no difference planted)
PLANTED_NULL_SHARE = 0.09

PLANTED_RULE = (
    "ours (the paper has no power analysis): a planted control is genuine with a share of its target rows "
    "replaced by a surrogate partner's target at the same round (replicate r takes the r-th surrogate partner "
    "of synclib.analysis.surrogates); the shares are nested (each replaces the first rows with a partner in one "
    "random order of the samples, numpy.random.default_rng([PLANTED_SEED, direction, r])). The null (share 0, "
    "nothing planted between the sides): the control at PLANTED_NULL_SHARE against the same share of other rows "
    "(a second order, default_rng([PLANTED_SEED, direction, r, 1])), both losing the partner alike. Replicate r "
    "splits the run's samples by the analysis' own rule at split seeds s + PLANTED_SPLIT_STRIDE * r for each split "
    "seed s of the run (replicate 0: the run's own splits); genuine, every share and the null are fitted on the "
    "same rows, each with the analysis' penalty rule (alpha='cv': its own grouped CV on its training rows, as the "
    "contrasts' sides; a fixed alpha: that alpha), on PLANTED_LAYERS evenly spaced source and target layers of "
    "each model, and scored as SyncR² of each split's grid.")

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
    """SyncR² (T,) of each target-row set of ``y_sets`` fitted on samples ``tr`` and scored on ``te``, on
    ``layers`` (source, target): each set with its own CV penalties where the analysis' penalty is CV, else at
    ``alpha`` (L_src,)."""
    sets = [(y[tr], y[te]) for y in y_sets]
    X, Y, xtr, xte, targets = split_inputs(samples, tr, te, sets, layers=layers)
    compute = ComputeOptions(precision=ctx.precision, device=ctx.device)
    alphas = (cv_penalties(X, Y, xtr, [t[0] for t in targets], ctx.penalty, samples.episode[tr], compute=compute)
              if ctx.penalty.cv else alpha[layers[0]])
    return sync_r2_many(r2_grid_targets(X, Y, xtr, xte, targets, alphas, compute=compute).r2)


def planted_block(ctx: Context, genuine: GenuineFits, n_reps: int, shares=PLANTED_SHARES,
                  max_layers: int = PLANTED_LAYERS) -> xr.Dataset:
    """Genuine against controls with planted differences, on re-splits of the run (:data:`PLANTED_RULE`), at
    ``genuine``'s penalties: ``n_reps`` replicates per direction (replicate 0 on the run's own split seeds), the
    ``shares`` (in [0, 1]; 0: genuine) of the control's target rows taken from a surrogate partner, ``max_layers``
    evenly spaced layers of each model.

    Returns
    -------
    xarray.Dataset
        ``planted_sync_r2`` (direction, replicate, split_seed, share), ``planted_null_sync_r2`` (the null's second
        side, :data:`PLANTED_NULL_SHARE` of other rows), ``n_train_planted``, ``n_test_planted``
        (direction, replicate, split_seed); NaN and 0 where a direction or split could not be fitted.  Attributes
        ``planted_rule``, ``planted_layers_a`` and ``planted_layers_b`` (model A's and B's layers fitted).
    """
    shares = tuple(float(f) for f in shares)
    D, S, R, T = len(ctx.directions), len(ctx.split_seeds), int(n_reps), len(shares)
    value, null = np.full((D, R, S, T), np.nan), np.full((D, R, S), np.nan)
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
            other = np.random.default_rng([PLANTED_SEED, di, r, 1]).permutation(samples.n)
            y_sets += _shares_rows(samples.y_rows, sur[:, r], other, [PLANTED_NULL_SHARE])
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
                    got = _scores(ctx, samples, tr, te, y_sets, fit.alpha, layers)
                except RidgeInputError as exc:
                    ctx.note(f"{what}: not fitted ({exc}); left NaN")
                    continue
                value[di, r, si], null[di, r, si] = got[:T], got[T]
                n_tr[di, r, si], n_te[di, r, si] = len(tr), len(te)
    dims = ("direction", "replicate", "split_seed")
    out = xr.Dataset({"planted_sync_r2": (dims + ("share",), value), "planted_null_sync_r2": (dims, null),
                      "n_train_planted": (dims, n_tr), "n_test_planted": (dims, n_te)},
                     coords={"direction": list(ctx.directions), "replicate": np.arange(R),
                             "split_seed": list(ctx.split_seeds), "share": list(shares)})
    out.attrs.update({"planted_rule": PLANTED_RULE, "planted_null_share": PLANTED_NULL_SHARE,
                      **{f"planted_layers_{m}": " ".join(map(str, v)) for m, v in by_model.items()}})
    return out
