"""SyncR^2 and its variants from one R^2 grid (paper eq. in section 3.3, appendix C).

Every function takes a grid of test R^2, shape (L_src, L_tgt): rows are source
layers, columns target layers.  All-NaN rows and columns (the padding of a grid
stored in a square of the larger depth) are ignored.
"""
from __future__ import annotations

import numpy as np

from synclib.analysis.samples import AnalysisError

__all__ = ["sync_r2", "sync_r2_noclip", "sync_r2_topk"]


def _valid_rows(grid) -> np.ndarray:
    """The grid (L_src, L_tgt) as float64 without its all-NaN rows."""
    g = np.asarray(grid, dtype=np.float64)
    return g[~np.all(np.isnan(g), axis=1)]


def sync_r2(grid) -> float:
    """Paper eq.: mean over source layers of max(0, max over target layers of R^2).

    ``grid`` is (L_src, L_tgt); all-NaN rows/columns (padding) are ignored.
    """
    g = _valid_rows(grid)
    return float(np.mean(np.maximum(0.0, np.nanmax(g, axis=1))))


def sync_r2_noclip(grid) -> float:
    """As :func:`sync_r2` without clipping negative values at 0 (appendix C.2); grid (L_src, L_tgt)."""
    g = _valid_rows(grid)
    return float(np.mean(np.nanmax(g, axis=1)))


def sync_r2_topk(grid, k: int) -> float:
    """Mean over source layers of the mean of the top-k target R^2, no clipping (appendix C.1).

    ``grid`` is (L_src, L_tgt); NaN if ``k`` exceeds the number of target layers.
    """
    g = _valid_rows(grid)
    g = g[:, ~np.all(np.isnan(g), axis=0)]
    if k < 1:
        raise AnalysisError(f"k must be >= 1, got {k}")
    if k > g.shape[1]:
        return float("nan")
    top = -np.sort(-g, axis=1)[:, :k]
    return float(top.mean())
