"""Ridge regression: the one solver, batched test R^2 grids and CV.

The paper fits one ridge map per layer pair (``Ridge(alpha=0.1, fit_intercept=True)``)
and scores it with ``r2_score(..., multioutput="uniform_average")``.  Here one
factorisation per *source* layer serves every target layer, and no Python loop
runs over target layers.

Contents
--------
:func:`ridge_solve`       the solver (primal or dual Cholesky, float64); every ridge fit
                          of the package (the grids below and the ToM probes) goes through it
:func:`r2_grid`           test R^2 of every (source layer, target layer) pair
:func:`resampled_r2`      the grid on test sets resampled by whole groups (episodes), maps fixed
:func:`r2_grid_subsets`   one fit per layer pair, scored on several test subsets
:func:`r2_grid_targets`   one factorisation of the source side, scored against several target sets
:class:`Penalty`          the penalty: fixed or chosen by grouped CV (:mod:`synclib.penalty`, re-exported)
:class:`ComputeOptions`   precision, device, method and memory budgets of a grid
:class:`GridFit`          what a grid returns: test R^2, the penalties, optionally training R^2 and group losses

The splits by whole groups (episodes) these fits are scored on live in :mod:`synclib.splits`.

Algebra
-------
For source layer ``l`` let ``Xc`` be the centred training inputs (train means
``mx``), ``Xt`` the test inputs centred on ``mx``, ``Yc`` the targets centred on
the train means ``my`` and ``E = Y_test - my``.  Ridge with an unpenalised
intercept predicts ``E_hat = H Yc`` with the hat matrix

    H = Xt (Xc'Xc + a I)^-1 Xc'  = Xt Xc' (Xc Xc' + a I)^-1          (n_test, n_train)

(primal (D x D) or dual (n x n) Cholesky, whichever is smaller, in float64).  The
uniform-average R^2 of target layer ``t`` is ``1 - mean_j w_j SSres_j`` with
``w_j = 1 / SStot_j`` (test-mean centred, as scikit-learn).  Two ways to get it:

``direct``  predictions ``H Yc`` (or ``(Xt A^-1)(Xc' Yc)`` when that is cheaper),
            residuals per column.  Cost ~ L_src * M * n_test * n_train.
``gram``    the weighted residual sum of a whole target layer is
            ``sum_j w_j |e_j|^2 - 2 <H, C_t> + <H'H, S_t>`` with
            ``C_t = E W Yc'`` and ``S_t = Yc W Yc'`` shared by all source layers.
            Cost ~ M * n_train * (n_train + n_test) + L_src * n_train^2 * n_test,
            i.e. about L_src / 5 times less than ``direct`` for an 80/20 split.

``method="auto"`` takes the cheaper one that fits the memory budget.  Columns
that are constant on the test set get scikit-learn's score (1 if predicted
exactly, else 0).

Precision: ``"float32"`` (default; factorisations and the final contractions in
float64, the big products in float32 with TF32 off), ``"tf32"`` (CUDA only: the
big products in TF32) or ``"bf16"`` (the big products with bfloat16 inputs).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from synclib.analysis.ridge_cv import _cv_alpha_sets, _cv_setup, _set_chunks, _test_weights, layer_scale
from synclib.penalty import CV_GRID_RULE, DEFAULT_CV_ALPHAS, PAPER_ALPHA, Penalty
from synclib.splits import RidgeInputError

__all__ = ["ridge_solve", "r2_grid", "resampled_r2", "r2_grid_subsets", "r2_grid_targets", "cv_penalties", "layer_scale",
           "relative_alphas",
           "RidgeInputError", "PAPER_ALPHA", "DEFAULT_CV_ALPHAS", "CV_GRID_RULE", "Penalty", "ComputeOptions",
           "GridFit", "GroupLoss"]

PRECISIONS = ("float32", "tf32", "bf16")
METHODS = ("auto", "gram", "direct")
SOLVE_FORMS = ("predict", "hat", "left")


@dataclass(frozen=True)
class ComputeOptions:
    """How a grid is computed (not what): checked once, errors name the field.

    precision : ``"float32"`` | ``"tf32"`` (CUDA) | ``"bf16"``; see the module doc.
    device : torch device for the computation (default None: X's device, CPU for numpy).
    method : ``"auto"`` | ``"gram"`` | ``"direct"`` (module doc).
    max_chunk_bytes : memory budget of one chunk of target layers.
    max_memory_bytes : ``method="auto"`` avoids ``gram`` above this.
    """

    precision: str = "float32"
    device: object = None
    method: str = "auto"
    max_chunk_bytes: int = 1 << 30
    max_memory_bytes: int = 8 << 30

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise RidgeInputError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.method not in METHODS:
            raise RidgeInputError(f"method must be 'auto', 'gram' or 'direct', got {self.method!r}")
        for name in ("max_chunk_bytes", "max_memory_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise RidgeInputError(f"{name} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class GroupLoss:
    """Each group's share of the test loss (:func:`r2_grid` ``test_groups``).

    labels : (G,) the distinct group labels, sorted.
    loss : (G, L_src, L_tgt) float64 (:func:`r2_grid`; (T, G, L_src, L_tgt) from :func:`r2_grid_targets`).
    sizes : (G,) int, the test samples of each group.
    """

    labels: np.ndarray
    loss: np.ndarray
    sizes: np.ndarray


@dataclass(frozen=True)
class GridFit:
    """What :func:`r2_grid` and :func:`r2_grid_targets` return.

    r2 : (L_src, L_tgt) float64 test R^2 ((T, L_src, L_tgt) from :func:`r2_grid_targets`).
    alpha : (L_src,) float64, the penalty each source layer was fitted with.
    train_r2 : (L_src, L_tgt) float64 training R^2 with ``train_r2=True``, else None.
    test_loss : :class:`GroupLoss` with ``test_groups``, else None.
    """

    r2: np.ndarray
    alpha: np.ndarray
    train_r2: np.ndarray | None = None
    test_loss: GroupLoss | None = None


# --------------------------------------------------------------------------- the solver
def ridge_solve(Xtr: torch.Tensor, Xte: torch.Tensor, alpha: float, Ytr: torch.Tensor | None = None, *,
                form: str = "predict") -> torch.Tensor:
    """Ridge regression with an unpenalised intercept, fitted on one training set and
    applied to test inputs: ``Ridge(alpha, fit_intercept=True)`` in closed form.

    With ``Xc = Xtr - mx`` and ``Xt = Xte - mx`` (``mx`` the training means) the
    predictions are ``Xt W + my`` with ``W = (Xc'Xc + alpha I)^-1 Xc' (Ytr - my)``.
    The regularised system is factorised by Cholesky in its primal form
    ``Xc'Xc + alpha I`` (D x D) when ``D <= n_train``, else in its dual form
    ``Xc Xc' + alpha I`` (n_train x n_train), using
    ``(Xc'Xc + a I)^-1 Xc' = Xc' (Xc Xc' + a I)^-1``.

    Parameters
    ----------
    Xtr : torch.Tensor, shape (n_train, D)
        Training inputs, float64 (the solve is done in the inputs' dtype and device).
    Xte : torch.Tensor, shape (n_test, D)
        Test inputs.
    alpha : float
        Penalty, > 0.
    Ytr : torch.Tensor, shape (n_train, K), optional
        Training targets; needed by ``form="predict"`` only.
    form : {"predict", "hat", "left"}
        What to return:

        ``"predict"``  the test predictions ``Xt W + my``, shape (n_test, K).
        ``"hat"``      the hat matrix ``H = Xt (Xc'Xc + alpha I)^-1 Xc'``, shape
                       (n_test, n_train): the predictions of *any* targets are
                       ``H @ (Ytr - my) + my`` (one factorisation for many targets).
        ``"left"``     ``G = Xt (Xc'Xc + alpha I)^-1``, shape (n_test, D), always
                       primal: the predictions are ``G @ (Xc' (Ytr - my)) + my``,
                       cheaper than the hat matrix when ``n_train >> D``.

    Returns
    -------
    torch.Tensor
        Shape (n_test, K), (n_test, n_train) or (n_test, D), as ``form`` says.

    Raises
    ------
    RidgeInputError
        for an unknown ``form``, ``Ytr`` missing (or given) against ``form``, or a
        system that is not positive definite (``alpha`` too small for the inputs).
    """
    if form not in SOLVE_FORMS:
        raise RidgeInputError(f"form must be one of {SOLVE_FORMS}, got {form!r}")
    if (Ytr is None) != (form != "predict"):
        raise RidgeInputError(f"Ytr is needed by form='predict' and only by it (form={form!r})")
    mx = Xtr.mean(0, keepdim=True)
    Xc, Xt = Xtr - mx, Xte - mx
    n, d = Xc.shape
    primal = form == "left" or d <= n
    A = Xc.T @ Xc if primal else Xc @ Xc.T
    A.diagonal().add_(alpha)
    try:
        L = torch.linalg.cholesky(A)
    except torch.linalg.LinAlgError as e:  # pragma: no cover - alpha > 0 makes it PD
        raise RidgeInputError(f"alpha: the ridge system is not positive definite (alpha={alpha}); "
                              "use a larger alpha") from e
    if form == "left":
        return torch.cholesky_solve(Xt.T.contiguous(), L).T
    if form == "hat":
        if primal:  # the triangular solves take the smaller of the two sides as right-hand sides
            if Xt.shape[0] < n:
                return torch.cholesky_solve(Xt.T.contiguous(), L).T @ Xc.T
            return Xt @ torch.cholesky_solve(Xc.T.contiguous(), L)
        return torch.cholesky_solve((Xc @ Xt.T).contiguous(), L).T
    my = Ytr.mean(0, keepdim=True)
    Yc = Ytr - my
    W = torch.cholesky_solve(Xc.T @ Yc, L) if primal else Xc.T @ torch.cholesky_solve(Yc, L)
    return Xt @ W + my


# --------------------------------------------------------------------------- input checks
def _as_tensor(a, name: str, device) -> torch.Tensor:
    """numpy / torch -> torch tensor (no copy on CPU where possible)."""
    if isinstance(a, torch.Tensor):
        t = a
    else:
        arr = np.asarray(a)
        if arr.dtype.kind not in "fiu":
            raise RidgeInputError(f"{name} must be a numeric array, got dtype {arr.dtype}")
        if arr.dtype == np.float16 or arr.dtype.kind in "iu":
            arr = arr.astype(np.float32)
        t = torch.from_numpy(np.ascontiguousarray(arr))
    if not t.is_floating_point():
        t = t.float()
    if t.ndim == 2:
        t = t[:, None, :]
    if t.ndim != 3:
        raise RidgeInputError(f"{name} must have shape (n, layers, dim) or (n, dim), got {tuple(t.shape)}")
    if device is not None:
        t = t.to(device)
    return t


def _device(X, device) -> torch.device:
    """``device``, or X's device when None (CPU for numpy)."""
    if device is None:
        device = X.device if isinstance(X, torch.Tensor) else torch.device("cpu")
    return torch.device(device)


def _rows(idx, name: str, n: int, device) -> torch.Tensor:
    a = idx.detach().cpu().numpy() if isinstance(idx, torch.Tensor) else np.asarray(idx)
    if a.dtype == bool:
        if a.shape != (n,):
            raise RidgeInputError(f"{name}: boolean mask of length {a.shape} for {n} rows")
        a = np.flatnonzero(a)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise RidgeInputError(f"{name} must be a 1-D integer index array or boolean mask")
    a = a.astype(np.int64)
    if a.size and (a.min() < -n or a.max() >= n):
        raise RidgeInputError(f"{name} indexes rows outside 0..{n - 1}")
    return torch.as_tensor(a, device=device)


def _split_rows(spec, name: str, nx: int, ny: int, device, paired: bool):
    """``spec`` is an index array (same rows of X and Y) or a pair (x_rows, y_rows)."""
    if isinstance(spec, tuple):
        if len(spec) != 2:
            raise RidgeInputError(f"{name} must be an index array or a pair (x_rows, y_rows)")
        xr_, yr_ = _rows(spec[0], f"{name}[0] (rows of X)", nx, device), _rows(spec[1], f"{name}[1] (rows of Y)", ny, device)
        if xr_.numel() != yr_.numel():
            raise RidgeInputError(f"mismatched sample counts in {name}: {xr_.numel()} rows of X, "
                                  f"{yr_.numel()} rows of Y")
        return xr_, yr_
    if not paired:
        raise RidgeInputError(f"mismatched sample counts: X has {nx} rows and Y has {ny}; "
                              f"pass {name} as a pair (x_rows, y_rows) to pair them explicitly")
    r = _rows(spec, name, nx, device)
    return r, r


def _check_counts(n_train: int, n_tests: dict[str, int]) -> None:
    """At least 3 training samples and 2 in every test set (R^2 needs a test variance)."""
    if n_train < 3:
        raise RidgeInputError(f"train: too few samples ({n_train}); at least 3 are needed")
    for name, n in n_tests.items():
        if n < 2:
            raise RidgeInputError(f"{name}: too few samples ({n}); R^2 needs at least 2")


def _fixed_penalty(penalty, what: str) -> Penalty:
    """``penalty`` (:meth:`Penalty.of`) where only a fixed one will do."""
    penalty = Penalty.of(penalty)
    if penalty.cv:
        raise RidgeInputError(f"{what} needs numeric alphas (pass those chosen by r2_grid)")
    return penalty


def _group_codes(test_groups, n_te: int, name: str = "test sample"):
    """``(labels (G,), codes (n_test,))`` of ``test_groups``, or ``(None, None)``."""
    if test_groups is None:
        return None, None
    tg = np.asarray(test_groups)
    if tg.shape != (n_te,):
        raise RidgeInputError(f"test_groups must have one label per {name} ({n_te}), got shape {tg.shape}")
    return np.unique(tg, return_inverse=True)


def _layer_alphas(alpha, n_layers: int) -> np.ndarray:
    """A numeric ``alpha`` (float or (L_src,) array) as one float64 per source layer, (L_src,)."""
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim == 1 and a.shape != (n_layers,):
        raise RidgeInputError(f"alpha: an array needs one penalty per source layer ({n_layers}), "
                              f"got shape {a.shape}")
    return np.broadcast_to(a, (n_layers,))


def _all_finite(t: torch.Tensor) -> bool:
    """Whether ``t`` holds no NaN or inf: its sum is finite then (20x cheaper than testing every
    element; a NaN or inf makes the sum NaN or inf), else, the sum overflowing, every element."""
    total = t.sum(dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
    return bool(torch.isfinite(total)) or bool(torch.isfinite(t).all())


def _check_finite(t: torch.Tensor, name: str, layer: int | None = None) -> None:
    if not _all_finite(t):
        where = f" (layer {layer})" if layer is not None else ""
        raise RidgeInputError(f"{name} holds NaN or inf in the samples used{where}")


@contextlib.contextmanager
def _matmul_precision(precision: str, device: torch.device):
    if device.type != "cuda":
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


# --------------------------------------------------------------------------- target side
@dataclass
class _TargetBlock:
    """Target-side quantities of a chunk of target layers (centred on train means)."""
    Yc: torch.Tensor      # (n_train, c, Dt) compute dtype
    E: torch.Tensor       # (n_test, c, Dt)  compute dtype
    w: torch.Tensor       # (c, Dt) float64, 1/SStot (0 for constant test columns)
    base: torch.Tensor    # (c,) float64, sum_j w_j |e_j|^2
    n_var: torch.Tensor   # (c,) float64, non-constant columns
    const_ok: torch.Tensor  # (c,) float64, constant columns scored 1 (perfect prediction)


def _target_block(Y, tr_rows, te_rows, layers, cdtype, first_layer: int,
                  check_constant: bool = True) -> _TargetBlock:
    Ytr = Y[tr_rows, layers]  # only this block's layers of the rows
    Yte = Y[te_rows, layers]
    for name, t in (("Y", Ytr), ("Y", Yte)):  # before the cast: float64 keeps inf and NaN as they are
        if not _all_finite(t):
            bad = (~torch.isfinite(t)).flatten(2).any(-1).any(0).nonzero().flatten()
            raise RidgeInputError(f"{name} holds NaN or inf in the samples used "
                                  f"(target layer {first_layer + int(bad[0])})")
    Ytr, Yte = Ytr.double(), Yte.double()
    my = Ytr.mean(0, keepdim=True)
    Yc = Ytr - my
    E = Yte - my
    const, w = _test_weights(Yte)  # (c, Dt)
    all_const = const.all(-1)
    if check_constant and bool(all_const.any()):
        t = first_layer + int(all_const.nonzero()[0])
        raise RidgeInputError(f"Y: target layer {t} is constant over the test samples; R^2 is undefined")
    # scikit-learn: a constant test column scores 1 if predicted exactly, else 0. The
    # prediction is exact only when the column is constant on train with the same value.
    exact = const & (Yc == 0).all(0) & (E == 0).all(0) if bool(const.any()) else const
    base = (w * (E ** 2).sum(0)).sum(-1)
    return _TargetBlock(Yc.to(cdtype), E.to(cdtype), w, base,
                        (~const).sum(-1).double(), exact.sum(-1).double())


def _chunks(n: int, size: int):
    for s in range(0, n, size):
        yield s, min(n, s + size)


def _dot64(A: torch.Tensor, B: torch.Tensor, block: int = 1 << 18) -> torch.Tensor:
    """``A @ B.T`` for wide (rows, K) operands: float32 products over K-blocks of
    ``block``, accumulated in float64 (bounds the rounding error of long sums)."""
    acc = torch.zeros(A.shape[0], B.shape[0], dtype=torch.float64, device=A.device)
    K = A.shape[1]
    blk = max(1, min(K, block))
    for s in range(0, K, blk):
        acc += (A[:, s:s + blk].float() @ B[:, s:s + blk].float().T).double()
    return acc


def cv_penalties(X, Y, x_train, y_trains, penalty: Penalty, groups, *,
                 compute: ComputeOptions | None = None) -> np.ndarray:
    """Each target set's penalty per source layer, chosen by the grouped CV of ``penalty``
    (``alpha="cv"``: the grid times each source layer's scale, folds over whole ``groups``),
    as :func:`r2_grid` chooses one set's; the folds' source sides are factorised once for every
    set (:func:`_cv_alpha_sets`).

    Parameters
    ----------
    X : array (n_x, L_src, D_src); Y : array (n_y, L_tgt, D_tgt).
    x_train : 1-D integer array of rows of X (n_train,).
    y_trains : list of T arrays of rows of Y (n_train,), the training targets of each set.
    penalty : a CV :class:`Penalty`.
    groups : (n_train,) the group (episode) of each training row.

    Returns
    -------
    float64 array (T, L_src)
    """
    if not penalty.cv:
        raise RidgeInputError("cv_penalties: the penalty is not alpha='cv'")
    compute = compute or ComputeOptions()
    device = _device(X, compute.device)
    X = _as_tensor(X, "X", device)
    Y = _as_tensor(Y, "Y", device)
    xtr = _rows(x_train, "x_train", X.shape[0], device)
    ytrs = [_rows(r, f"y_trains[{i}] (rows of Y)", Y.shape[0], device) for i, r in enumerate(y_trains)]
    if any(y.numel() != xtr.numel() for y in ytrs):
        raise RidgeInputError("y_trains: each set needs one training row of Y per row of x_train")
    cvs = [_cv_setup(Y, y, groups, penalty, device) for y in ytrs]
    base_grid, chunks = cvs[0].grid, _set_chunks([c.folds for c in cvs], X.shape[2], cvs[0].grid.numel())
    del cvs
    Xtrs = []
    for l in range(X.shape[1]):
        Xtrs.append(X[xtr, l].double())
        _check_finite(Xtrs[-1], "X", l)
    grids = [base_grid * layer_scale(Xtr_l) for Xtr_l in Xtrs]
    chosen = _cv_alpha_sets(Xtrs, chunks, grids)                           # (L_src, T)
    return np.stack([g.cpu().numpy()[c] for g, c in zip(grids, chosen)], axis=1)


# --------------------------------------------------------------------------- r2_grid
def _choose_method(method: str, Ls: int, D: int, M: int, n_tr: int, n_te: int, max_memory_bytes: int,
                   train: bool = False) -> str:
    """``method``, or for ``"auto"`` the one with fewer flops (gram also needs Ls*n_tr^2
    memory); ``train`` adds the cost of scoring the training rows too."""
    if method != "auto":
        return method
    sets = [n_te] + ([n_tr] if train else [])
    direct_flops = sum(Ls * M * min(n * n_tr, D * (n_tr + n)) for n in sets)
    gram_flops = sum(M * n_tr * (n_tr + n) + Ls * n_tr * n_tr * n for n in sets)
    gram_bytes = sum(4 * Ls * n_tr * (n_tr + n) for n in sets)
    return "gram" if gram_flops < direct_flops and gram_bytes <= max_memory_bytes else "direct"


@dataclass
class _SourceSide:
    """The fitted maps of every source layer, in the form the scoring needs.

    Either ``H`` (hat matrices) or ``left`` and ``Xc`` (the ``"left"`` form of
    :func:`ridge_solve` and the centred training inputs) is set; ``H_train`` /
    ``left_train`` are the same for the training rows as inputs (train R^2).
    """
    alphas: np.ndarray                      # (L_src,) float64, the penalty of each source layer
    H: torch.Tensor | None = None           # (L_src, n_test, n_train) compute dtype
    left: list | None = None                # L_src x (n_test, D) compute dtype
    Xc: list | None = None                  # L_src x (n_train, D) compute dtype
    H_train: torch.Tensor | None = None     # (L_src, n_train, n_train)
    left_train: list | None = None          # L_src x (n_train, D)

    def training_side(self) -> "_SourceSide":
        """The maps applied to the training rows, in the form of the test side."""
        return _SourceSide(self.alphas, self.H_train, self.left_train, self.Xc)


def _source_side(X, xtr, xte, alpha_of: Callable, cdtype, use_left: bool, train: bool = False) -> _SourceSide:
    """One factorisation per source layer (:func:`ridge_solve`); ``alpha_of(Xtr_l, l)``
    gives the penalty of layer ``l`` from its (n_train, D) float64 training inputs.
    With ``train`` the same factorisation is also applied to the training rows."""
    Ls, n_te, n_tr = X.shape[1], xte.numel(), xtr.numel()
    src = _SourceSide(np.full(Ls, np.nan))
    if use_left:
        src.left, src.Xc = [], []
        src.left_train = [] if train else None
    else:
        src.H = torch.empty(Ls, n_te, n_tr, dtype=cdtype, device=X.device)
        src.H_train = torch.empty(Ls, n_tr, n_tr, dtype=cdtype, device=X.device) if train else None
    for l in range(Ls):
        Xtr_l, Xte_l = X[xtr, l], X[xte, l]
        _check_finite(Xtr_l, "X", l)  # before the cast: float64 keeps inf and NaN as they are
        _check_finite(Xte_l, "X", l)
        Xtr_l, Xte_l = Xtr_l.double(), Xte_l.double()
        src.alphas[l] = alpha_of(Xtr_l, l)
        inputs = torch.cat([Xte_l, Xtr_l]) if train else Xte_l  # rows n_te.. are the training rows
        if use_left:
            G = ridge_solve(Xtr_l, inputs, src.alphas[l], form="left").to(cdtype)
            src.left.append(G[:n_te])
            if train:
                src.left_train.append(G[n_te:])
            src.Xc.append((Xtr_l - Xtr_l.mean(0, keepdim=True)).to(cdtype))
        else:
            H = ridge_solve(Xtr_l, inputs, src.alphas[l], form="hat")
            src.H[l] = H[:n_te]
            if train:
                src.H_train[l] = H[n_te:]
        del Xtr_l, Xte_l, inputs
    return src


def _group_rows(groups, device) -> list[torch.Tensor]:
    """Test-row positions of each group: ``groups`` (n_test,) integer codes 0 .. G-1."""
    return [torch.as_tensor(np.flatnonzero(groups == g), device=device) for g in range(int(groups.max()) + 1)]


def _group_base(blk: _TargetBlock, rows: list) -> torch.Tensor:
    """(G, c) float64: ``sum_j w_j |e_ij|^2`` summed over each group's test rows."""
    per_row = (blk.w[None] * blk.E.double() ** 2).sum(-1)  # (n_te, c)
    return torch.stack([per_row[r].sum(0) for r in rows])


def _score_gram(H, Y, ytr, yte, cdtype, max_chunk_bytes: int, check_constant: bool = True,
                groups=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """R^2 (L_src, L_tgt) float64 from the hat matrices H (L_src, n_test, n_train), gram form.
    ``yte`` may be the training rows (train R^2, ``check_constant=False``).  With ``groups``
    ((n_test,) codes) also the group losses of :func:`r2_grid` (G, L_src, L_tgt), else None:
    a group's weighted residual sum is ``base_g - 2 sum_(i in g) <H_i, C_i> + <H_g'H_g, S_t>``."""
    Ls, n_te, n_tr = H.shape
    Lt, Dt = Y.shape[1], Y.shape[2]
    out = torch.empty(Ls, Lt, dtype=torch.float64, device=H.device)
    G = torch.bmm(H.transpose(1, 2), H)  # (Ls, n_tr, n_tr)
    per_layer = 4 * (n_tr + n_te) * (Dt + n_tr)
    c = max(1, min(Lt, max_chunk_bytes // max(per_layer, 1)))
    Hf = H.flatten(1)
    Gf = G.flatten(1)
    Hf64 = Hf.double() if Hf.numel() * 8 < max_chunk_bytes else None  # once, not per chunk
    rows = _group_rows(groups, H.device) if groups is not None else None
    loss = torch.empty(len(rows), Ls, Lt, dtype=torch.float64, device=H.device) if rows else None
    lchunk = max(1, min(Ls, max_chunk_bytes // max(1, 4 * n_tr * n_tr)))  # source layers per group gram
    for s, e in _chunks(Lt, c):
        blk = _target_block(Y, ytr, yte, slice(s, e), cdtype, s, check_constant)
        Yw = blk.Yc * blk.w.to(cdtype)[None]                       # (n_tr, c, Dt)
        Yc_t = blk.Yc.permute(1, 0, 2)                             # (c, n_tr, Dt)
        S = torch.bmm(Yw.permute(1, 0, 2), Yc_t.transpose(1, 2))   # (c, n_tr, n_tr)
        C = torch.bmm((blk.E * blk.w.to(cdtype)[None]).permute(1, 0, 2), Yc_t.transpose(1, 2))  # (c, n_te, n_tr)
        hc = (Hf64 @ C.flatten(1).double().T) if Hf64 is not None else _dot64(Hf, C.flatten(1))
        gs = _dot64(Gf, S.flatten(1))
        ssw = blk.base[None] - 2 * hc + gs                         # (Ls, c)
        out[:, s:e] = (blk.n_var[None] - ssw + blk.const_ok[None]) / Dt
        if rows:
            hc_rows = torch.bmm(H.transpose(0, 1), C.permute(1, 2, 0)).double()  # (n_te, Ls, c)
            base_g = _group_base(blk, rows)                                        # (G, c)
            Sf = S.flatten(1)
            for g, r in enumerate(rows):
                for l0, l1 in _chunks(Ls, lchunk):
                    Hg = H[l0:l1, r]                                               # (l, n_g, n_tr)
                    gs_g = _dot64(torch.bmm(Hg.transpose(1, 2), Hg).flatten(1), Sf)  # (l, c)
                    loss[g, l0:l1, s:e] = (base_g[g][None] - 2 * hc_rows[r, l0:l1].sum(0) + gs_g) / Dt
        del S, C, Yw, blk
    return out, loss


def _score_direct(src: _SourceSide, Y, ytr, yte, cdtype, max_chunk_bytes: int,
                  check_constant: bool = True, groups=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """R^2 (L_src, L_tgt) float64 from the test predictions, residuals per column.
    ``yte`` may be the training rows (train R^2, ``check_constant=False``).  With ``groups``
    also the group losses of :func:`r2_grid` (G, L_src, L_tgt), else None."""
    Ls = len(src.alphas)
    n_tr, n_te = ytr.numel(), yte.numel()
    Lt, Dt = Y.shape[1], Y.shape[2]
    out = torch.empty(Ls, Lt, dtype=torch.float64, device=Y.device)
    rows = _group_rows(groups, Y.device) if groups is not None else None
    loss = torch.empty(len(rows), Ls, Lt, dtype=torch.float64, device=Y.device) if rows else None
    per_layer = 4 * (n_tr + 2 * n_te) * Dt
    c = max(1, min(Lt, max_chunk_bytes // max(per_layer, 1)))
    for s, e in _chunks(Lt, c):
        blk = _target_block(Y, ytr, yte, slice(s, e), cdtype, s, check_constant)
        Ycf, Ef = blk.Yc.flatten(1), blk.E.flatten(1)
        for l in range(Ls):
            P = src.H[l] @ Ycf if src.H is not None else src.left[l] @ (src.Xc[l].T @ Ycf)
            res2 = ((Ef - P).double() ** 2).view(-1, e - s, Dt)
            out[l, s:e] = (blk.n_var - (blk.w * res2.sum(0)).sum(-1) + blk.const_ok) / Dt
            if rows:
                per_row = (blk.w[None] * res2).sum(-1)  # (n_te, c)
                loss[:, l, s:e] = torch.stack([per_row[r].sum(0) for r in rows]) / Dt
        del blk
    return out, loss


def relative_alphas(X, train, alphas) -> np.ndarray:
    """Each source layer's penalty over its scale (:func:`layer_scale` of its training rows):
    where ``alphas`` came from ``alpha="cv"``, the grid point chosen (:data:`DEFAULT_CV_ALPHAS`).

    ``X`` (n_x, L_src, D) and ``train`` as :func:`r2_grid` takes them (an index array, or a
    pair ``(x_rows, y_rows)``); ``alphas`` (L_src,).  Returns (L_src,) float64."""
    X = _as_tensor(X, "X", _device(X, None))
    rows = train[0] if isinstance(train, tuple) else train
    rows = _rows(rows, "train", X.shape[0], X.device)
    return np.array([a / layer_scale(X[rows, l].double()) for l, a in enumerate(np.asarray(alphas, float))])


def _alpha_chooser(penalty: Penalty, X, xtr, Y, ytr, device, groups) -> Callable:
    """``alpha_of(Xtr_l, l)``: the penalty of source layer ``l``, fixed, or chosen for every source
    layer at once by :func:`cv_penalties` (grouped CV over ``groups`` on the training rows, from
    ``penalty.cv_alphas`` times the layer's scale)."""
    if penalty.cv:
        fixed = cv_penalties(X, Y, xtr, [ytr], penalty, groups, compute=ComputeOptions(device=str(device)))[0]
    else:
        fixed = _layer_alphas(penalty.alpha, X.shape[1])
    return lambda Xtr_l, l: float(fixed[l])


def _score(src: _SourceSide, method: str, Y, ytr, yte, cdtype, max_chunk_bytes: int,
           check_constant: bool = True, groups=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """R^2 (L_src, L_tgt) of the maps ``src`` on the rows ``yte`` by ``method``, and the
    group losses (or None) of ``groups``."""
    if method == "gram":
        return _score_gram(src.H, Y, ytr, yte, cdtype, max_chunk_bytes, check_constant, groups)
    return _score_direct(src, Y, ytr, yte, cdtype, max_chunk_bytes, check_constant, groups)


def r2_grid(X, Y, train, test, penalty=PAPER_ALPHA, *, groups=None, test_groups=None, train_r2: bool = False,
            compute: ComputeOptions | None = None) -> GridFit:
    """Test R^2 of ridge maps from every source layer to every target layer.

    Each entry equals scikit-learn's ``Ridge(alpha, fit_intercept=True)`` fit on
    the training rows followed by ``r2_score(y_test, pred,
    multioutput="uniform_average")`` (within 1e-5 in float32).

    Parameters
    ----------
    X : array (n_x, L_src, D_src) or (n_x, D_src), numpy or torch (CPU or CUDA); any float dtype.
    Y : array (n_y, L_tgt, D_tgt) or (n_y, D_tgt).
    train, test : 1-D integer index arrays (or boolean masks) into the rows of both X
        and Y (then ``n_x == n_y``), or pairs ``(x_rows, y_rows)`` of equal length.
    penalty : :class:`Penalty`, or what :meth:`Penalty.of` takes: a float > 0, an array
        (L_src,) of them, or ``"cv"`` (the default CV).  With ``alpha="cv"`` the penalty of each
        source layer is chosen from ``penalty.cv_alphas`` times the layer's scale
        (:func:`layer_scale`, :data:`CV_GRID_RULE`) by ``penalty.cv_folds``-fold CV over whole
        ``groups`` (episodes) on the training rows only, the criterion on ``penalty.cv_columns``
        target columns per target layer; see :func:`_cv_alpha`.
    groups : (n_train,) group label of each training sample (CV penalties); default: every
        sample its own group.
    test_groups : (n_test,) group label (e.g. episode) of each test sample: also return
        each group's share of the test loss (``test_loss``), for resampling whole groups with
        the maps held fixed.  Group ``g``'s loss is ``l_g = sum_(i in g) sum_j w_j (y_ij - yhat_ij)^2 / D_tgt``
        with ``w_j = 1 / SStot_j`` of the whole test set, so that
        ``r2 = k - sum_g l_g`` (``k`` = 1 but for columns constant on the test set).  A
        resample drawing group ``g`` ``c_g`` times, ``n = sum_g c_g n_g`` rows, has
        ``r2_c = k - (n_test / n) sum_g c_g l_g``: its R^2 with each column's test variance held
        at the whole test set's (:func:`resampled_r2`).
    train_r2 : also score the same maps on their training rows (``train_r2``,
        ``r2_score(y_train, pred_train)`` as the reference reports it).  The same factorisation
        serves both; the scoring cost roughly doubles (``gram``: an extra (n_train x n_train)
        hat matrix per source layer).
    compute : :class:`ComputeOptions` (precision, device, method, memory budgets); default
        ``ComputeOptions()``.

    Returns
    -------
    GridFit
        ``r2`` (L_src, L_tgt) float64; ``alpha`` (L_src,) float64, the penalties used;
        ``train_r2`` (L_src, L_tgt) with ``train_r2``, else None; ``test_loss`` with
        ``test_groups`` a :class:`GroupLoss` (the distinct labels (G,) in sorted order, the
        losses (G, L_src, L_tgt) float64 and the test samples of each group (G,)), else None.

    Raises
    ------
    RidgeInputError
        fewer than 2 train or test samples (3 for the training set), NaN/inf in
        the samples used, a target layer constant over the test samples,
        mismatched sample counts, bad penalty / precision / method.
    """
    penalty = Penalty.of(penalty)
    compute = compute or ComputeOptions()
    precision = compute.precision
    device = _device(X, compute.device)
    if precision == "tf32" and device.type != "cuda":
        raise RidgeInputError("precision='tf32' needs a CUDA device")
    X = _as_tensor(X, "X", device)
    Y = _as_tensor(Y, "Y", device)
    paired = X.shape[0] == Y.shape[0]
    xtr, ytr = _split_rows(train, "train", X.shape[0], Y.shape[0], device, paired)
    xte, yte = _split_rows(test, "test", X.shape[0], Y.shape[0], device, paired)
    n_tr, n_te = xtr.numel(), xte.numel()
    _check_counts(n_tr, {"test": n_te})
    Ls, D = X.shape[1], X.shape[2]
    cdtype = torch.bfloat16 if precision == "bf16" else torch.float32
    method = _choose_method(compute.method, Ls, D, Y.shape[1] * Y.shape[2], n_tr, n_te, compute.max_memory_bytes,
                            train_r2)
    # (Xt A^-1)(Xc' Yc) instead of H Yc: cheaper when n_train >> D
    use_left = method == "direct" and D * (n_tr + n_te) < n_te * n_tr
    labels, codes = _group_codes(test_groups, n_te)
    alpha_of = _alpha_chooser(penalty, X, xtr, Y, ytr, device, groups)
    chunk = compute.max_chunk_bytes
    with _matmul_precision(precision, device):
        src = _source_side(X, xtr, xte, alpha_of, cdtype, use_left, train=train_r2)
        del alpha_of  # frees the CV folds
        r2, loss = _score(src, method, Y, ytr, yte, cdtype, chunk, groups=codes)
        r2 = r2.cpu().numpy()
        fit_r2 = None
        if train_r2:
            src.H = src.left = None  # the test side is done: free it before the training side
            fit_r2 = _score(src.training_side(), method, Y, ytr, ytr, cdtype, chunk, check_constant=False)[0]
            fit_r2 = fit_r2.cpu().numpy()
    test_loss = None if labels is None else GroupLoss(labels, loss.cpu().numpy(),
                                                      np.bincount(codes, minlength=len(labels)))
    return GridFit(r2, src.alphas, fit_r2, test_loss)


def resampled_r2(r2, loss, sizes, counts, drawn=None) -> np.ndarray:
    """R^2 grids of test sets resampled by whole groups, the maps held fixed.

    Parameters
    ----------
    r2 : array (L_src, L_tgt)
        The grid on the whole test set (:func:`r2_grid`).
    loss : array (G, L_src, L_tgt)
        Each group's loss (:func:`r2_grid` with ``test_groups``).
    sizes : array (G,)
        Test samples per group.
    counts : array (B, G), or (B, len(drawn)) with ``drawn``
        How often each resample draws each group.
    drawn : int array, optional
        The groups ``counts`` refers to (the others are drawn 0 times), e.g. the groups of
        one round: the test samples of that round scored with each column's variance held at
        the whole test set's (:func:`synclib.analysis.blocks.episode_bootstrap` with ``round_``).

    Returns
    -------
    array (B, L_src, L_tgt)
        ``k - (n_test / n_b) sum_g counts[b, g] loss[g]`` with ``k = r2 + sum_g loss[g]`` and
        ``n_b = sum_g counts[b, g] sizes[g]`` (each column's test variance held at the whole
        test set's); NaN where a resample draws no group.  ``counts`` of all ones gives ``r2``.
        For one subset of the test samples drawn once, this is one minus the mean over target
        columns of the subset's mean squared error over the whole test set's variance (ddof 0).
    """
    loss, sizes, counts = np.asarray(loss, float), np.asarray(sizes, float), np.asarray(counts, float)
    k = np.asarray(r2, float) + loss.sum(0)
    n_test = sizes.sum()
    if drawn is not None:
        loss, sizes = loss[drawn], sizes[drawn]
    n_b = counts @ sizes
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(n_b > 0, n_test / n_b, np.nan)
    total = np.tensordot(counts, loss, axes=(1, 0))  # (B, L_src, L_tgt)
    return k[None] - scale[:, None, None] * total


# --------------------------------------------------------------------------- r2_grid_subsets
@dataclass
class _Subset:
    """Test-side statistics of one test subset (one chunk of target layers)."""
    pos: torch.Tensor      # (n_sub,) rows of the subset within the union of the subsets
    w: torch.Tensor        # (c, Dt) float64, 1/SStot on the subset (0: constant column)
    n_var: torch.Tensor    # (c,) float64, non-constant columns
    const_ok: torch.Tensor  # (c,) float64, constant columns predicted exactly


def _subset_stats(i: int, pos, Yte, E, yc_zero) -> _Subset:
    """Statistics of subset ``i`` (rows ``pos`` of Yte (n_union, c, Dt) float64);
    E (n_union, c, Dt) are the test targets minus the train means, yc_zero (c, Dt)
    the columns constant on the training rows."""
    const, w = _test_weights(Yte[pos])
    if bool(const.all(-1).any()):
        raise RidgeInputError(f"tests[{i}]: a target layer is constant over the subset")
    exact = const & yc_zero & (E[pos] == 0).all(0)
    return _Subset(pos, w, (~const).sum(-1).double(), exact.sum(-1).double())


def r2_grid_subsets(X, Y, train, tests, penalty=PAPER_ALPHA, *, compute: ComputeOptions | None = None):
    """One fit per layer pair on ``train``, scored on several test subsets.

    Equivalent to ``[r2_grid(X, Y, train, t, penalty).r2 for t in tests]`` but the maps
    are fitted once: predictions for the union of the subsets are computed
    (direct form) and each subset's R^2 is aggregated from them.

    Parameters
    ----------
    X, Y, train : as :func:`r2_grid` (index arrays into the rows of both X and Y).
    tests : list of 1-D index arrays (each at least 2 rows).
    penalty : a fixed :class:`Penalty`, a float > 0 or an array (L_src,) of them (e.g. the
        alphas chosen by a CV fit, :attr:`GridFit.alpha`).
    compute : :class:`ComputeOptions`; its ``device`` and ``max_chunk_bytes`` are used (the
        products are float32).

    Returns
    -------
    numpy float64 array (len(tests), L_src, L_tgt)
    """
    penalty = _fixed_penalty(penalty, "r2_grid_subsets")
    compute = compute or ComputeOptions()
    max_chunk_bytes = compute.max_chunk_bytes
    device = _device(X, compute.device)
    X = _as_tensor(X, "X", device)
    Y = _as_tensor(Y, "Y", device)
    if X.shape[0] != Y.shape[0]:
        raise RidgeInputError(f"mismatched sample counts: X has {X.shape[0]} rows and Y has {Y.shape[0]}")
    tr = _rows(train, "train", X.shape[0], device)
    subs = [_rows(t, f"tests[{i}]", X.shape[0], device) for i, t in enumerate(tests)]
    if not subs:
        raise RidgeInputError("tests: no test subsets given")
    _check_counts(tr.numel(), {f"tests[{i}]": t.numel() for i, t in enumerate(subs)})
    union, inv = torch.unique(torch.cat(subs), return_inverse=True)
    pos = list(torch.split(inv, [t.numel() for t in subs]))
    Ls, Lt, Dt = X.shape[1], Y.shape[1], Y.shape[2]
    al = _layer_alphas(penalty.alpha, Ls)
    H = []
    for l in range(Ls):
        Xtr_l, Xu_l = X[tr, l], X[union, l]
        _check_finite(Xtr_l, "X", l)
        _check_finite(Xu_l, "X", l)
        H.append(ridge_solve(Xtr_l.double(), Xu_l.double(), float(al[l]), form="hat").float())
    out = torch.empty(len(subs), Ls, Lt, dtype=torch.float64, device=device)
    c = max(1, min(Lt, max_chunk_bytes // max(1, 4 * (tr.numel() + 2 * union.numel()) * Dt)))
    with _matmul_precision("float32", device):
        for s, e in _chunks(Lt, c):
            blk = _target_block(Y, tr, union, slice(s, e), torch.float32, s, check_constant=False)
            Yte = Y[union, s:e].double()  # only this block's layers of the rows
            yc_zero = (blk.Yc.double() == 0).all(0)  # the same for every subset
            E = blk.E.double()
            stats = [_subset_stats(i, p, Yte, E, yc_zero) for i, p in enumerate(pos)]
            Ycf, Ef = blk.Yc.flatten(1), blk.E.flatten(1)
            for l in range(Ls):
                res2 = ((Ef - H[l] @ Ycf).double() ** 2).view(-1, e - s, Dt)
                for i, st in enumerate(stats):
                    out[i, l, s:e] = (st.n_var - (st.w * res2[st.pos].sum(0)).sum(-1) + st.const_ok) / Dt
    return out.cpu().numpy()


# --------------------------------------------------------------------------- r2_grid_targets
def r2_grid_targets(X, Y, x_train, x_test, targets, penalty, *, test_groups=None,
                    compute: ComputeOptions | None = None) -> GridFit:
    """One fit of the source side, scored against several sets of targets.

    Equivalent to ``[r2_grid(X, Y, (x_train, ytr), (x_test, yte), penalty) for ytr, yte in
    targets]`` but each source layer is factorised once: the sets share the source rows and
    the penalties and differ only in their target rows (the surrogates of
    :mod:`synclib.analysis.surrogates`).  The cost of a set is the scoring alone
    (``gram``: ~ M * n_train * (n_train + n_test) for M target columns).

    Parameters
    ----------
    X : array (n_x, L_src, D_src); Y : array (n_y, L_tgt, D_tgt).
    x_train, x_test : 1-D integer arrays of rows of X (n_train,), (n_test,).
    targets : list of pairs ``(y_train, y_test)`` of rows of Y, of lengths n_train and n_test.
    penalty : a fixed :class:`Penalty`, a float > 0 or an array (L_src,) of them (e.g. the
        penalties a CV fit chose; no CV), or an array (T, L_src): each set's own penalties
        (:func:`cv_penalties`); each source layer is then factorised once per distinct penalty.
    test_groups : (n_test,) label of each test row: also return each group's share of the test
        loss of every set, as :func:`r2_grid` does (``r2 = k - sum_g l_g``).
    compute : :class:`ComputeOptions`, as :func:`r2_grid`.

    Returns
    -------
    GridFit
        ``r2`` (T, L_src, L_tgt) float64, T = len(targets); ``alpha`` (L_src,), or (T, L_src)
        with per-set penalties;
        ``train_r2`` None; ``test_loss`` with ``test_groups`` a :class:`GroupLoss` whose
        ``loss`` is (T, G, L_src, L_tgt), else None.
    """
    per_set = isinstance(penalty, np.ndarray) and penalty.ndim == 2
    if per_set:
        if penalty.shape[0] != len(targets) or not np.all(np.isfinite(penalty) & (penalty > 0)):
            raise RidgeInputError(f"penalty: a (T, L_src) array needs one row of penalties > 0 per target set "
                                  f"({len(targets)}), got shape {penalty.shape}")
    else:
        penalty = _fixed_penalty(penalty, "r2_grid_targets")
    compute = compute or ComputeOptions()
    precision = compute.precision
    if not len(targets):
        raise RidgeInputError("targets: no target sets given")
    device = _device(X, compute.device)
    X = _as_tensor(X, "X", device)
    Y = _as_tensor(Y, "Y", device)
    xtr, xte = _rows(x_train, "x_train", X.shape[0], device), _rows(x_test, "x_test", X.shape[0], device)
    _check_counts(xtr.numel(), {"x_test": xte.numel()})
    sets = []
    for i, pair in enumerate(targets):
        if len(pair) != 2:
            raise RidgeInputError(f"targets[{i}] must be a pair (y_train, y_test)")
        ytr, yte = (_rows(r, f"targets[{i}][{j}] (rows of Y)", Y.shape[0], device) for j, r in enumerate(pair))
        if (ytr.numel(), yte.numel()) != (xtr.numel(), xte.numel()):
            raise RidgeInputError(f"targets[{i}]: {ytr.numel()} training and {yte.numel()} test rows of Y for "
                                  f"{xtr.numel()} and {xte.numel()} rows of X")
        sets.append((ytr, yte))
    labels, codes = _group_codes(test_groups, xte.numel(), "test row")
    Ls, D = X.shape[1], X.shape[2]
    n_tr, n_te = xtr.numel(), xte.numel()
    cdtype = torch.bfloat16 if precision == "bf16" else torch.float32
    method = _choose_method(compute.method, Ls, D, Y.shape[1] * Y.shape[2], n_tr, n_te, compute.max_memory_bytes)
    use_left = method == "direct" and D * (n_tr + n_te) < n_te * n_tr
    alphas = penalty if per_set else np.broadcast_to(_layer_alphas(penalty.alpha, Ls), (len(sets), Ls))
    if alphas.shape[1] != Ls:
        raise RidgeInputError(f"penalty: {alphas.shape[1]} penalties per set for {Ls} source layers")
    r2s, losses = [], []
    with _matmul_precision(precision, device):
        sides = _source_sides(X, xtr, xte, np.asarray(alphas, dtype=np.float64), cdtype, use_left)
        for (ytr, yte), src in zip(sets, sides):
            r2, loss = _score(src, method, Y, ytr, yte, cdtype, compute.max_chunk_bytes, groups=codes)
            r2s.append(r2.cpu().numpy())
            if codes is not None:
                losses.append(loss.cpu().numpy())
    test_loss = None if codes is None else GroupLoss(labels, np.stack(losses),
                                                     np.bincount(codes, minlength=len(labels)))
    return GridFit(np.stack(r2s), np.array(alphas) if per_set else np.array(alphas[0]), None, test_loss)


def _source_sides(X, xtr, xte, alphas: np.ndarray, cdtype, use_left: bool):
    """One :class:`_SourceSide` per row of ``alphas`` (T, L_src), in order: where every set has
    the same penalties, one factorisation serves them all; otherwise each source layer is
    factorised once per distinct penalty and each set takes its own."""
    if (alphas == alphas[0]).all():
        src = _source_side(X, xtr, xte, lambda Xtr_l, l: float(alphas[0, l]), cdtype, use_left)
        for _ in range(len(alphas)):
            yield src
        return
    distinct = [np.unique(alphas[:, l]) for l in range(alphas.shape[1])]
    parts = {}  # (layer, penalty) -> that layer's side: H (n_test, n_train), or (left, Xc)
    for l, values in enumerate(distinct):
        Xtr_l, Xte_l = X[xtr, l], X[xte, l]
        _check_finite(Xtr_l, "X", l)
        _check_finite(Xte_l, "X", l)
        Xtr_l, Xte_l = Xtr_l.double(), Xte_l.double()
        Xc = (Xtr_l - Xtr_l.mean(0, keepdim=True)).to(cdtype) if use_left else None
        for a in values:
            form = "left" if use_left else "hat"
            side = ridge_solve(Xtr_l, Xte_l, float(a), form=form).to(cdtype)
            parts[(l, float(a))] = (side, Xc) if use_left else side
    for row in alphas:
        src = _SourceSide(row.copy())
        if use_left:
            src.left = [parts[(l, float(a))][0] for l, a in enumerate(row)]
            src.Xc = [parts[(l, float(a))][1] for l, a in enumerate(row)]
        else:
            src.H = torch.stack([parts[(l, float(a))] for l, a in enumerate(row)])
        yield src
