"""The grouped cross-validation of ``alpha="cv"``: each source layer's penalty chosen on the training rows, whole
groups (episodes) per fold, from a grid relative to the layer's scale (:data:`synclib.penalty.CV_GRID_RULE`), for one
target set (:func:`synclib.analysis.ridge.r2_grid`) or many at once (:func:`synclib.analysis.ridge.cv_penalties`).
Each fold's source side is diagonalised once (:func:`_fold_basis`); the grid then costs small quadratic forms per
target set.  The criterion's big products are float32: it only ranks alphas.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from synclib.splits import RidgeInputError, episode_folds

__all__ = ["layer_scale", "CV_SET_BYTES", "CV_GRAM_BYTES"]


def _test_weights(Yte: torch.Tensor):
    """Columns constant on the test rows and the R^2 weights ``1/SStot`` (0 for those): Yte (n_test, ..., Dt)
    float64 -> const (..., Dt) bool, w (..., Dt) float64."""
    const = (Yte == Yte[:1]).all(0)
    sstot = ((Yte - Yte.mean(0, keepdim=True)) ** 2).sum(0)
    w = torch.where(const, torch.zeros_like(sstot), 1.0 / torch.where(const, torch.ones_like(sstot), sstot))
    return const, w


@dataclass
class _Fold:
    """Target-side data of one CV fold on the CV columns: the columns (``Yc``, ``E``, ``w``) or, in the Gram form
    (:func:`_grams`), their weighted products per target layer (``G``, ``C``; ``Yc`` and ``E`` None)."""
    vmask: torch.Tensor   # (n_train,) bool, validation rows
    Yc: torch.Tensor      # (n_fit, M_cv) float32, centred on the fold-train means
    E: torch.Tensor       # (n_val, M_cv) float32
    w: torch.Tensor       # (M_cv,) float32, 1/SStot on the validation rows (0: constant)
    base: torch.Tensor    # (L_tgt,) sum_j w_j |e_j|^2 per target layer
    nvar: torch.Tensor    # (L_tgt,) non-constant columns per target layer
    G: torch.Tensor | None = None   # (L_tgt, n_fit * n_fit) float32, Yc_t diag(w_t) Yc_t'
    C: torch.Tensor | None = None   # (L_tgt, n_val * n_fit) float32, E_t diag(w_t) Yc_t'


def _make_fold(Y, ytr, vmask, cols, Lt) -> _Fold:
    flat = Y.flatten(1)  # only the CV columns of the rows, not whole rows
    Yf = flat[ytr[~vmask][:, None], cols[None, :]].double()
    Yv = flat[ytr[vmask][:, None], cols[None, :]].double()
    my = Yf.mean(0, keepdim=True)
    const, w = _test_weights(Yv)
    E = Yv - my
    base = (w * (E ** 2).sum(0)).view(Lt, -1).sum(1)
    return _Fold(vmask, (Yf - my).float(), E.float(), w.float(), base, (~const).view(Lt, -1).sum(1).double())


@dataclass
class _CV:
    """What ``alpha="cv"`` needs for every source layer: the folds and the alpha grid."""
    folds: list          # of _Fold
    grid: torch.Tensor   # (n_alpha,) float64


def _cv_setup(Y, ytr, groups, penalty, device) -> _CV:
    """Folds over whole ``groups`` of the training rows, restricted to the CV columns
    (``penalty``: a :class:`synclib.penalty.Penalty` with ``alpha="cv"``, checked there)."""
    cv_columns, cv_seed = penalty.cv_columns, penalty.cv_seed
    grid = torch.as_tensor(np.asarray(penalty.cv_alphas, dtype=np.float64), device=device)
    n_tr = ytr.numel()
    Lt, Dt = Y.shape[1], Y.shape[2]
    g = np.arange(n_tr) if groups is None else np.asarray(groups)
    if g.shape != (n_tr,):
        raise RidgeInputError(f"groups must have one label per training sample ({n_tr}), got shape {g.shape}")
    folds = episode_folds(g, penalty.cv_folds, seed=cv_seed)
    rng = np.random.default_rng(cv_seed)
    cols = (np.arange(Lt * Dt) if cv_columns is None or cv_columns >= Dt else
            np.concatenate([t * Dt + np.sort(rng.choice(Dt, cv_columns, replace=False)) for t in range(Lt)]))
    cols = torch.as_tensor(cols, device=device)
    fold_data = []
    for vm in folds:
        vmask = torch.as_tensor(vm, device=device)
        if int(vmask.sum()) < 2 or int((~vmask).sum()) < 3:
            raise RidgeInputError(f"train: too few samples ({n_tr}) for {penalty.cv_folds} alpha='cv' folds")
        fold_data.append(_make_fold(Y, ytr, vmask, cols, Lt))
    return _CV(fold_data, grid)


def _eigh(A: torch.Tensor):
    """Symmetric eigendecomposition, on one thread on CPU (LAPACK's tridiagonalisation gains little from threads
    and suffers badly when cores are shared)."""
    if A.device.type != "cpu":
        return torch.linalg.eigh(A)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return torch.linalg.eigh(A)
    finally:
        torch.set_num_threads(n)


def _fold_basis(Xtr_l: torch.Tensor, vmask: torch.Tensor) -> tuple:
    """The source side of one CV fold, whatever its targets: the eigenvalues ``lam`` (r,) of the
    fold's regularised system (primal ``Xc'Xc`` or dual ``Xc Xc'``), ``Q`` (n_val, r), and the
    two factors that turn the fold's centred targets ``Yc`` into ``R = left @ (right @ Yc)``
    (``right`` None in the dual form).  :func:`_cv_alpha` explains the algebra."""
    Xf, Xv = Xtr_l[~vmask], Xtr_l[vmask]
    mx = Xf.mean(0, keepdim=True)
    Xc, Xt = Xf - mx, Xv - mx
    n, d = Xc.shape
    # eigendecompositions in float64, the products with the many target columns in float32
    if d <= n:
        lam, V = _eigh(Xc.T @ Xc)
        return lam.clamp_min(0), (Xt @ V).float(), V.T.float(), Xc.T.float()
    lam, U = _eigh(Xc @ Xc.T)
    return lam.clamp_min(0), (Xt @ (Xc.T @ U)).float(), U.T.float(), None


def _grams(folds: list) -> _Fold:
    """Folds of several target sets over the same rows (:func:`_side_by_side`) in the Gram form: per target layer
    ``t`` ``G_t = Yc_t diag(w_t) Yc_t'`` (n_fit, n_fit; its upper triangle, off-diagonal doubled) and
    ``C_t = E_t diag(w_t) Yc_t'`` (n_val, n_fit), independent of the source layer; the sets' layers in turn."""
    f0 = folds[0]
    n, nv, Lt = f0.Yc.shape[0], f0.E.shape[0], f0.base.numel()
    iu = torch.triu_indices(n, n, device=f0.Yc.device)
    twice = torch.where(iu[0] == iu[1], 1.0, 2.0).to(f0.Yc.device)
    G = torch.empty(len(folds) * Lt, iu.shape[1], dtype=torch.float32, device=f0.Yc.device)
    C = torch.empty(len(folds) * Lt, nv * n, dtype=torch.float32, device=f0.Yc.device)
    for i, f in enumerate(folds):
        m = f.Yc.shape[1] // Lt
        Y3 = f.Yc.view(n, Lt, m).permute(1, 2, 0)                             # (Lt, m, n)
        w3 = f.w.view(Lt, 1, m)
        Gi = torch.bmm(f.Yc.view(n, Lt, m).permute(1, 0, 2) * w3, Y3)         # (Lt, n, n)
        G[i * Lt:(i + 1) * Lt] = Gi[:, iu[0], iu[1]] * twice
        C[i * Lt:(i + 1) * Lt] = torch.bmm(f.E.view(nv, Lt, m).permute(1, 0, 2) * w3, Y3).reshape(Lt, -1)
    cat = _side_by_side([_Fold(f.vmask, None, None, f.w, f.base, f.nvar) for f in folds])
    return _Fold(f0.vmask, None, None, cat.w, cat.base, cat.nvar, G, C)


def _gram_bytes(f: _Fold) -> int:
    """Bytes of ``f``'s Gram form (:func:`_grams`)."""
    n, nv = f.Yc.shape[0], f.E.shape[0]
    return 4 * f.base.numel() * n * ((n + 1) // 2 + nv + 1)


def _gram_factors(basis: tuple, alphas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gram criterion's source side for one fold's ``basis`` (:func:`_fold_basis`): with ``R = L Yc`` and
    ``P_a = Q diag(d_a) L`` (n_val, n_fit), the packed upper triangle of ``P_a' P_a`` (n_alpha, n_fit (n_fit + 1)
    / 2) and ``P_a`` (n_alpha, n_val n_fit), float32."""
    lam, Q, left, right = basis
    Dg = 1.0 / (lam[None, :] + alphas[:, None])                              # (n_alpha, r)
    L = (left @ right if right is not None else left).double()              # (r, n_fit)
    P = (Q.double()[None] * Dg[:, None, :]) @ L[None]                         # (n_alpha, n_val, n_fit)
    n = L.shape[1]
    iu = torch.triu_indices(n, n, device=P.device)
    Z = (P.transpose(1, 2) @ P)[:, iu[0], iu[1]]
    return Z.float(), P.float().reshape(len(alphas), -1)


def _gram_scores(bases: list, f: _Fold, grids: list) -> torch.Tensor:
    """One fold's validation criterion (L_src, n_alpha, L_tgt) in the Gram form for every source layer at once
    (``bases``, ``grids``: one per source layer): target layer ``t``'s weighted predictions have squared norm
    ``<P_a' P_a, G_t>`` and cross term ``<P_a, C_t>`` (:func:`_gram_factors`), two (L_src n_alpha, .) x (., L_tgt)
    products reading the targets' Grams once for all source layers."""
    Zs, Ps = zip(*(_gram_factors(b, g) for b, g in zip(bases, grids)))
    quad = (torch.cat(Zs) @ f.G.T).double()                                  # (L_src n_alpha, L_tgt)
    cross = (torch.cat(Ps) @ f.C.T).double()
    ss = f.base[None] - 2 * cross + quad
    score = (f.nvar[None] - ss) / (f.w.numel() / f.base.numel())
    return score.view(len(bases), -1, f.base.numel())


#: target layers whose (r, r) products :func:`_fold_score` forms at once, few enough to stay in the cache
SCORE_LAYERS = 64


def _fold_score(basis: tuple, f: _Fold, alphas: torch.Tensor) -> torch.Tensor:
    """One fold's validation criterion (n_alpha, L_tgt) of the targets of ``f`` for the source side ``basis``
    (:func:`_fold_basis`): with ``d_a = 1/(lambda + a)`` and ``S_t = sum_j w_j R_j R_j'`` over target layer ``t``'s
    columns, the weighted predictions' squared norm is ``<Z_a, S_t>``, ``Z_a = (d_a d_a') * (Q'Q)``: one
    (n_alpha, r^2) x (r^2, L_tgt) product, the ``S_t`` formed :data:`SCORE_LAYERS` at a time (relative error ~1e-6)."""
    lam, Q, left, right = basis
    Dg = 1.0 / (lam[None, :] + alphas[:, None])                              # (n_alpha, r)
    R = left @ (right @ f.Yc) if right is not None else left @ f.Yc   # (r, M)
    Lt = f.base.numel()
    r = R.shape[0]
    Fk = ((Q.T @ f.E) * R * f.w).view(r, Lt, -1).sum(-1).T.double()          # (Lt, r)
    Rw = (R * f.w.sqrt()).view(r, Lt, -1).permute(1, 0, 2)                    # (Lt, r, m)
    Z = (Dg[:, :, None] * Dg[:, None, :] * (Q.T @ Q).double()).float().view(len(alphas), -1)
    quad = torch.empty(len(alphas), Lt, dtype=torch.float32, device=R.device)  # (n_alpha, Lt): Dg_a' G_t Dg_a
    for t0 in range(0, Lt, SCORE_LAYERS):
        part = Rw[t0:t0 + SCORE_LAYERS]
        S = torch.bmm(part, part.transpose(1, 2))                             # (t, r, r)
        quad[:, t0:t0 + len(part)] = Z @ S.view(len(part), -1).T
    ss = f.base[None] - 2 * Dg @ Fk.T + quad.double()
    return (f.nvar[None] - ss) / (f.w.numel() / Lt)


def _cv_alpha(Xtr_l: torch.Tensor, folds: list, alphas: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Pick alpha for one source layer (``Xtr_l`` (n_train, D) float64) by grouped CV on the training rows.

    Each fold's fit is diagonalised once (:func:`_fold_basis`), so the grid ``alphas`` (n_alpha,) costs only small
    (r x r) quadratic forms: with ``Q = Xval V``, ``R = V' Xc' Yc`` and ``d_a = 1/(lambda + a)`` the validation
    predictions are ``Q diag(d_a) R``.  The criterion, the fold-averaged validation R^2 (uniform over a target
    layer's CV columns), is maximised over target layers (as SyncR^2 does), then over alpha.  Returns the chosen
    index and the (n_alpha, L_tgt) CV score.
    """
    score = 0.0
    for f in folds:
        score = score + _fold_score(_fold_basis(Xtr_l, f.vmask), f, alphas)
    score = score / len(folds)
    return int(score.max(1).values.argmax()), score


def _gram_pays(f: _Fold, width: int, n_sets: int, n_alpha: int) -> bool:
    """Whether the Gram form scores fold ``f`` of ``n_sets`` target sets in fewer flops than the column form, for
    source layers ``width`` wide: ~ n_alpha n_fit (n_fit / 2 + n_val) per target layer plus source-side factors
    ~ n_alpha n_fit n_val (r + n_fit) shared by the sets, against ~ columns r (n_fit + r + n_val) + n_alpha r^2 per
    target layer, r = min(n_fit, width).  Gram wins for wide states (rank near the rows), columns for narrow ones."""
    n, nv, Lt, M = f.Yc.shape[0], f.E.shape[0], f.base.numel(), f.Yc.shape[1]
    r = min(n, width)
    gram = n_alpha * Lt * n * (n / 2 + nv) + n_alpha * n * nv * (r + n) / max(1, n_sets)
    columns = M * r * (n + r + nv) + n_alpha * r * r * Lt
    return gram < columns


def _set_chunks(fold_sets: list, width: int, n_alpha: int) -> list[tuple[int, list]]:
    """Several target sets on the same training rows and folds (``fold_sets``: one list of :class:`_Fold` per set,
    in the same order) as chunks ``(sets in the chunk, its folds)``, each fold the chunk's sets side by side: one
    chunk in the Gram form where :func:`_gram_pays` (``width``, ``n_alpha``) and every set fits within
    :data:`CV_GRAM_BYTES`, else as many sets at a time as keep the (r, columns) products within :data:`CV_SET_BYTES`.
    """
    if (_gram_pays(fold_sets[0][0], width, len(fold_sets), n_alpha)
            and sum(_gram_bytes(f) for folds in fold_sets for f in folds) <= CV_GRAM_BYTES):
        return [(len(fold_sets), [_grams([folds[i] for folds in fold_sets]) for i in range(len(fold_sets[0]))])]
    f0 = fold_sets[0][0]
    per_set = 12 * (f0.Yc.shape[0] + f0.E.shape[0]) * f0.Yc.shape[1]   # r <= the fold's rows
    per_chunk = max(1, CV_SET_BYTES // max(1, per_set))
    chunks = []
    for c0 in range(0, len(fold_sets), per_chunk):
        sets = fold_sets[c0:c0 + per_chunk]
        chunks.append((len(sets), [_side_by_side([folds[i] for folds in sets]) for i in range(len(sets[0]))]))
    return chunks


def _cv_alpha_sets(Xtrs: list, chunks: list, grids: list) -> np.ndarray:
    """:func:`_cv_alpha` for several target sets (``chunks``: :func:`_set_chunks`) and every source layer (``Xtrs``:
    its training rows (n_train, D) float64; ``grids``: its alphas (n_alpha,)), each fold's source side diagonalised
    once for all sets.  Returns the chosen alpha's index (L_src, T)."""
    bases = [[_fold_basis(X, f.vmask) for f in chunks[0][1]] for X in Xtrs]   # (L_src, folds)
    chosen = []
    for n_sets, folds in chunks:
        score = 0.0
        for i, f in enumerate(folds):
            layer_bases = [b[i] for b in bases]
            score = score + (_gram_scores(layer_bases, f, grids) if f.G is not None else
                             torch.stack([_fold_score(b, f, g) for b, g in zip(layer_bases, grids)]))
        per_set = score.view(len(Xtrs), score.shape[1], n_sets, -1)          # (L_src, n_alpha, T, Lt)
        chosen.append(per_set.max(3).values.argmax(1).cpu().numpy())        # (L_src, T)
    return np.concatenate(chosen, axis=1)


#: bytes the CV of several target sets at once may take for its (r, columns) products
CV_SET_BYTES = 1 << 28
#: bytes the Gram form of every target set's folds may take (:func:`_set_chunks`)
CV_GRAM_BYTES = 1 << 30


def _side_by_side(folds: list) -> _Fold:
    """Folds of several target sets over the same rows as one fold, the sets' target layers in turn."""
    if len(folds) == 1:
        return folds[0]
    if folds[0].Yc is None:
        return _Fold(folds[0].vmask, None, None, torch.cat([f.w for f in folds]), torch.cat([f.base for f in folds]),
                     torch.cat([f.nvar for f in folds]))
    return _Fold(folds[0].vmask, torch.cat([f.Yc for f in folds], 1), torch.cat([f.E for f in folds], 1),
                 torch.cat([f.w for f in folds]), torch.cat([f.base for f in folds]),
                 torch.cat([f.nvar for f in folds]))


def layer_scale(Xtr_l: torch.Tensor) -> float:
    """The scale of one source layer's training inputs (n_train, D): the mean non-zero eigenvalue of ``Xc'Xc``,
    ``trace / min(n_train - 1, D)`` (1 for constant inputs); ``alpha="cv"`` searches multiples of it
    (:data:`CV_GRID_RULE`)."""
    Xc = Xtr_l - Xtr_l.mean(0, keepdim=True)
    trace = float((Xc * Xc).sum())
    rank = max(1, min(Xtr_l.shape[0] - 1, Xtr_l.shape[1]))
    return trace / rank if trace > 0 else 1.0
