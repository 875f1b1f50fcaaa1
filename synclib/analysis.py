"""SyncR^2 from an activation cube: datasets, splits, controls, sensitivity.

Protocol (``../shared/protocol.md``; paper sections 3.2-3.3, appendices B-E, G, I):

* datasets, with rounds ``k`` (see book/architecture.md): A->B pairs
  ``(hidden_a[k], hidden_b[k])``; B->A ``(hidden_b[k], hidden_a[k+1])``; lag ``j``:
  A->B ``(hidden_a[k], hidden_b[k+j])``, B->A ``(hidden_b[k], hidden_a[k+1+j])``;
  passive: the ``_passive`` source with the genuine target.  Samples whose source or
  target is not finite (unreached rounds) are dropped.
* split (per split seed): shuffle episodes, whole episodes to the test set until it
  holds >= 20 % of ``n_samples``, then to the training set until it holds >= 80 %.
  A cube with fewer samples is used whole, still 80/20 by episodes (recorded).
  The persona-disjoint variant assigns whole (unordered) agent pairs instead.
* ridge (``synclib.ridge.r2_grid``) for every layer pair; SyncR^2 = mean over
  source layers of ``max(0, max over target layers of R^2)``.

:func:`analyze` returns everything as an ``xarray.Dataset`` (schema in
book/architecture.md, "Analysis results"); ``synclib analyze`` writes it to netCDF.
"""
from __future__ import annotations

import argparse
import math
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np

from synclib.ridge import RidgeInputError, r2_grid, r2_grid_subsets

__all__ = [
    "Dataset", "build_dataset", "episode_split", "persona_keys", "sync_r2", "sync_r2_topk",
    "sync_r2_noclip", "mean_se", "analyze", "open_cube_lazy", "mlp_r2",
    "RELATIONSHIP_SOURCES", "RELATIONSHIPS", "configure_parser", "run",
]

DIRECTIONS = ("A->B", "B->A")
#: appendix G: only these scenario sources enter the relationship analysis
RELATIONSHIP_SOURCES = ("social_iqa", "social_chemistry", "normbank")
RELATIONSHIPS = ("stranger", "know_by_name", "acquaintance", "friend", "romantic_relationship",
                 "family_member")


class AnalysisError(ValueError):
    """A cube or an option the analysis cannot work with."""


# --------------------------------------------------------------------------- datasets
@dataclass
class Dataset:
    """Paired samples of one (condition, direction).

    ``X`` and ``Y`` are the whole source / target variables as rows
    (:class:`synclib.cube.HiddenRows`, flattened over (episode, sim_seed, round):
    shapes (E*S*R, L_src, D_src) and (E*S*R, L_tgt, D_tgt)); sample ``i`` pairs
    row ``x_rows[i]`` of X with row ``y_rows[i]`` of Y.  :meth:`take` reads the
    arrays of chosen samples.  ``episode`` (position along the cube's episode dim),
    ``sim_seed`` and ``round`` (source round) describe each sample.
    """
    condition: str
    direction: str
    X: "HiddenRows"
    Y: "HiddenRows"
    x_rows: np.ndarray
    y_rows: np.ndarray
    episode: np.ndarray
    sim_seed: np.ndarray
    round: np.ndarray
    info: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.x_rows)

    def take(self, idx) -> tuple[np.ndarray, np.ndarray]:
        """Source and target arrays of samples ``idx``: (len(idx), L_src, D_src), (len(idx), L_tgt, D_tgt)."""
        return self.X[self.x_rows[idx]], self.Y[self.y_rows[idx]]

    def ridge_inputs(self, tr, te):
        """``(X, Y, train, test)`` for :func:`synclib.ridge.r2_grid` on samples ``tr``/``te``:
        the whole arrays with paired row indices when both variables are in memory;
        otherwise only the rows of these samples, read from disk."""
        if self.X.resident and self.Y.resident:
            return (self.X.array, self.Y.array,
                    (self.x_rows[tr], self.y_rows[tr]), (self.x_rows[te], self.y_rows[te]))
        Xs, Ys = self.take(np.concatenate([tr, te]))
        return Xs, Ys, np.arange(len(tr)), np.arange(len(tr), len(tr) + len(te))


def _parse_condition(condition: str) -> tuple[str, int]:
    """'genuine' -> ('genuine', 0); 'passive' -> ('passive', 0); 'lag2' -> ('lag', 2)."""
    if condition in ("genuine", "passive"):
        return condition, 0
    if condition.startswith("lag") and condition[3:].isdigit() and int(condition[3:]) >= 1:
        return "lag", int(condition[3:])
    raise AnalysisError(f"unknown condition {condition!r}: use 'genuine', 'passive' or 'lagK' (K >= 1)")


class _Arrays:
    """The cube's hidden-state variables as :class:`synclib.cube.HiddenRows`, opened
    once each: small ones loaded whole, larger ones (lazily opened cubes) streamed."""

    def __init__(self, cube, max_resident_bytes=None):
        self.cube = cube
        self.max_resident_bytes = max_resident_bytes
        self._cache: dict = {}

    def get(self, name: str):
        from synclib.cube import CubeError, HiddenRows

        if name not in self._cache:
            if name not in self.cube.variables:
                raise AnalysisError(f"the cube has no variable {name!r} (needed for this condition)")
            try:
                self._cache[name] = HiddenRows(self.cube[name], self.max_resident_bytes)
            except CubeError as exc:
                raise AnalysisError(str(exc)) from None
        return self._cache[name]

    def drop(self, name: str):
        self._cache.pop(name, None)


def build_dataset(cube, direction: str, condition: str = "genuine", arrays: _Arrays | None = None) -> Dataset:
    """Paired samples of one direction and condition (index arithmetic in the module doc).

    Parameters
    ----------
    cube : xarray.Dataset in the cube schema (in memory or dask-backed).
    direction : ``"A->B"`` or ``"B->A"``.
    condition : ``"genuine"``, ``"passive"`` or ``"lagJ"`` (J >= 1).
    arrays : a shared loader (internal; re-uses loaded variables).

    Returns
    -------
    Dataset
    """
    if direction not in DIRECTIONS:
        raise AnalysisError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    kind, lag = _parse_condition(condition)
    arrays = arrays or _Arrays(cube)
    a_to_b = direction == "A->B"
    src = ("hidden_a" if a_to_b else "hidden_b") + ("_passive" if kind == "passive" else "")
    tgt = "hidden_b" if a_to_b else "hidden_a"
    shift = lag + (0 if a_to_b else 1)  # target round = source round + shift
    X, Y = arrays.get(src), arrays.get(tgt)
    okx, oky = X.ok, Y.ok
    E, S, R = (cube.sizes[d] for d in ("episode", "sim_seed", "round"))
    e, s, k = np.meshgrid(np.arange(E), np.arange(S), np.arange(R - shift), indexing="ij")
    e, s, k = e.ravel(), s.ravel(), k.ravel()
    xr_ = (e * S + s) * R + k
    yr_ = xr_ + shift
    keep = okx[xr_] & oky[yr_]
    info = {"source_var": src, "target_var": tgt, "round_shift": shift,
            "n_dropped": int((~keep).sum())}
    return Dataset(condition, direction, X, Y, xr_[keep], yr_[keep], e[keep], s[keep], k[keep], info)


# --------------------------------------------------------------------------- splits
def persona_keys(cube) -> np.ndarray:
    """Unordered agent-pair key per episode, e.g. ``"agent01|agent07"``."""
    a1 = np.asarray(cube["agent1_id"].values).astype(str)
    a2 = np.asarray(cube["agent2_id"].values).astype(str)
    return np.array(["|".join(sorted(p)) for p in zip(a1, a2)])


def episode_split(groups, n_samples: int | None = 6500, seed: int = 0, test_frac: float = 0.2):
    """Group-wise train/test split with the protocol's fixed sample size.

    Parameters
    ----------
    groups : (n,) group of each sample (episode, or agent pair for the
        persona-disjoint split); a group is never in both sets.
    n_samples : total sample size (test >= ``test_frac * n_samples``, then train
        >= the rest); ``None`` or more than available: use all samples, still
        split by groups at ``test_frac``.
    seed : split seed (shuffles the groups).

    Returns
    -------
    train, test : int index arrays into the samples
    info : dict with ``n_available``, ``n_requested``, ``short`` (0/1)
    """
    groups = np.asarray(groups)
    n = len(groups)
    if n_samples is not None and n_samples < 2:
        raise AnalysisError(f"n_samples must be >= 2, got {n_samples}")
    uniq, inv = np.unique(groups, return_inverse=True)
    if len(uniq) < 2:
        raise AnalysisError(f"need at least 2 groups (episodes / agent pairs) to split, got {len(uniq)}")
    short = n_samples is None or n_samples > n
    total = n if short else n_samples
    need_test = math.ceil(test_frac * total)
    need_train = total - need_test
    counts = np.bincount(inv, minlength=len(uniq))
    order = np.random.default_rng(seed).permutation(len(uniq))
    test_g, train_g = [], []
    n_te = n_tr = 0
    for g in order:
        if n_te < need_test:
            test_g.append(g)
            n_te += counts[g]
        elif n_tr < need_train:
            train_g.append(g)
            n_tr += counts[g]
        else:
            break
    if not train_g:  # tiny inputs: keep at least one group for training
        train_g.append(test_g.pop())
    te = np.flatnonzero(np.isin(inv, test_g))
    tr = np.flatnonzero(np.isin(inv, train_g))
    return tr, te, {"n_available": n, "n_requested": -1 if n_samples is None else int(n_samples),
                    "short": int(short)}


# --------------------------------------------------------------------------- scores
def _valid_rows(grid):
    g = np.asarray(grid, dtype=np.float64)
    return g[~np.all(np.isnan(g), axis=1)]


def sync_r2(grid) -> float:
    """Paper eq.: mean over source layers of max(0, max over target layers of R^2).

    ``grid`` is (L_src, L_tgt); all-NaN rows/columns (padding) are ignored.
    """
    g = _valid_rows(grid)
    return float(np.mean(np.maximum(0.0, np.nanmax(g, axis=1))))


def sync_r2_noclip(grid) -> float:
    """As :func:`sync_r2` without clipping negative values at 0 (appendix C.2)."""
    g = _valid_rows(grid)
    return float(np.mean(np.nanmax(g, axis=1)))


def sync_r2_topk(grid, k: int) -> float:
    """Mean over source layers of the mean of the top-k target R^2, no clipping (appendix C.1).

    NaN if ``k`` exceeds the number of target layers.
    """
    g = _valid_rows(grid)
    g = g[:, ~np.all(np.isnan(g), axis=0)]
    if k < 1:
        raise AnalysisError(f"k must be >= 1, got {k}")
    if k > g.shape[1]:
        return float("nan")
    top = -np.sort(-g, axis=1)[:, :k]
    return float(top.mean())


def mean_se(values, axis=-1):
    """Mean and standard error (std with ddof=1 over sqrt(n); 0 for n = 1), NaN-aware."""
    v = np.asarray(values, dtype=np.float64)
    n = np.sum(~np.isnan(v), axis=axis)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        m = np.nanmean(v, axis=axis)
        sd = np.nanstd(v, axis=axis, ddof=1)
    se = np.where(n > 1, sd / np.sqrt(np.maximum(n, 1)), 0.0)
    return m, se


# --------------------------------------------------------------------------- nonlinear
def mlp_r2(Xtr, Ytr, Xte, Yte, *, hidden: int = 512, lr: float = 1e-4, weight_decay: float = 0.1,
           epochs: int = 200, batch_size: int | None = 64, seed: int = 0, device=None) -> float:
    """Appendix I: a 2-layer MLP (Linear-ReLU-Linear, ``hidden`` units) trained with
    AdamW (lr, weight decay) for ``epochs`` on MSE; returns the test R^2
    (uniform average, as scikit-learn).

    Inputs and targets are standardised with training statistics (the paper does
    not say; R^2 is unaffected by the target rescaling, which is undone before
    scoring).  ``batch_size=None`` trains full-batch (one step per epoch);
    the default uses shuffled minibatches of 64 (the paper does not say either).

    Shapes: Xtr (n_train, D_src), Ytr (n_train, D_tgt), Xte, Yte likewise.
    """
    import torch

    dev = torch.device(device or "cpu")
    g = torch.Generator().manual_seed(seed)
    f = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    Xtr, Ytr, Xte, Yte = f(Xtr), f(Ytr), f(Xte), f(Yte)
    mx, sx = Xtr.mean(0), Xtr.std(0).clamp_min(1e-6)
    my, sy = Ytr.mean(0), Ytr.std(0).clamp_min(1e-6)
    xtr, ytr = ((Xtr - mx) / sx).to(dev), ((Ytr - my) / sy).to(dev)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(xtr.shape[1], hidden), torch.nn.ReLU(),
                              torch.nn.Linear(hidden, ytr.shape[1])).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    n = xtr.shape[0]
    bs = n if batch_size is None else int(batch_size)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g).to(dev)
        for s in range(0, n, bs):
            idx = perm[s:s + bs]
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(net(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
    with torch.no_grad():
        pred = (net(((Xte - mx) / sx).to(dev)).cpu() * sy + my).double()
    y = Yte.double()
    ss_res = ((y - pred) ** 2).sum(0)
    ss_tot = ((y - y.mean(0)) ** 2).sum(0)
    const = ss_tot == 0
    r2 = torch.where(const, (ss_res == 0).double(), 1 - ss_res / torch.where(const, 1.0, ss_tot))
    return float(r2.mean())


# --------------------------------------------------------------------------- analyze
def open_cube_lazy(path):
    """Open a cube lazily: ``synclib.cube.open_cube`` (which checks the file is a
    finished cube)."""
    from synclib.cube import open_cube

    return open_cube(path)


def _grid_scores(grid, kmax):
    return (sync_r2(grid), sync_r2_noclip(grid),
            np.array([sync_r2_topk(grid, k) for k in range(1, kmax + 1)]))


def analyze(cube, conditions=("genuine", "passive", "lag1", "lag2"), *, alpha=0.1,
            n_samples: int | None = 6500, split_seeds=(0, 1, 2), lags=None, device=None,
            precision: str = "float32", directions=DIRECTIONS, persona_disjoint: bool = False,
            relationship: bool = False, relationship_seeds=(0, 1, 2), relationship_min: int = 10,
            sample_sizes=None, nonlinear: bool = False, nonlinear_pairs=None,
            nonlinear_options: dict | None = None, tom: bool = False, tom_options: dict | None = None,
            max_resident_bytes: int | None = None, progress: bool = True, log=None):
    """All SyncR^2 analyses of one cube (one model pair).

    Parameters
    ----------
    cube : xarray.Dataset (cube schema), in memory or dask-backed.
    conditions : among ``genuine``, ``passive`` (needs the passive variables),
        ``lagJ``.  Conditions whose variables are missing are skipped with a note.
    alpha : ridge penalty (float) or ``"cv"`` (episode-grouped CV on each
        training set; the chosen alphas are in ``alpha``).
    n_samples : fixed sample size per dataset (protocol: 6,500); ``None`` = all.
    split_seeds : split seeds (protocol: 0, 1, 2).
    lags : convenience: adds ``lagJ`` for each J to ``conditions`` (replacing lag
        conditions given there).
    device, precision : passed to :func:`synclib.ridge.r2_grid`.
    persona_disjoint : also the genuine condition with a persona-disjoint split (table 2).
    relationship : also appendix G (genuine condition, test subsets by relationship).
    relationship_seeds : subsampling seeds of appendix G.
    relationship_min : relationships with fewer test samples are left out (NaN).
    sample_sizes : also appendix D: genuine SyncR^2 at these sample sizes.
    nonlinear : also appendix I (MLP) on ``nonlinear_pairs`` ((src, tgt) layer
        pairs per direction; default: each of 4 evenly spaced source layers with
        its best affine target layer on split seed 0), options for :func:`mlp_r2`.
    tom, tom_options : also appendix J (see :func:`synclib.tom.tom_decode`).
    max_resident_bytes : hidden-state variables up to this size (default
        ``synclib.cube.DEFAULT_RESIDENT_BYTES``, 2 GiB) are loaded whole; larger
        ones of a lazily opened cube stream from disk, each fit reading only the
        rows of its split (see :class:`synclib.cube.HiddenRows`).
    progress : show a tqdm bar on stderr.
    log : callable for notes (default: print to stderr).

    Returns
    -------
    xarray.Dataset (see book/architecture.md, "Analysis results").
    """
    import xarray as xr
    from tqdm.auto import tqdm

    log = log or (lambda m: print(m, file=sys.stderr))
    conditions = list(conditions)
    if lags is not None:
        conditions = [c for c in conditions if not c.startswith("lag")] + [f"lag{int(j)}" for j in lags]
    for c in conditions:
        _parse_condition(c)
    if not conditions:
        raise AnalysisError("conditions: nothing to analyse")
    split_seeds = [int(s) for s in split_seeds]
    if not split_seeds:
        raise AnalysisError("split_seeds: at least one split seed is needed")
    for d in directions:
        if d not in DIRECTIONS:
            raise AnalysisError(f"directions: unknown direction {d!r}")
    for v in ("hidden_a", "hidden_b"):
        if v not in cube.variables:
            raise AnalysisError(f"the cube has no variable {v!r}; is it a synclib cube?")
    skipped = []
    if "passive" in conditions and "hidden_a_passive" not in cube.variables:
        skipped.append("passive")
        conditions.remove("passive")
        log("note: the cube has no passive-reader variables; condition 'passive' skipped")
    La, Lb = cube.sizes["layer_a"], cube.sizes["layer_b"]
    Lmax = max(La, Lb)
    ridge_kw = dict(device=device, precision=precision)
    arrays = _Arrays(cube, max_resident_bytes)
    nc, nd, ns = len(conditions), len(directions), len(split_seeds)
    r2 = np.full((nc, nd, ns, Lmax, Lmax), np.nan)
    alphas = np.full((nc, nd, ns, Lmax), np.nan)
    sr = np.full((nc, nd, ns), np.nan)
    srn = np.full((nc, nd, ns), np.nan)
    topk = np.full((nc, nd, ns, Lmax), np.nan)
    n_train = np.zeros((nc, nd, ns), dtype=np.int64)
    n_test = np.zeros((nc, nd, ns), dtype=np.int64)
    n_avail = np.zeros((nc, nd), dtype=np.int64)
    notes = []
    extra = {}

    steps = nc * nd * ns
    if persona_disjoint:
        steps += nd * ns
    if sample_sizes:
        steps += len(sample_sizes) * nd * ns
    bar = tqdm(total=steps, desc="SyncR^2 grids", disable=not progress, file=sys.stderr)

    def fit(ds: Dataset, tr, te, groups, what: str = ""):
        """One R^2 grid; a dataset too small or degenerate to fit gives NaN and a note."""
        a = alpha
        try:
            X, Y, train, test = ds.ridge_inputs(tr, te)
            return r2_grid(X, Y, train, test, a, groups=groups[tr] if a == "cv" else None,
                           return_alpha=True, **ridge_kw)
        except RidgeInputError as exc:
            msg = f"{what or ds.info.get('condition', '')}: not fitted ({exc}); left NaN"
            notes.append(msg)
            log("note: " + msg)
            return np.full((ds.X.shape[1], ds.Y.shape[1]), np.nan), np.full(ds.X.shape[1], np.nan)

    genuine_cache = {}
    for di, d in enumerate(directions):
        for ci, c in enumerate(conditions):
            ds = build_dataset(cube, d, c, arrays)
            n_avail[ci, di] = ds.n
            if n_samples is not None and ds.n < n_samples:
                msg = (f"{c} {d}: the cube holds {ds.n} samples, fewer than n_samples={n_samples}; "
                       f"using all of them, split 80/20 by episodes")
                notes.append(msg)
                log("note: " + msg)
            Ls = ds.X.shape[1]
            Lt = ds.Y.shape[1]
            for si, seed in enumerate(split_seeds):
                try:
                    tr, te, _ = episode_split(ds.episode, n_samples, seed)
                except AnalysisError as exc:  # too few episodes for this condition
                    notes.append(f"{c} {d} split {seed}: not fitted ({exc}); left NaN")
                    log("note: " + notes[-1])
                    bar.update(1)
                    continue
                g, al = fit(ds, tr, te, ds.episode, f"{c} {d} split {seed}")
                r2[ci, di, si, :Ls, :Lt] = g
                alphas[ci, di, si, :Ls] = al
                sr[ci, di, si], srn[ci, di, si], topk[ci, di, si, :Lt] = _grid_scores(g, Lt)
                n_train[ci, di, si], n_test[ci, di, si] = len(tr), len(te)
                if c == "genuine":
                    genuine_cache[(d, seed)] = (ds, tr, te, g, al)
                bar.update(1)
            if c.endswith("passive"):
                arrays.drop(ds.info["source_var"])

    coords = {
        "condition": conditions, "direction": list(directions), "split_seed": split_seeds,
        "src_layer": np.arange(Lmax), "tgt_layer": np.arange(Lmax), "k": np.arange(1, Lmax + 1),
    }
    cds = ("condition", "direction", "split_seed")
    out = xr.Dataset(
        {
            "r2": (cds + ("src_layer", "tgt_layer"), r2),
            "alpha": (cds + ("src_layer",), alphas),
            "sync_r2": (cds, sr),
            "sync_r2_noclip": (cds, srn),
            "sync_r2_topk": (cds + ("k",), topk),
            "n_train": (cds, n_train),
            "n_test": (cds, n_test),
            "n_available": (("condition", "direction"), n_avail),
        },
        coords=coords,
    )
    m, se = mean_se(sr)
    out["sync_r2_mean"], out["sync_r2_se"] = (("condition", "direction"), m), (("condition", "direction"), se)
    pair = sr.mean(axis=1)  # SyncR^2(A, B) per split seed: mean of the two directions
    out["sync_r2_pair"] = (("condition", "split_seed"), pair)
    m, se = mean_se(pair)
    out["sync_r2_pair_mean"], out["sync_r2_pair_se"] = ("condition", m), ("condition", se)
    m, se = mean_se(topk.transpose(0, 1, 3, 2))
    out["sync_r2_topk_mean"], out["sync_r2_topk_se"] = (("condition", "direction", "k"), m), (("condition", "direction", "k"), se)

    need_genuine = persona_disjoint or relationship or sample_sizes or nonlinear
    if need_genuine and "genuine" not in conditions:
        raise AnalysisError("persona_disjoint / relationship / sample_sizes / nonlinear need the 'genuine' condition")

    # ---- table 2: persona-disjoint split
    if persona_disjoint:
        keys = persona_keys(cube)
        v = np.full((nd, ns), np.nan)
        ntr = np.zeros((nd, ns), dtype=np.int64)
        nte = np.zeros((nd, ns), dtype=np.int64)
        for di, d in enumerate(directions):
            for si, seed in enumerate(split_seeds):
                ds = genuine_cache[(d, seed)][0]
                groups = keys[ds.episode]
                tr, te, _ = episode_split(groups, n_samples, seed)
                shared = set(groups[tr]) & set(groups[te])
                assert not shared, shared
                g, _ = fit(ds, tr, te, ds.episode)
                v[di, si] = sync_r2(g)
                ntr[di, si], nte[di, si] = len(tr), len(te)
                bar.update(1)
        out["persona_disjoint_sync_r2"] = (("direction", "split_seed"), v)
        out["persona_disjoint_n_train"] = (("direction", "split_seed"), ntr)
        out["persona_disjoint_n_test"] = (("direction", "split_seed"), nte)

    # ---- appendix D: sample-size sweep
    if sample_sizes:
        sizes = [int(s) for s in sample_sizes]
        v = np.full((len(sizes), nd, ns), np.nan)
        ntr = np.zeros((len(sizes), nd, ns), dtype=np.int64)
        for zi, size in enumerate(sizes):
            for di, d in enumerate(directions):
                for si, seed in enumerate(split_seeds):
                    ds = genuine_cache[(d, seed)][0]
                    if size > ds.n:
                        msg = f"sample size {size} > available {ds.n} ({d}); left NaN"
                        if msg not in notes:
                            notes.append(msg)
                    else:
                        tr, te, _ = episode_split(ds.episode, size, seed)
                        g, _ = fit(ds, tr, te, ds.episode)
                        v[zi, di, si] = sync_r2(g)
                        ntr[zi, di, si] = len(tr) + len(te)
                    bar.update(1)
        out = out.assign_coords(sample_size=sizes)
        out["sample_size_sync_r2"] = (("sample_size", "direction", "split_seed"), v)
        out["sample_size_n_used"] = (("sample_size", "direction", "split_seed"), ntr)
    bar.close()

    # ---- appendix G: relationship subsets of the test set
    if relationship:
        rels = np.asarray(cube["relationship"].values).astype(int)
        srcs = np.asarray(cube["source"].values).astype(str)
        nr, nq = len(RELATIONSHIPS), len(relationship_seeds)
        v = np.full((nr, nd, ns, nq), np.nan)
        size = np.zeros((nd, ns), dtype=np.int64)
        for di, d in enumerate(directions):
            for si, seed in enumerate(split_seeds):
                ds, tr, te, g0, al = genuine_cache[(d, seed)]
                te_ok = te[np.isin(srcs[ds.episode[te]], RELATIONSHIP_SOURCES)]
                by = {r: te_ok[rels[ds.episode[te_ok]] == r] for r in range(nr)}
                present = [r for r in range(nr) if len(by[r]) >= relationship_min]
                if not present:
                    notes.append(f"relationship {d} seed {seed}: no relationship has >= {relationship_min} "
                                 f"test samples from {RELATIONSHIP_SOURCES}")
                    continue
                m_ = min(len(by[r]) for r in present)
                size[di, si] = m_
                subsets, where = [], []
                for qi, q in enumerate(relationship_seeds):
                    rng = np.random.default_rng([int(seed), int(q)])
                    for r in present:
                        subsets.append(rng.choice(by[r], m_, replace=False))
                        where.append((r, qi))
                # equal-sized subsets; rows index X and Y through the pair (x_rows, y_rows):
                # build a paired view so that r2_grid_subsets can index both by one array
                rows = np.concatenate([tr] + subsets)
                uniq, inv = np.unique(rows, return_inverse=True)
                Xp, Yp = ds.take(uniq)
                pos = np.split(inv, np.cumsum([len(tr)] + [len(s) for s in subsets])[:-1])
                res = r2_grid_subsets(Xp, Yp, pos[0], pos[1:], al, device=device)
                for (r, qi), gsub in zip(where, res):
                    v[r, di, si, qi] = sync_r2(gsub)
        out = out.assign_coords(relationship=list(RELATIONSHIPS), relationship_seed=list(relationship_seeds))
        out["relationship_sync_r2"] = (("relationship", "direction", "split_seed", "relationship_seed"), v)
        out["relationship_subset_size"] = (("direction", "split_seed"), size)
        m, se = mean_se(v.mean(axis=3))
        out["relationship_sync_r2_mean"] = (("relationship", "direction"), m)
        out["relationship_sync_r2_se"] = (("relationship", "direction"), se)

    # ---- appendix I: nonlinear comparator
    if nonlinear:
        opts = dict(nonlinear_options or {})
        pairs_by_dir = {}
        for d in directions:
            g0 = genuine_cache[(d, split_seeds[0])][3]
            if nonlinear_pairs is None:
                srcs_l = np.unique(np.linspace(0, g0.shape[0] - 1, min(4, g0.shape[0])).round().astype(int))
                pairs_by_dir[d] = [(int(l), int(np.nanargmax(g0[l]))) for l in srcs_l
                                   if np.isfinite(g0[l]).any()]
            else:
                pairs_by_dir[d] = [tuple(map(int, p)) for p in
                                   (nonlinear_pairs[d] if isinstance(nonlinear_pairs, dict) else nonlinear_pairs)]
        npair = max([len(p) for p in pairs_by_dir.values()] + [0])
        nl = np.full((nd, ns, npair), np.nan)
        af = np.full((nd, ns, npair), np.nan)
        ps = np.full((nd, npair), -1, dtype=np.int64)
        pt = np.full((nd, npair), -1, dtype=np.int64)
        nbar = tqdm(total=nd * ns * npair, desc="nonlinear maps", disable=not progress, file=sys.stderr)
        for di, d in enumerate(directions):
            for si, seed in enumerate(split_seeds):
                ds, tr, te, g, _ = genuine_cache[(d, seed)]
                for pi, (ls, lt) in enumerate(pairs_by_dir[d]):
                    ps[di, pi], pt[di, pi] = ls, lt
                    nl[di, si, pi] = mlp_r2(ds.X[ds.x_rows[tr], ls], ds.Y[ds.y_rows[tr], lt],
                                            ds.X[ds.x_rows[te], ls], ds.Y[ds.y_rows[te], lt],
                                            seed=seed, device=device, **opts)
                    af[di, si, pi] = g[ls, lt]
                    nbar.update(1)
        nbar.close()
        out = out.assign_coords(layer_pair=np.arange(npair))
        out["nonlinear_src_layer"] = (("direction", "layer_pair"), ps)
        out["nonlinear_tgt_layer"] = (("direction", "layer_pair"), pt)
        out["nonlinear_r2"] = (("direction", "split_seed", "layer_pair"), nl)
        out["affine_r2"] = (("direction", "split_seed", "layer_pair"), af)
        out.attrs["nonlinear_options"] = repr({"hidden": 512, "lr": 1e-4, "weight_decay": 0.1,
                                               "epochs": 200, "batch_size": 64, **opts})

    # ---- appendix J: ToM decoding
    if tom:
        from synclib.tom import tom_decode

        try:
            t = tom_decode(cube, split_seeds=split_seeds, device=device, progress=progress,
                           max_resident_bytes=max_resident_bytes, **(tom_options or {}))
        except (AnalysisError, RidgeInputError) as exc:  # too few ToM samples
            notes.append(f"ToM decoding: not done ({exc})")
            log("note: " + notes[-1])
        else:
            out = xr.merge([out, t], combine_attrs="override")

    out.attrs.update({
        "title": "synclib SyncR^2 analysis",
        "conventions": "synclib analysis v1 (see book/architecture.md)",
        "alpha": str(alpha), "n_samples": -1 if n_samples is None else int(n_samples),
        "precision": precision,
        "model_a": str(cube.attrs.get("model_a", "")), "model_b": str(cube.attrs.get("model_b", "")),
        "n_layers_a": int(La), "n_layers_b": int(Lb),
        "notes": "\n".join(notes), "skipped_conditions": " ".join(skipped),
        "relationship_sources": " ".join(RELATIONSHIP_SOURCES) if relationship else "",
    })
    from synclib import __version__
    out.attrs["synclib_version"] = __version__
    return out


# --------------------------------------------------------------------------- CLI
def configure_parser(p: argparse.ArgumentParser) -> None:
    """Options of ``synclib analyze``."""
    p.add_argument("cube", help="activation cube (.nc) written by `synclib simulate`")
    p.add_argument("--out", required=True, help="result file (.nc) to write")
    p.add_argument("--conditions", default="genuine,passive,lag1,lag2",
                   help="comma-separated conditions: genuine, passive, lagJ (default: %(default)s)")
    p.add_argument("--alpha", default="0.1",
                   help="ridge penalty, or 'cv' for episode-grouped CV per source layer (default: %(default)s)")
    p.add_argument("--n-samples", type=int, default=6500,
                   help="fixed sample size per dataset; 0 = all (default: %(default)s)")
    p.add_argument("--split-seeds", default="0,1,2", help="comma-separated split seeds (default: %(default)s)")
    p.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: cpu)")
    p.add_argument("--precision", default="float32", choices=["float32", "tf32", "bf16"],
                   help="matmul precision of the big products (default: %(default)s)")
    p.add_argument("--persona-disjoint", action="store_true", help="also the persona-disjoint split (table 2)")
    p.add_argument("--relationship", action="store_true", help="also relationship subsets (appendix G)")
    p.add_argument("--sample-sizes", default="",
                   help="comma-separated sample sizes for the appendix D sweep (default: none)")
    p.add_argument("--nonlinear", action="store_true", help="also the 2-layer MLP comparison (appendix I)")
    p.add_argument("--nonlinear-epochs", type=int, default=200, help="MLP epochs (default: %(default)s)")
    p.add_argument("--nonlinear-batch-size", type=int, default=64,
                   help="MLP minibatch size; 0 = full batch (default: %(default)s)")
    p.add_argument("--tom", action="store_true", help="also ToM decoding (appendix J; needs the ToM variables)")
    p.add_argument("--max-resident-gib", type=float, default=2.0,
                   help="hidden-state variables up to this size (GiB) are loaded whole; larger ones "
                        "stream from disk, each fit reading only its rows (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def run(args: argparse.Namespace) -> int:
    """Entry point of ``synclib analyze``."""
    import os
    from pathlib import Path

    alpha = args.alpha if args.alpha == "cv" else float(args.alpha)
    if args.max_resident_gib < 0:
        print(f"synclib analyze: --max-resident-gib must be >= 0, got {args.max_resident_gib}", file=sys.stderr)
        return 2
    try:
        cube = open_cube_lazy(args.cube)
    except (FileNotFoundError, ValueError) as e:
        print(f"synclib analyze: {e}", file=sys.stderr)
        return 2
    try:
        res = analyze(
            cube, conditions=[c.strip() for c in args.conditions.split(",") if c.strip()], alpha=alpha,
            n_samples=args.n_samples or None, split_seeds=_ints(args.split_seeds), device=args.device,
            precision=args.precision, persona_disjoint=args.persona_disjoint, relationship=args.relationship,
            sample_sizes=_ints(args.sample_sizes) or None, nonlinear=args.nonlinear,
            nonlinear_options={"epochs": args.nonlinear_epochs,
                               "batch_size": args.nonlinear_batch_size or None},
            tom=args.tom, max_resident_bytes=int(args.max_resident_gib * 2**30),
            progress=not args.no_progress)
    except (AnalysisError, RidgeInputError) as e:
        print(f"synclib analyze: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    res.to_netcdf(tmp)
    os.replace(tmp, out)
    print(f"wrote {out}")
    for c in res.condition.values:
        print(f"  SyncR2(A,B) {c}: {float(res.sync_r2_pair_mean.sel(condition=c)):.3f} "
              f"± {float(res.sync_r2_pair_se.sel(condition=c)):.3f}")
    return 0
