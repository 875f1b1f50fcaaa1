"""The analysis blocks: one function per block, each returning an ``xarray.Dataset``
(:func:`conditions_block` returns it together with the genuine fits).

==========================  ===============================================  ==============
block                       what                                             paper
==========================  ===============================================  ==============
:func:`conditions_block`    genuine and controls (passive, lags): grids,     3.3, figs 2-4,
                            SyncR^2, top-k, unclipped, summaries             app. C
:func:`persona_block`       genuine, persona-disjoint split                  table 2
:func:`sample_size_block`   genuine at smaller sample sizes                  app. D
:func:`relationship_block`  genuine maps scored on test subsets by           app. G
                            relationship
:func:`nonlinear_block`     MLP against the affine map on a few layer pairs  app. I
:func:`tom_block`           Theory-of-Mind decoding                          app. J
==========================  ===============================================  ==============

:func:`conditions_block` runs first; the others re-use its genuine fits
(:class:`~synclib.analysis.context.GenuineFits`).  Variables, dims and coordinates
are documented in book/architecture.md ("Analysis results").
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from synclib.analysis.context import Context, GenuineFits, SplitFit
from synclib.analysis.mlp import mlp_defaults, mlp_r2
from synclib.analysis.samples import PairedSamples, build_dataset, persona_keys
from synclib.analysis.scores import sync_r2, sync_r2_noclip, sync_r2_topk
from synclib.ridge import RidgeInputError, episode_split, r2_grid_subsets
from synclib.scenarios import RELATIONSHIPS
from synclib.stats import mean_se
from synclib.tom import tom_decode

__all__ = ["conditions_block", "persona_block", "sample_size_block", "relationship_block",
           "nonlinear_block", "tom_block", "Conditions", "RELATIONSHIP_SOURCES"]

#: appendix G: only these scenario sources enter the relationship analysis
RELATIONSHIP_SOURCES = ("social_iqa", "social_chemistry", "normbank")


def _mean_se_vars(name: str, values: np.ndarray, dims: tuple) -> dict:
    """``{name}_mean`` and ``{name}_se`` over the last axis of ``values`` (split seeds),
    as Dataset variables with ``dims`` (those of ``values`` without the last)."""
    m, se = mean_se(values, axis=-1)
    return {f"{name}_mean": (dims, m), f"{name}_se": (dims, se)}


def _coords(ctx: Context, **more) -> dict:
    return {"direction": list(ctx.directions), "split_seed": ctx.split_seeds, **more}


# --------------------------------------------------------------------------- genuine and controls
@dataclass
class Conditions:
    """What :func:`conditions_block` returns: its Dataset and the genuine fits."""
    dataset: xr.Dataset
    genuine: GenuineFits


@dataclass
class _ConditionArrays:
    """The arrays of the conditions block; dims (C, Dir, S) = (condition, direction, split_seed)."""
    r2: np.ndarray          # (C, Dir, S, L, L), L = max(L_A, L_B); NaN padded
    alpha: np.ndarray       # (C, Dir, S, L)
    sync_r2: np.ndarray     # (C, Dir, S)
    noclip: np.ndarray      # (C, Dir, S)
    topk: np.ndarray        # (C, Dir, S, L)
    n_train: np.ndarray     # (C, Dir, S) int
    n_test: np.ndarray      # (C, Dir, S) int
    n_available: np.ndarray  # (C, Dir) int

    @classmethod
    def empty(cls, shape: tuple, n_layers: int) -> "_ConditionArrays":
        return cls(np.full(shape + (n_layers, n_layers), np.nan), np.full(shape + (n_layers,), np.nan),
                   np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape + (n_layers,), np.nan),
                   np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64),
                   np.zeros(shape[:2], dtype=np.int64))

    def record(self, at: tuple, fit: SplitFit) -> None:
        """Store one fit at ``at = (condition, direction, split seed)`` positions."""
        Ls, Lt = fit.r2.shape
        self.r2[at + (slice(0, Ls), slice(0, Lt))] = fit.r2
        self.alpha[at + (slice(0, Ls),)] = fit.alpha
        self.sync_r2[at] = sync_r2(fit.r2)
        self.noclip[at] = sync_r2_noclip(fit.r2)
        self.topk[at + (slice(0, Lt),)] = [sync_r2_topk(fit.r2, k) for k in range(1, Lt + 1)]
        self.n_train[at], self.n_test[at] = len(fit.train), len(fit.test)

    def to_dataset(self, ctx: Context, conditions: list) -> xr.Dataset:
        L = self.r2.shape[-1]
        cds = ("condition", "direction", "split_seed")
        pair = self.sync_r2.mean(axis=1)  # SyncR^2(A, B) per split seed: mean of the two directions
        return xr.Dataset(
            {
                "r2": (cds + ("src_layer", "tgt_layer"), self.r2),
                "alpha": (cds + ("src_layer",), self.alpha),
                "sync_r2": (cds, self.sync_r2),
                "sync_r2_noclip": (cds, self.noclip),
                "sync_r2_topk": (cds + ("k",), self.topk),
                "n_train": (cds, self.n_train),
                "n_test": (cds, self.n_test),
                "n_available": (cds[:2], self.n_available),
                **_mean_se_vars("sync_r2", self.sync_r2, cds[:2]),
                "sync_r2_pair": (("condition", "split_seed"), pair),
                **_mean_se_vars("sync_r2_pair", pair, ("condition",)),
                **_mean_se_vars("sync_r2_topk", self.topk.transpose(0, 1, 3, 2), cds[:2] + ("k",)),
            },
            coords={"condition": conditions, **_coords(ctx), "src_layer": np.arange(L),
                    "tgt_layer": np.arange(L), "k": np.arange(1, L + 1)},
        )


def _fit_splits(ctx: Context, samples: PairedSamples) -> list:
    """One fit per split seed of ``ctx`` (None where the split is not possible)."""
    label = f"{samples.condition} {samples.direction}"
    if ctx.n_samples is not None and samples.n < ctx.n_samples:
        ctx.note(f"{label}: the cube holds {samples.n} samples, fewer than n_samples={ctx.n_samples}; "
                 f"using all of them, split 80/20 by episodes")
    fits = []
    for seed in ctx.split_seeds:
        try:
            tr, te, _ = episode_split(samples.episode, ctx.n_samples, seed)
        except RidgeInputError as exc:  # too few episodes for this condition
            ctx.note(f"{label} split {seed}: not fitted ({exc}); left NaN")
            fits.append(None)
        else:
            fits.append(ctx.fit(samples, seed, tr, te, f"{label} split {seed}"))
        ctx.bar.update(1)
    return fits


def conditions_block(ctx: Context, conditions: list) -> Conditions:
    """The genuine condition and its controls: an R^2 grid per (condition, direction,
    split seed), its SyncR^2, unclipped and top-k scores, and their means and
    standard errors over split seeds.

    Parameters
    ----------
    ctx : Context
    conditions : list of str
        ``genuine``, ``passive``, ``lagJ``, whose variables the cube has.

    Returns
    -------
    Conditions
        ``dataset``: ``r2`` (condition, direction, split_seed, src_layer, tgt_layer),
        ``alpha`` (..., src_layer), ``sync_r2``, ``sync_r2_noclip``, ``n_train``,
        ``n_test`` (condition, direction, split_seed), ``sync_r2_topk`` (..., k),
        ``n_available`` (condition, direction), ``sync_r2_pair`` (condition,
        split_seed) and the ``_mean``/``_se`` summaries over split seeds;
        ``genuine``: the genuine fits, for the other blocks.
    """
    shape = (len(conditions), len(ctx.directions), len(ctx.split_seeds))
    arrays = _ConditionArrays.empty(shape, max(ctx.cube.sizes["layer_a"], ctx.cube.sizes["layer_b"]))
    genuine = GenuineFits()
    for di, d in enumerate(ctx.directions):
        for ci, c in enumerate(conditions):
            samples = build_dataset(ctx.cube, d, c, ctx.arrays)
            arrays.n_available[ci, di] = samples.n
            fits = _fit_splits(ctx, samples)
            for si, fit in enumerate(fits):
                if fit is not None:
                    arrays.record((ci, di, si), fit)
            if c == "genuine":
                genuine.samples[d] = samples
                genuine.fits.update({(d, f.seed): f for f in fits if f is not None})
            if c.endswith("passive"):  # not needed again: free it
                ctx.arrays.drop(samples.info["source_var"])
    return Conditions(arrays.to_dataset(ctx, conditions), genuine)


# --------------------------------------------------------------------------- table 2, appendix D
def persona_block(ctx: Context, genuine: GenuineFits) -> xr.Dataset:
    """Table 2: genuine SyncR^2 with a persona-disjoint split (whole unordered agent
    pairs go to the training or the test set).

    Parameters
    ----------
    ctx : Context
    genuine : GenuineFits
        Its samples per direction.

    Returns
    -------
    xarray.Dataset
        ``persona_disjoint_sync_r2``, ``persona_disjoint_n_train``,
        ``persona_disjoint_n_test`` (direction, split_seed).
    """
    keys = persona_keys(ctx.cube)
    shape = (len(ctx.directions), len(ctx.split_seeds))
    v = np.full(shape, np.nan)
    ntr = np.zeros(shape, dtype=np.int64)
    nte = np.zeros(shape, dtype=np.int64)
    for di, d in enumerate(ctx.directions):
        samples = genuine.samples[d]
        for si, seed in enumerate(ctx.split_seeds):
            tr, te, _ = episode_split(keys[samples.episode], ctx.n_samples, seed)
            v[di, si] = sync_r2(ctx.fit(samples, seed, tr, te, f"persona-disjoint {d} split {seed}").r2)
            ntr[di, si], nte[di, si] = len(tr), len(te)
            ctx.bar.update(1)
    dims = ("direction", "split_seed")
    return xr.Dataset({"persona_disjoint_sync_r2": (dims, v), "persona_disjoint_n_train": (dims, ntr),
                       "persona_disjoint_n_test": (dims, nte)}, coords=_coords(ctx))


def sample_size_block(ctx: Context, genuine: GenuineFits, sample_sizes) -> xr.Dataset:
    """Appendix D: genuine SyncR^2 at smaller sample sizes.

    Parameters
    ----------
    ctx : Context
    genuine : GenuineFits
        Its samples per direction.
    sample_sizes : sequence of int
        Total samples (train + test) of each fit; NaN and a note where the cube
        has fewer.

    Returns
    -------
    xarray.Dataset
        ``sample_size_sync_r2`` and ``sample_size_n_used`` (sample_size, direction,
        split_seed).
    """
    sizes = [int(s) for s in sample_sizes]
    shape = (len(sizes), len(ctx.directions), len(ctx.split_seeds))
    v = np.full(shape, np.nan)
    used = np.zeros(shape, dtype=np.int64)
    for zi, size in enumerate(sizes):
        for di, d in enumerate(ctx.directions):
            samples = genuine.samples[d]
            for si, seed in enumerate(ctx.split_seeds):
                if size > samples.n:
                    ctx.note(f"sample size {size} > available {samples.n} ({d}); left NaN")
                else:
                    tr, te, _ = episode_split(samples.episode, size, seed)
                    v[zi, di, si] = sync_r2(ctx.fit(samples, seed, tr, te, f"sample size {size} {d} split {seed}").r2)
                    used[zi, di, si] = len(tr) + len(te)
                ctx.bar.update(1)
    dims = ("sample_size", "direction", "split_seed")
    return xr.Dataset({"sample_size_sync_r2": (dims, v), "sample_size_n_used": (dims, used)},
                      coords=_coords(ctx, sample_size=sizes))


# --------------------------------------------------------------------------- appendix G
def _test_by_relationship(ctx: Context, fit: SplitFit, codes: list) -> list:
    """The fit's test samples from :data:`RELATIONSHIP_SOURCES`, one index array per
    relationship code in ``codes``."""
    episode = fit.samples.episode
    rels = np.asarray(ctx.cube["relationship"].values).astype(int)
    srcs = np.asarray(ctx.cube["source"].values).astype(str)
    te = fit.test[np.isin(srcs[episode[fit.test]], RELATIONSHIP_SOURCES)]
    return [te[rels[episode[te]] == code] for code in codes]


def _subset_scores(ctx: Context, fit: SplitFit, groups: list, size: int, seeds) -> np.ndarray:
    """SyncR^2 of the fit's maps on a random ``size``-sample subset of each test group,
    per subsampling seed: (len(seeds), len(groups))."""
    subsets = []
    for q in seeds:
        rng = np.random.default_rng([int(fit.seed), int(q)])
        subsets += [rng.choice(g, size, replace=False) for g in groups]
    # read the rows once: training rows and all subsets, positions into them
    rows = np.concatenate([fit.train] + subsets)
    uniq, inv = np.unique(rows, return_inverse=True)
    X, Y = fit.samples.take(uniq)
    pos = np.split(inv, np.cumsum([len(fit.train)] + [len(s) for s in subsets])[:-1])
    grids = r2_grid_subsets(X, Y, pos[0], pos[1:], fit.alpha, device=ctx.device)
    return np.array([sync_r2(g) for g in grids]).reshape(len(seeds), len(groups))


def relationship_block(ctx: Context, genuine: GenuineFits, seeds=(0, 1, 2), min_samples: int = 10) -> xr.Dataset:
    """Appendix G: the genuine maps scored on equal-sized test subsets per relationship.

    Test samples from :data:`RELATIONSHIP_SOURCES` are split by relationship
    (:data:`synclib.scenarios.RELATIONSHIPS`, in code order); relationships with at
    least ``min_samples`` of them are subsampled to the size of the smallest, the
    others stay NaN.

    Parameters
    ----------
    ctx : Context
    genuine : GenuineFits
        Its fits (maps, penalties, splits).
    seeds : sequence of int
        Subsampling seeds.
    min_samples : int
        Fewest test samples of a relationship that enter.

    Returns
    -------
    xarray.Dataset
        ``relationship_sync_r2`` (relationship, direction, split_seed,
        relationship_seed), ``relationship_subset_size`` (direction, split_seed),
        ``relationship_sync_r2_mean``/``_se`` (relationship, direction: mean over
        the subsampling seeds, then mean and standard error over split seeds).
    """
    codes = sorted(RELATIONSHIPS)
    v = np.full((len(codes), len(ctx.directions), len(ctx.split_seeds), len(seeds)), np.nan)
    size = np.zeros((len(ctx.directions), len(ctx.split_seeds)), dtype=np.int64)
    for di, d in enumerate(ctx.directions):
        for si, seed in enumerate(ctx.split_seeds):
            fit = genuine.fits.get((d, seed))
            if fit is None:  # the genuine split failed (noted there)
                continue
            by_rel = _test_by_relationship(ctx, fit, codes)
            present = [i for i, t in enumerate(by_rel) if len(t) >= min_samples]
            if not present:
                ctx.note(f"relationship {d} seed {seed}: no relationship has >= {min_samples} "
                         f"test samples from {RELATIONSHIP_SOURCES}")
                continue
            size[di, si] = min(len(by_rel[i]) for i in present)
            scores = _subset_scores(ctx, fit, [by_rel[i] for i in present], size[di, si], seeds)
            v[present, di, si, :] = scores.T
    dims = ("relationship", "direction", "split_seed", "relationship_seed")
    return xr.Dataset(
        {"relationship_sync_r2": (dims, v), "relationship_subset_size": (dims[1:3], size),
         **_mean_se_vars("relationship_sync_r2", v.mean(axis=3), dims[:2])},
        coords=_coords(ctx, relationship=[RELATIONSHIPS[c] for c in codes], relationship_seed=list(seeds)))


# --------------------------------------------------------------------------- appendix I
def _layer_pairs(genuine: GenuineFits, direction: str, seed: int, pairs) -> list:
    """The (source, target) layer pairs of the MLP comparison in ``direction``: ``pairs``
    (a list, or a dict by direction), or each of 4 evenly spaced source layers with its
    best affine target layer on split ``seed``."""
    if pairs is not None:
        return [tuple(map(int, p)) for p in (pairs[direction] if isinstance(pairs, dict) else pairs)]
    fit = genuine.fits.get((direction, seed))
    if fit is None:
        return []
    g = fit.r2
    sources = np.unique(np.linspace(0, g.shape[0] - 1, min(4, g.shape[0])).round().astype(int))
    return [(int(l), int(np.nanargmax(g[l]))) for l in sources if np.isfinite(g[l]).any()]


def nonlinear_block(ctx: Context, genuine: GenuineFits, pairs=None, options: dict | None = None) -> xr.Dataset:
    """Appendix I: a 2-layer MLP against the affine map, on the genuine splits, for a
    few layer pairs.

    Parameters
    ----------
    ctx : Context
    genuine : GenuineFits
        Its fits (splits and affine R^2).
    pairs : list of (int, int), dict of them by direction, or None
        (source, target) layer pairs; None: see :func:`_layer_pairs`.
    options : dict, optional
        Keywords of :func:`~synclib.analysis.mlp.mlp_r2`.

    Returns
    -------
    xarray.Dataset
        ``nonlinear_r2`` and ``affine_r2`` (direction, split_seed, layer_pair),
        ``nonlinear_src_layer`` and ``nonlinear_tgt_layer`` (direction, layer_pair;
        -1 pads directions with fewer pairs), attribute ``nonlinear_options``.
    """
    opts = dict(options or {})
    by_dir = [_layer_pairs(genuine, d, ctx.split_seeds[0], pairs) for d in ctx.directions]
    nd, ns, npair = len(ctx.directions), len(ctx.split_seeds), max([len(p) for p in by_dir] + [0])
    nl = np.full((nd, ns, npair), np.nan)
    af = np.full((nd, ns, npair), np.nan)
    layers = np.full((2, nd, npair), -1, dtype=np.int64)  # source, target
    bar = tqdm(total=nd * ns * npair, desc="nonlinear maps", disable=not ctx.progress, file=sys.stderr)
    for di, d in enumerate(ctx.directions):
        for si, seed in enumerate(ctx.split_seeds):
            fit = genuine.fits.get((d, seed))
            for pi, (ls, lt) in enumerate(by_dir[di] if fit is not None else []):
                layers[:, di, pi] = ls, lt
                s = fit.samples
                nl[di, si, pi] = mlp_r2(s.X[s.x_rows[fit.train], ls], s.Y[s.y_rows[fit.train], lt],
                                        s.X[s.x_rows[fit.test], ls], s.Y[s.y_rows[fit.test], lt],
                                        seed=seed, device=ctx.device, **opts)
                af[di, si, pi] = fit.r2[ls, lt]
                bar.update(1)
    bar.close()
    ds = xr.Dataset(
        {"nonlinear_src_layer": (("direction", "layer_pair"), layers[0]),
         "nonlinear_tgt_layer": (("direction", "layer_pair"), layers[1]),
         "nonlinear_r2": (("direction", "split_seed", "layer_pair"), nl),
         "affine_r2": (("direction", "split_seed", "layer_pair"), af)},
        coords=_coords(ctx, layer_pair=np.arange(npair)))
    ds.attrs["nonlinear_options"] = repr({**mlp_defaults(), **opts})
    return ds


# --------------------------------------------------------------------------- appendix J
def tom_block(ctx: Context, options: dict | None = None) -> xr.Dataset:
    """Appendix J: Theory-of-Mind decoding on the split seeds of ``ctx``.

    Parameters
    ----------
    ctx : Context
    options : dict, optional
        Other keywords of :func:`synclib.tom.tom_decode`.

    Returns
    -------
    xarray.Dataset
        That of :func:`synclib.tom.tom_decode`; empty (and a note) when the cube has
        too few ToM samples to split.
    """
    try:
        return tom_decode(ctx.cube, split_seeds=ctx.split_seeds, device=ctx.device, progress=ctx.progress,
                          max_resident_bytes=ctx.max_resident_bytes, **(options or {}))
    except RidgeInputError as exc:  # too few ToM samples
        ctx.note(f"ToM decoding: not done ({exc})")
        return xr.Dataset()
