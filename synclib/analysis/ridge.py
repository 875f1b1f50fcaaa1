"""Ridge regression: the one solver, batched test R^2 grids and CV.

The paper fits one ``Ridge(alpha=0.1, fit_intercept=True)`` map per layer pair and scores it with
``r2_score(..., multioutput="uniform_average")``; here one factorisation per *source* layer serves every target layer,
with no Python loop over target layers.  Every ridge fit of the package (the grids and the ToM probes) goes through
:func:`ridge_solve`; :func:`r2_grid` scores every (source layer, target layer) pair, :func:`resampled_r2` on test
sets resampled by whole groups (episodes), :func:`r2_grid_subsets` on several test subsets and
:func:`r2_grid_targets` against several target sets.  The splits live in :mod:`synclib.splits`.

Algebra
-------
For source layer ``l`` let ``Xc`` be the centred training inputs (train means ``mx``), ``Xt`` the test inputs
centred on ``mx``, ``Yc`` the targets centred on the train means ``my`` and ``E = Y_test - my``.  Ridge with an
unpenalised intercept predicts ``E_hat = H Yc`` with the hat matrix

    H = Xt (Xc'Xc + a I)^-1 Xc'  = Xt Xc' (Xc Xc' + a I)^-1          (n_test, n_train)

(primal (D x D) or dual (n x n) Cholesky, whichever is smaller, in float64).  The uniform-average R^2 of target
layer ``t`` is ``1 - mean_j w_j SSres_j`` with ``w_j = 1 / SStot_j`` (test-mean centred, as scikit-learn):

``direct``  predictions ``H Yc`` (or ``(Xt A^-1)(Xc' Yc)`` when cheaper), residuals per column; cost
            ~ L_src * M * n_test * n_train.
``gram``    a target layer's weighted residual sum is ``sum_j w_j |e_j|^2 - 2 <H, C_t> + <H'H, S_t>`` with
            ``C_t = E W Yc'`` and ``S_t = Yc W Yc'`` shared by all source layers; cost
            ~ M * n_train * (n_train + n_test) + L_src * n_train^2 * n_test (about L_src / 5 times less for 80/20).

``method="auto"`` takes the cheaper one that fits the memory budget.  Columns constant on the test set get
scikit-learn's score (1 if predicted exactly, else 0).  Precision: ``"float32"`` (default; factorisations and final
contractions in float64, the big products in float32 with TF32 off), ``"tf32"`` (CUDA only: the big products in
TF32) or ``"bf16"`` (the big products with bfloat16 inputs).
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

    precision : ``"float32"`` | ``"tf32"`` (CUDA) | ``"bf16"``; method : ``"auto"`` | ``"gram"`` | ``"direct"``
    (module doc).  device : the computation's torch device (default None: X's, CPU for numpy).
    max_chunk_bytes : memory budget of one chunk of target layers; max_memory_bytes : ``"auto"`` avoids ``gram``
    above it.
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
    """Each group's share of the test loss (:func:`r2_grid` ``test_groups``): ``labels`` (G,) the distinct group
    labels, sorted; ``loss`` (G, L_src, L_tgt) float64 ((T, G, L_src, L_tgt) from :func:`r2_grid_targets`);
    ``sizes`` (G,) int, the test samples of each group."""

    labels: np.ndarray
    loss: np.ndarray
    sizes: np.ndarray


@dataclass(frozen=True)
class GridFit:
    """What :func:`r2_grid` and :func:`r2_grid_targets` return: ``r2`` (L_src, L_tgt) float64 test R^2 ((T, L_src,
    L_tgt) from :func:`r2_grid_targets`); ``alpha`` (L_src,) float64, each source layer's penalty; ``train_r2``
    (L_src, L_tgt) with ``train_r2=True``, else None; ``test_loss`` a :class:`GroupLoss` with ``test_groups``."""

    r2: np.ndarray
    alpha: np.ndarray
    train_r2: np.ndarray | None = None
    test_loss: GroupLoss | None = None


# --------------------------------------------------------------------------- the solver
def ridge_solve(Xtr: torch.Tensor, Xte: torch.Tensor, alpha: float, Ytr: torch.Tensor | None = None, *,
                form: str = "predict") -> torch.Tensor:
    """Ridge with an unpenalised intercept fitted on one training set and applied to test inputs:
    ``Ridge(alpha, fit_intercept=True)`` in closed form.

    With ``Xc = Xtr - mx``, ``Xt = Xte - mx`` the predictions are ``Xt W + my``, ``W = (Xc'Xc + alpha I)^-1 Xc'
    (Ytr - my)``, by Cholesky of ``Xc'Xc + alpha I`` (D x D) when ``D <= n_train``, else of the dual
    ``Xc Xc' + alpha I`` (n_train x n_train), using ``(Xc'Xc + a I)^-1 Xc' = Xc' (Xc Xc' + a I)^-1``.

    Parameters
    ----------
    Xtr : torch.Tensor, shape (n_train, D)
        Training inputs, float64 (the solve uses their dtype and device).
    Xte : torch.Tensor, shape (n_test, D)
    alpha : float
        Penalty, > 0.
    Ytr : torch.Tensor, shape (n_train, K), optional
        Training targets; for ``form="predict"`` only.
    form : {"predict", "hat", "left"}
        ``"predict"``: the test predictions ``Xt W + my``, (n_test, K).  ``"hat"``: ``H = Xt (Xc'Xc + alpha I)^-1
        Xc'``, (n_test, n_train); any targets' predictions are ``H @ (Ytr - my) + my``.  ``"left"``: ``G = Xt
        (Xc'Xc + alpha I)^-1``, (n_test, D), always primal; predictions ``G @ (Xc' (Ytr - my)) + my``, cheaper than
        the hat matrix when ``n_train >> D``.

    Raises
    ------
    RidgeInputError
        for an unknown ``form``, ``Ytr`` missing (or given) against ``form``, or a system that is not positive
        definite (``alpha`` too small for the inputs).
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
    """Whether ``t`` holds no NaN or inf: a finite sum (20x cheaper) says so, else every element is tested."""
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
    # scikit-learn: a constant test column scores 1 if predicted exactly (constant on train, same value), else 0
    exact = const & (Yc == 0).all(0) & (E == 0).all(0) if bool(const.any()) else const
    base = (w * (E ** 2).sum(0)).sum(-1)
    return _TargetBlock(Yc.to(cdtype), E.to(cdtype), w, base,
                        (~const).sum(-1).double(), exact.sum(-1).double())


def _chunks(n: int, size: int):
    for s in range(0, n, size):
        yield s, min(n, s + size)


def _dot64(A: torch.Tensor, B: torch.Tensor, block: int = 1 << 18) -> torch.Tensor:
    """``A @ B.T`` for wide (rows, K) operands: float32 products over K-blocks, accumulated in float64."""
    acc = torch.zeros(A.shape[0], B.shape[0], dtype=torch.float64, device=A.device)
    K = A.shape[1]
    blk = max(1, min(K, block))
    for s in range(0, K, blk):
        acc += (A[:, s:s + blk].float() @ B[:, s:s + blk].float().T).double()
    return acc


def cv_penalties(X, Y, x_train, y_trains, penalty: Penalty, groups, *,
                 compute: ComputeOptions | None = None) -> np.ndarray:
    """Each target set's penalty per source layer, (T, L_src) float64, chosen as :func:`r2_grid` chooses one set's
    (grouped CV of a CV ``penalty`` over whole ``groups``, (n_train,)), the folds' source sides factorised once for
    every set (:func:`_cv_alpha_sets`).  ``X`` (n_x, L_src, D_src), ``Y`` (n_y, L_tgt, D_tgt); ``x_train``
    (n_train,) rows of X; ``y_trains``: T arrays (n_train,) of rows of Y, each set's training targets."""
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
    """The fitted maps of every source layer: either ``H`` (hat matrices) or ``left`` and ``Xc`` (the ``"left"``
    form of :func:`ridge_solve`, the centred training inputs); ``H_train``/``left_train`` for the training rows."""
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
    """One factorisation per source layer (:func:`ridge_solve`), ``alpha_of(Xtr_l, l)`` giving layer ``l``'s
    penalty from its (n_train, D) float64 training inputs; with ``train`` also applied to the training rows."""
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
    """R^2 (L_src, L_tgt) float64 from hat matrices H (L_src, n_test, n_train), gram form; ``yte`` may be the
    training rows (``check_constant=False``).  With ``groups`` ((n_test,) codes) also the group losses (G, L_src,
    L_tgt), else None: group g's weighted residual sum is ``base_g - 2 sum_(i in g) <H_i, C_i> + <H_g'H_g, S_t>``."""
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
    """As :func:`_score_gram`, from the test predictions with residuals per column (``src`` in either form)."""
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
    """Each source layer's penalty over its scale (:func:`layer_scale` of its training rows), (L_src,) float64:
    for ``alpha="cv"`` penalties, the grid point chosen (:data:`DEFAULT_CV_ALPHAS`).  ``X``, ``train`` as
    :func:`r2_grid` takes them; ``alphas`` (L_src,)."""
    X = _as_tensor(X, "X", _device(X, None))
    rows = train[0] if isinstance(train, tuple) else train
    rows = _rows(rows, "train", X.shape[0], X.device)
    return np.array([a / layer_scale(X[rows, l].double()) for l, a in enumerate(np.asarray(alphas, float))])


def _alpha_chooser(penalty: Penalty, X, xtr, Y, ytr, device, groups) -> Callable:
    """``alpha_of(Xtr_l, l)``: source layer ``l``'s penalty, fixed or chosen for all at once by :func:`cv_penalties`."""
    if penalty.cv:
        fixed = cv_penalties(X, Y, xtr, [ytr], penalty, groups, compute=ComputeOptions(device=str(device)))[0]
    else:
        fixed = _layer_alphas(penalty.alpha, X.shape[1])
    return lambda Xtr_l, l: float(fixed[l])


def _score(src: _SourceSide, method: str, Y, ytr, yte, cdtype, max_chunk_bytes: int,
           check_constant: bool = True, groups=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """R^2 (L_src, L_tgt) of the maps ``src`` on the rows ``yte`` by ``method``, and the group losses or None."""
    if method == "gram":
        return _score_gram(src.H, Y, ytr, yte, cdtype, max_chunk_bytes, check_constant, groups)
    return _score_direct(src, Y, ytr, yte, cdtype, max_chunk_bytes, check_constant, groups)


def r2_grid(X, Y, train, test, penalty=PAPER_ALPHA, *, groups=None, test_groups=None, train_r2: bool = False,
            compute: ComputeOptions | None = None) -> GridFit:
    """Test R^2 of ridge maps from every source layer to every target layer.

    Each entry equals scikit-learn's ``Ridge(alpha, fit_intercept=True)`` fitted on the training rows followed by
    ``r2_score(y_test, pred, multioutput="uniform_average")`` (within 1e-5 in float32).

    Parameters
    ----------
    X : array (n_x, L_src, D_src) or (n_x, D_src), numpy or torch (CPU or CUDA); any float dtype.
    Y : array (n_y, L_tgt, D_tgt) or (n_y, D_tgt).
    train, test : 1-D integer index arrays (or boolean masks) into the rows of both X and Y (then
        ``n_x == n_y``), or pairs ``(x_rows, y_rows)`` of equal length.
    penalty : :class:`Penalty`, or what :meth:`Penalty.of` takes: a float > 0, an array (L_src,) of them, or
        ``"cv"``: each source layer's penalty chosen from ``penalty.cv_alphas`` times the layer's scale
        (:func:`layer_scale`, :data:`CV_GRID_RULE`) by ``penalty.cv_folds``-fold CV over whole ``groups`` on the
        training rows, the criterion on ``penalty.cv_columns`` target columns per target layer (:func:`_cv_alpha`).
    groups : (n_train,) group label of each training sample (CV); default: each sample its own group.
    test_groups : (n_test,) group label (e.g. episode) of each test sample: also return each group's share of the
        test loss, ``l_g = sum_(i in g) sum_j w_j (y_ij - yhat_ij)^2 / D_tgt`` with ``w_j = 1 / SStot_j`` of the
        whole test set, so that ``r2 = k - sum_g l_g`` (``k`` = 1 but for columns constant on the test set), for
        resampling whole groups with the maps held fixed (:func:`resampled_r2`).
    train_r2 : also score the maps on their training rows (``r2_score(y_train, pred_train)``, as the reference
        reports it), from the same factorisation; the scoring cost roughly doubles.
    compute : :class:`ComputeOptions`; default ``ComputeOptions()``.

    Returns
    -------
    GridFit
        ``r2`` (L_src, L_tgt) float64, ``alpha`` (L_src,) the penalties used, ``train_r2`` and ``test_loss``
        (:class:`GroupLoss`) where asked for, else None.

    Raises
    ------
    RidgeInputError
        fewer than 3 training or 2 test samples, NaN/inf in the samples used, a target layer constant over the
        test samples, mismatched sample counts, bad penalty / precision / method.
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
    """R^2 grids (B, L_src, L_tgt) of test sets resampled by whole groups, the maps held fixed.

    ``r2`` (L_src, L_tgt): the grid on the whole test set; ``loss`` (G, L_src, L_tgt) and ``sizes`` (G,): each
    group's loss and test samples (:func:`r2_grid` with ``test_groups``); ``counts`` (B, G): how often each
    resample draws each group, or (B, len(drawn)) for the groups ``drawn`` (the others drawn 0 times, e.g. one
    round's: :func:`synclib.analysis.blocks.episode_bootstrap` with ``round_``).

    Returns ``k - (n_test / n_b) sum_g counts[b, g] loss[g]`` with ``k = r2 + sum_g loss[g]`` and
    ``n_b = sum_g counts[b, g] sizes[g]``: each column's test variance held at the whole test set's; NaN where a
    resample draws no group.  ``counts`` of all ones gives ``r2``.
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
    """Statistics of subset ``i``, rows ``pos`` of Yte (n_union, c, Dt) float64; E (n_union, c, Dt): test targets
    minus train means; yc_zero (c, Dt): columns constant on the training rows."""
    const, w = _test_weights(Yte[pos])
    if bool(const.all(-1).any()):
        raise RidgeInputError(f"tests[{i}]: a target layer is constant over the subset")
    exact = const & yc_zero & (E[pos] == 0).all(0)
    return _Subset(pos, w, (~const).sum(-1).double(), exact.sum(-1).double())


def r2_grid_subsets(X, Y, train, tests, penalty=PAPER_ALPHA, *, compute: ComputeOptions | None = None):
    """One fit per layer pair on ``train``, scored on several test subsets: ``[r2_grid(X, Y, train, t, penalty).r2
    for t in tests]`` with the maps fitted once (direct form on the union of the subsets).

    ``X``, ``Y``, ``train`` as :func:`r2_grid` (index arrays into the rows of both); ``tests``: list of 1-D index
    arrays (each at least 2 rows); ``penalty``: fixed (a float > 0 or an array (L_src,), e.g.
    :attr:`GridFit.alpha` of a CV fit); of ``compute`` only ``device`` and ``max_chunk_bytes`` count (the products
    are float32).  Returns a float64 array (len(tests), L_src, L_tgt).
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
    """One fit of the source side, scored against several sets of targets: ``[r2_grid(X, Y, (x_train, ytr),
    (x_test, yte), penalty) for ytr, yte in targets]`` with each source layer factorised once (the sets share the
    source rows and differ in their target rows: the surrogates of :mod:`synclib.analysis.surrogates`).  A set
    costs its scoring alone (``gram``: ~ M * n_train * (n_train + n_test) for M target columns).

    ``X`` (n_x, L_src, D_src), ``Y`` (n_y, L_tgt, D_tgt); ``x_train`` (n_train,), ``x_test`` (n_test,): rows of X;
    ``targets``: pairs ``(y_train, y_test)`` of rows of Y of those lengths; ``penalty``: fixed (a :class:`Penalty`,
    a float > 0 or an array (L_src,)) or (T, L_src), each set's own (:func:`cv_penalties`; each source layer then
    factorised once per distinct penalty); ``test_groups`` (n_test,): also each set's group losses, as
    :func:`r2_grid`; ``compute`` as there.  Returns a :class:`GridFit`: ``r2`` (T, L_src, L_tgt), ``alpha``
    (L_src,) or (T, L_src), ``train_r2`` None, ``test_loss`` with ``test_groups`` (``loss`` (T, G, L_src, L_tgt)).
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
    """One :class:`_SourceSide` per row of ``alphas`` (T, L_src), in order: one factorisation for all where the rows
    are equal, else one per source layer and distinct penalty, each set taking its own."""
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
