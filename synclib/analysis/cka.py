"""Debiased linear centred kernel alignment (CKA; Kornblith et al. 2019): a second measure of how alike two sets
of states are, nothing fitted.  For ``n`` paired samples ``X`` (n, d_x), ``Y`` (n, d_y), centred per column, with
``K = Xc Xc^T`` and ``L = Yc Yc^T``, each U-centred (Szekely and Rizzo 2014; ``r`` the row sums and ``t`` the total
of the kernel with its diagonal zeroed):

    Ku_ij = K_ij - r_i / (n - 2) - r_j / (n - 2) + t / ((n - 1)(n - 2))  (i != j),  Ku_ii = 0,

``CKA = <Ku, Lu>_F / (||Ku||_F ||Lu||_F)``, the unbiased HSIC estimator (Song et al. 2012) normalised: about 0 for
unrelated states at any ``n`` (it can fall below 0), 1 for ``Y = X``, invariant to orthogonal maps and isotropic
scaling.  ``debiased=False`` is Kornblith et al.'s ``<HKH, HLH>_F / (||HKH|| ||HLH||)``, about 0.8 for independent
random states of 150 samples and widths 576 / 640 and higher with fewer samples.  :func:`cka_null` permutes the
partner's rows.  Float64; NaN where a side is constant or with fewer than 4 samples (2 biased).
"""
from __future__ import annotations

import numpy as np

__all__ = ["linear_cka", "cka_grid", "cka_null", "DEFAULT_BLOCK_BYTES"]

#: the most bytes of Gram rows :func:`cka_grid` holds at once (both sides together)
DEFAULT_BLOCK_BYTES = 256 * 2**20


def _centred(x, mean=None) -> np.ndarray:
    """``x`` (n, d) as float64 less ``mean`` (d,), by default its columns' means: (n, d)."""
    x = np.asarray(x, dtype=np.float64)
    return x - (x.mean(axis=0, keepdims=True) if mean is None else mean)


def linear_cka(X, Y, debiased: bool = True) -> float:
    """Linear CKA of two paired sets of samples ``X`` (n_samples, n_features_x) and ``Y`` (n_samples,
    n_features_y), row ``i`` of each paired (module doc; ``debiased=False``: Kornblith et al.'s estimator)."""
    X, Y = np.asarray(X), np.asarray(Y)
    if X.ndim != 2 or Y.ndim != 2 or X.shape[0] != Y.shape[0]:
        raise ValueError(f"linear_cka: X (n, d_x) and Y (n, d_y) with the same n, got {X.shape} and {Y.shape}")
    grid = cka_grid(X[:, None, :], Y[:, None, :], debiased=debiased)
    return float(grid[0, 0])


def _diagonals(arr: np.ndarray, means: list) -> list:
    """Each layer's centred Gram diagonal ``K_ii`` (n,), from ``arr`` (n, n_layers, d) and its column ``means``."""
    return [np.einsum("ij,ij->i", x, x) for x in (_centred(arr[:, l], m) for l, m in enumerate(means))]


def _gram_rows(arr: np.ndarray, means: list, rows: slice, diag=None) -> np.ndarray:
    """Rows ``rows`` of each layer's centred Gram matrix, flattened: (n_layers, n_rows * n), from ``arr`` (n,
    n_layers, d) and each layer's column means ``means`` (d,); one layer at a time is held centred.  With ``diag``
    (:func:`_diagonals`) the Grams are U-centred (module doc: a centred Gram's rows sum to 0, so ``r_i = -K_ii``)."""
    n = arr.shape[0]
    out = []
    for l, mean in enumerate(means):
        x = _centred(arr[:, l], mean)
        g = x[rows] @ x.T
        if diag is not None:
            d = diag[l]
            g = g + (d[rows, None] + d[None, :]) / (n - 2) - d.sum() / ((n - 1) * (n - 2))
            idx = np.arange(rows.start, rows.stop)
            g[idx - rows.start, idx] = 0.0
        out.append(g.ravel())
    return np.stack(out)


def cka_grid(src, tgt, *, debiased: bool = True, block_bytes: int = DEFAULT_BLOCK_BYTES) -> np.ndarray:
    """Linear CKA for every pair of a source and a target layer: ``cka[i, j] = linear_cka(src[:, i], tgt[:, j])``,
    (n_layers_src, n_layers_tgt) float64 (``debiased``: module doc).

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
    if n < (4 if debiased else 2):
        return np.full((Ls, Lt), np.nan)
    mx = [src[:, l].mean(axis=0, dtype=np.float64) for l in range(Ls)]
    my = [tgt[:, l].mean(axis=0, dtype=np.float64) for l in range(Lt)]
    dx, dy = (_diagonals(src, mx), _diagonals(tgt, my)) if debiased else (None, None)
    step = max(1, int(block_bytes) // (8 * n * (Ls + Lt)))
    cross = np.zeros((Ls, Lt))
    kk, ll = np.zeros(Ls), np.zeros(Lt)
    for lo in range(0, n, step):
        rows = slice(lo, min(n, lo + step))
        K, L = _gram_rows(src, mx, rows, dx), _gram_rows(tgt, my, rows, dy)  # (Ls, b*n), (Lt, b*n)
        cross += K @ L.T                                    # <K_i, L_j>_F over these rows
        kk += np.einsum("ij,ij->i", K, K)
        ll += np.einsum("ij,ij->i", L, L)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = cross / np.sqrt(np.outer(kk, ll))
    out[~(np.outer(kk, ll) > 0)] = np.nan
    return out


def cka_null(src, tgt, n_perm: int, seed: int = 0) -> tuple[float, np.ndarray]:
    """The debiased CKA's mean over layer pairs (constant layers left out) of ``src`` (n, L_src, D_src) and ``tgt``
    (n, L_tgt, D_tgt), and the same with the target rows permuted ``n_perm`` times (``default_rng(seed)``): ``(observed,
    null (n_perm,))``, NaN below 4 samples.  The mean is ``<A, B> / (L_src L_tgt)``, ``A = sum_i Ku_i / ||Ku_i||`` and
    ``B`` alike, and a permutation ``p`` turns ``B`` into ``B[p][:, p]``: no grid per permutation."""
    src, tgt = np.asarray(src), np.asarray(tgt)
    n = src.shape[0]

    def summed(arr):  # the U-centred Grams over their norms, summed one layer at a time; how many varied
        total, used = np.zeros(n * n), 0
        for layer in range(arr.shape[1]):
            one = arr[:, [layer]]
            mean = [one[:, 0].mean(axis=0, dtype=np.float64)]
            gram = _gram_rows(one, mean, slice(0, n), _diagonals(one, mean))[0]
            norm = np.sqrt(gram @ gram)
            if norm > 0:
                total, used = total + gram / norm, used + 1
        return total.reshape(n, n), used

    (A, na), (B, nb) = (summed(src), summed(tgt)) if n >= 4 else ((None, 0), (None, 0))
    if not (na and nb):
        return np.nan, np.full(int(n_perm), np.nan)
    rng = np.random.default_rng(seed)
    null = np.array([np.vdot(A, B[np.ix_(p, p)]) for p in (rng.permutation(n) for _ in range(int(n_perm)))])
    return float(np.vdot(A, B)) / (na * nb), null / (na * nb)
