"""Linear centred kernel alignment (CKA; Kornblith et al. 2019, "Similarity of Neural Network Representations
Revisited"), a second measure of how alike two sets of states are.

For ``n`` paired samples ``X`` (n, d_x), ``Y`` (n, d_y), centred per column (``Xc = H X``, ``H = I - 11^T/n``), with
linear kernels ``K = Xc Xc^T`` and ``L = Yc Yc^T``:

    CKA(X, Y) = <K, L>_F / (||K||_F ||L||_F)
              = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F),

the normalised HSIC of the two kernels.  It lies in [0, 1], equals 1 for ``Y = X``, and is invariant to orthogonal
transforms and isotropic scaling of either side (not to arbitrary invertible linear maps); nothing is fitted, so it
needs no split.  This biased estimator is not 0 for unrelated states: with fewer samples than dimensions it is high
even for independent random states (:func:`unrelated_cka`: about 0.8 at 150 samples of widths 576 and 640) and rises
as the samples fall, so values on different sample counts are not comparable and none is measured against 0.
Everything is float64; CKA is NaN where a side is constant (a zero kernel) or there are fewer than two samples.
"""
from __future__ import annotations

import numpy as np

__all__ = ["linear_cka", "cka_grid", "unrelated_cka", "DEFAULT_BLOCK_BYTES"]

#: the most bytes of Gram rows :func:`cka_grid` holds at once (both sides together)
DEFAULT_BLOCK_BYTES = 256 * 2**20


def _centred(x, mean=None) -> np.ndarray:
    """``x`` (n, d) as float64 less ``mean`` (d,), by default its columns' means: (n, d)."""
    x = np.asarray(x, dtype=np.float64)
    return x - (x.mean(axis=0, keepdims=True) if mean is None else mean)


def linear_cka(X, Y) -> float:
    """Linear CKA of two paired sets of samples ``X`` (n_samples, n_features_x) and ``Y`` (n_samples,
    n_features_y), row ``i`` of each paired: ``||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`` (module doc)."""
    X, Y = np.asarray(X), np.asarray(Y)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError(f"linear_cka: X (n, d_x) and Y (n, d_y) with the same n, got {X.shape} and {Y.shape}")
    grid = cka_grid(X[:, None, :], Y[:, None, :])
    return float(grid[0, 0])


def unrelated_cka(n: int, d_x: int, d_y: int, reps: int = 3, seed: int = 0) -> float:
    """The linear CKA of unrelated states: the mean over ``reps`` draws of :func:`linear_cka` between
    independent standard normal samples (n, d_x) and (n, d_y), what the estimator gives for states
    that share nothing at this sample count and these widths."""
    rng = np.random.default_rng(seed)
    return float(np.mean([linear_cka(rng.standard_normal((n, d_x)), rng.standard_normal((n, d_y)))
                          for _ in range(reps)]))


def _gram_rows(arr: np.ndarray, means: list, rows: slice) -> np.ndarray:
    """Rows ``rows`` of each layer's centred Gram matrix, flattened: (n_layers, n_rows * n), from ``arr`` (n,
    n_layers, d) and each layer's column means ``means`` (d,); one layer at a time is held centred."""
    out = []
    for l, mean in enumerate(means):
        x = _centred(arr[:, l], mean)
        out.append((x[rows] @ x.T).ravel())
    return np.stack(out)


def cka_grid(src, tgt, *, block_bytes: int = DEFAULT_BLOCK_BYTES) -> np.ndarray:
    """Linear CKA for every pair of a source and a target layer: ``cka[i, j] = linear_cka(src[:, i], tgt[:, j])``,
    (n_layers_src, n_layers_tgt) float64.

    ``src`` (n_samples, n_layers_src, n_features_src) and ``tgt`` (n_samples, n_layers_tgt, n_features_tgt) pair
    sample ``i`` with sample ``i`` (any float dtype).  Each layer's centred Gram matrix, then one product of the
    flattened Grams: the cheap form for ``n`` below the widths.  The Grams' rows are taken in blocks of
    ``max(1, block_bytes // (8 * n_samples * (n_layers_src + n_layers_tgt)))`` (one block for the embedded runs).
    """
    src, tgt = np.asarray(src), np.asarray(tgt)
    if src.ndim != 3 or tgt.ndim != 3 or src.shape[0] != tgt.shape[0]:
        raise ValueError(f"cka_grid: src (n, L_src, D_src) and tgt (n, L_tgt, D_tgt) with the same n, "
                         f"got {src.shape} and {tgt.shape}")
    n, Ls, Lt = src.shape[0], src.shape[1], tgt.shape[1]
    if n < 2:
        return np.full((Ls, Lt), np.nan)
    mx = [src[:, l].mean(axis=0, dtype=np.float64) for l in range(Ls)]
    my = [tgt[:, l].mean(axis=0, dtype=np.float64) for l in range(Lt)]
    step = max(1, int(block_bytes) // (8 * n * (Ls + Lt)))
    cross = np.zeros((Ls, Lt))
    kk, ll = np.zeros(Ls), np.zeros(Lt)
    for lo in range(0, n, step):
        rows = slice(lo, min(n, lo + step))
        K, L = _gram_rows(src, mx, rows), _gram_rows(tgt, my, rows)  # (Ls, b*n), (Lt, b*n)
        cross += K @ L.T                                    # <K_i, L_j>_F over these rows
        kk += np.einsum("ij,ij->i", K, K)
        ll += np.einsum("ij,ij->i", L, L)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = cross / np.sqrt(np.outer(kk, ll))
    out[~(np.outer(kk, ll) > 0)] = np.nan
    return out
