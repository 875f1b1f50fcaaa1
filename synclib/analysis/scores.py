"""SyncR^2 and its variants from R^2 grids, aggregated over split seeds as the reference does.

A grid is the test R^2 of every (source layer, target layer) pair, (L_src, L_tgt); all-NaN rows and columns (the
padding of a grid stored in a square of the larger depth) are ignored everywhere, and an all-NaN grid scores NaN.

Aggregation over split seeds (the reference's ``playground/data_analysis.py`` ``get_r2_scores_setting`` with
``compute_avg_metric_row`` / ``compute_avg_and_se_metric_row``; protocol correction 10): the per-seed grids ``G_s``
(S, L_src, L_tgt) are averaged first, ``M = mean_s G_s``, ``V = var_s G_s`` (ddof 0), and every score is computed on
``M`` (:func:`seed_aggregate`; each function also scores a single seed's grid):

* SyncR^2 = ``mean_l max(0, max_j M[l, j])``  (:func:`sync_r2`)
* its standard error = ``sqrt(sum_l v_l) / L_src`` with ``v_l = V[l, j*(l)]``, ``j*(l)`` the first argmax of
  ``M[l]``, and ``v_l = 0`` where ``max_j M[l, j] < 0``  (:func:`sync_r2_se`)
* unclipped (figure 8; no reference code) = ``mean_l max_j M[l, j]`` (:func:`sync_r2_noclip`), its SE without the
  ``0 if negative`` rule (ours)
* top-k (appendix C; no reference code; protocol correction 15: k = 1 is the original, so the clip stays) =
  ``mean_l max(0, mean of the k largest M[l, j])`` (:func:`sync_r2_topk`): of the reference notes' two readings
  (10.6), the clip applies to a source layer's score, not to each cell before the mean.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from synclib.analysis.samples import AnalysisError

__all__ = ["sync_r2", "sync_r2_many", "sync_r2_at", "best_targets", "sync_r2_noclip", "sync_r2_topk", "sync_r2_se",
           "seed_aggregate", "SeedAggregate"]


def _valid(grid) -> np.ndarray:
    """The grid (L_src, L_tgt) as float64 without its all-NaN rows and columns."""
    g = np.asarray(grid, dtype=np.float64)
    if g.ndim != 2:
        raise AnalysisError(f"grid must have shape (L_src, L_tgt), got {g.shape}")
    g = g[~np.all(np.isnan(g), axis=1)]
    return g[:, ~np.all(np.isnan(g), axis=0)]


def sync_r2(grid) -> float:
    """Paper eq.: mean over source layers of ``max(0, max over target layers of R^2)``; ``grid`` (L_src, L_tgt)."""
    g = _valid(grid)
    if g.size == 0:
        return float("nan")
    return float(np.mean(np.maximum(0.0, np.nanmax(g, axis=1))))


def sync_r2_many(grids) -> np.ndarray:
    """:func:`sync_r2` of many grids at once: ``grids`` (..., L_src, L_tgt) -> (...)."""
    g = np.asarray(grids, dtype=np.float64)
    rows = ~np.all(np.isnan(g), axis=-1)                            # (..., L_src)
    best = np.max(np.where(np.isnan(g), -np.inf, g), axis=-1)       # -inf on padding rows
    n = rows.sum(-1)
    total = np.where(rows, np.maximum(best, 0.0), 0.0).sum(-1)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def best_targets(grid) -> np.ndarray:
    """Each source layer's best target layer in ``grid`` (L_src, L_tgt), the first maximum as
    :func:`sync_r2` takes it; -1 for an all-NaN row (padding).  Shape (L_src,), int."""
    g = np.asarray(grid, dtype=np.float64)
    rows = ~np.all(np.isnan(g), axis=-1)
    return np.where(rows, np.argmax(np.where(np.isnan(g), -np.inf, g), axis=-1), -1)


def sync_r2_at(grids, targets) -> np.ndarray:
    """Unclipped SyncR^2 with each source layer's target layer fixed beforehand: ``grids`` (..., L_src, L_tgt) and
    ``targets`` (L_src,) from :func:`best_targets` of another grid -> (...), the mean over source layers (padding,
    -1, left out) of ``grid[l, targets[l]]``; NaN where a chosen cell is not finite.  Nothing is chosen or clipped
    on ``grids`` (a clip per subset would lift subsets straddling 0), so subsets of a test set (the rounds of
    :data:`synclib.analysis.blocks.ROUND_RULE`) scored with the whole set's targets average, weighted by their
    samples, to the whole set's :func:`sync_r2_noclip`."""
    g = np.asarray(grids, dtype=np.float64)
    t = np.asarray(targets, dtype=np.int64)
    rows = np.flatnonzero(t >= 0)
    if not len(rows):
        return np.full(g.shape[:-2], np.nan)
    return g[..., rows, t[rows]].mean(-1)


def sync_r2_noclip(grid) -> float:
    """As :func:`sync_r2` without clipping negative values at 0 (figure 8); grid (L_src, L_tgt)."""
    g = _valid(grid)
    if g.size == 0:
        return float("nan")
    return float(np.mean(np.nanmax(g, axis=1)))


def sync_r2_topk(grid, k: int) -> float:
    """Mean over source layers of ``max(0, mean of the top-k target R^2)`` (appendix C, clipped); NaN if ``k``
    exceeds the target layers; :func:`sync_r2` at ``k = 1``."""
    if k < 1:
        raise AnalysisError(f"k must be >= 1, got {k}")
    g = _valid(grid)
    if g.size == 0 or k > g.shape[1]:
        return float("nan")
    top = -np.sort(-g, axis=1)[:, :k]
    return float(np.mean(np.maximum(0.0, top.mean(axis=1))))


def sync_r2_se(grids, clip: bool = True) -> float:
    """The reference's standard error of SyncR^2 from the per-seed grids ``grids`` (S, L_src, L_tgt) (module doc);
    ``clip=False``: without the ``v_l = 0`` rule, for the unclipped variant.  NaN with fewer than two seeds (a
    standard error of one value is undefined here, :func:`synclib.stats.mean_se`; the reference's ``np.std`` gives
    0)."""
    agg = seed_aggregate(grids, max_k=0)
    return agg.sync_r2_se if clip else agg.noclip_se


@dataclass
class SeedAggregate:
    """The scores of :func:`seed_aggregate`; grids keep the input's (padded) shape."""
    mean: np.ndarray       # (L_src, L_tgt) mean over split seeds
    var: np.ndarray        # (L_src, L_tgt) ddof-0 variance over split seeds
    n_seeds: int           # seeds with a grid
    sync_r2: float
    sync_r2_se: float      # NaN for fewer than two seeds
    noclip: float
    noclip_se: float
    topk: np.ndarray       # (max_k,) k = 1 .. max_k, NaN for k > L_tgt


def _se(M: np.ndarray, V: np.ndarray, n_seeds: int, clip: bool) -> float:
    """``sqrt(sum_l v_l) / L`` on the valid part of the mean grid M and variance grid V (module doc)."""
    rows = ~np.all(np.isnan(M), axis=1)
    cols = ~np.all(np.isnan(M), axis=0)
    M, V = M[rows][:, cols], V[rows][:, cols]
    if M.size == 0 or n_seeds < 2:
        return float("nan")
    best = np.nanargmax(M, axis=1)  # first maximum, as np.argmax
    v = V[np.arange(len(M)), best]
    if clip:
        v = np.where(M[np.arange(len(M)), best] >= 0, v, 0.0)
    return float(np.sqrt(v.sum()) / len(M))


def seed_aggregate(grids, max_k: int | None = None) -> SeedAggregate:
    """Average the per-seed grids (S, L_src, L_tgt), all-NaN ones (splits not fitted) left out, then every score on
    the mean grid (module doc); top-k for k = 1 .. ``max_k`` (default: L_tgt of the padded grid)."""
    g = np.asarray(grids, dtype=np.float64)
    if g.ndim != 3:
        raise AnalysisError(f"grids must have shape (split_seed, L_src, L_tgt), got {g.shape}")
    g = g[~np.all(np.isnan(g), axis=(1, 2))]
    max_k = g.shape[2] if max_k is None else max_k
    if len(g) == 0:
        nan = np.full(g.shape[1:], np.nan)
        return SeedAggregate(nan, nan.copy(), 0, *(4 * [float("nan")]), np.full(max_k, np.nan))
    with warnings.catch_warnings():  # padding: all-NaN cells stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        M, V = np.mean(g, axis=0), np.var(g, axis=0)
    return SeedAggregate(M, V, len(g), sync_r2(M), _se(M, V, len(g), True), sync_r2_noclip(M),
                         _se(M, V, len(g), False),
                         np.array([sync_r2_topk(M, k) for k in range(1, max_k + 1)]))
