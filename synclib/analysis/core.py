""":func:`analyze`: checks the options, runs the analysis blocks
(:mod:`synclib.analysis.blocks`) and merges their Datasets into one."""
from __future__ import annotations

import sys

import numpy as np
import xarray as xr
from tqdm import tqdm

from synclib import __version__
from synclib.analysis.blocks import (AGGREGATION, condition_splits, episode_draws, N_BOOT, PERSONA_SPLIT_RULE, RELATIONSHIP_SOURCES, SHUFFLE_RULE,
                                     SPLIT_RULE, conditions_block, nonlinear_block, paper_alpha_block, persona_block,
                                     relationship_block, sample_size_block, tom_block)
from synclib.analysis.context import Context
from synclib.analysis.surrogates import surrogate_block
from synclib.analysis.samples import (DEFAULT_CONDITIONS, DIRECTIONS, AnalysisError, HiddenCache, build_dataset,
                                      parse_condition)
from synclib.cube import var_name
from synclib.ridge import CV_GRID_RULE, DEFAULT_CV_ALPHAS, PAPER_ALPHA

__all__ = ["analyze", "analysis_split"]


def _conditions(conditions, lags) -> list:
    """The conditions to analyse: ``conditions`` with ``lags`` replacing its lag conditions."""
    conditions = list(conditions)
    if lags is not None:
        conditions = [c for c in conditions if not c.startswith("lag")] + [f"lag{int(j)}" for j in lags]
    for c in conditions:
        parse_condition(c)
    if not conditions:
        raise AnalysisError("conditions: nothing to analyse")
    return conditions


def _check(cube, conditions, split_seeds, directions, needs_genuine: bool) -> None:
    if not split_seeds:
        raise AnalysisError("split_seeds: at least one split seed is needed")
    if any(not 0 <= s < 2**32 for s in split_seeds):  # numpy.random.RandomState(seed), as the reference
        raise AnalysisError(f"split_seeds: seeds must be integers in 0 .. 2**32-1, got {list(split_seeds)}")
    for d in directions:
        if d not in DIRECTIONS:
            raise AnalysisError(f"directions: unknown direction {d!r}")
    for v in (var_name("hidden", "a"), var_name("hidden", "b")):
        if v not in cube.variables:
            raise AnalysisError(f"the cube has no variable {v!r}; is it a synclib cube?")
    if needs_genuine and "genuine" not in conditions:
        raise AnalysisError("persona_disjoint / relationship / sample_sizes / nonlinear / surrogates need the 'genuine' condition")


def _skip_missing(cube, conditions: list, log) -> list:
    """Remove from ``conditions`` (in place) those whose variables the cube lacks
    (passive); returns the removed ones."""
    if "passive" in conditions and var_name("hidden", "a", "passive") not in cube.variables:
        conditions.remove("passive")
        log("note: the cube has no passive-reader variables; condition 'passive' skipped")
        return ["passive"]
    return []


def _label_aggregation(out: xr.Dataset) -> str:
    """Set each SyncR^2-type variable's ``aggregation`` attribute; returns them joined,
    one ``name: rule`` per line, for the Dataset's attribute of the same name."""
    lines = []
    for name in out.data_vars:
        if name in AGGREGATION:
            out[name].attrs["aggregation"] = AGGREGATION[name]
            lines.append(f"{name}: {AGGREGATION[name]}")
    return "\n".join(lines)


def _attrs(ctx: Context, skipped: list, relationship: bool) -> dict:
    """The result's global attributes (all str or int)."""
    cube = ctx.cube
    return {
        "split_rule": SPLIT_RULE, "persona_split_rule": PERSONA_SPLIT_RULE, "shuffle_rule": SHUFFLE_RULE,
        "title": "synclib SyncR^2 analysis",
        "conventions": "synclib analysis v1 (see book/architecture.md)",
        "alpha": str(ctx.alpha), "n_samples": -1 if ctx.n_samples is None else int(ctx.n_samples),
        "equal_samples": int(ctx.equal_samples),
        **({"alpha_grid": np.asarray(DEFAULT_CV_ALPHAS), "alpha_grid_rule": CV_GRID_RULE}
           if isinstance(ctx.alpha, str) else {}),
        "precision": ctx.precision,
        "model_a": str(cube.attrs.get("model_a", "")), "model_b": str(cube.attrs.get("model_b", "")),
        "n_layers_a": int(cube.sizes["layer_a"]), "n_layers_b": int(cube.sizes["layer_b"]),
        "n_episodes": int(cube.sizes["episode"]), "n_sim_seeds": int(cube.sizes["sim_seed"]),
        "notes": "\n".join(ctx.notes), "skipped_conditions": " ".join(skipped),
        "relationship_sources": " ".join(RELATIONSHIP_SOURCES) if relationship else "",
        "synclib_version": __version__,
    }


def analyze(cube, conditions=DEFAULT_CONDITIONS, *, alpha=PAPER_ALPHA,
            n_samples: int | None = 6500, split_seeds=(0, 1, 2), lags=None, device=None,
            precision: str = "float32", directions=DIRECTIONS, persona_disjoint: bool = False,
            relationship: bool = False, relationship_seeds=(0, 1, 2), relationship_min: int = 10,
            sample_sizes=None, nonlinear: bool = False, nonlinear_pairs=None,
            nonlinear_options: dict | None = None, nonlinear_seeds: int | None = None, tom: bool = False, tom_options: dict | None = None,
            n_boot: int = N_BOOT, cka: bool = True, equal_samples: bool = False, surrogates: int = 0,
            max_resident_bytes: int | None = None, progress: bool = True, log=None) -> xr.Dataset:
    """All SyncR^2 analyses of one cube (one model pair).

    Parameters
    ----------
    cube : xarray.Dataset (cube schema), in memory or dask-backed.
    conditions : among ``genuine``, ``passive`` (needs the passive variables),
        ``shuffled`` (the reference's shuffled control: genuine samples, training
        targets permuted within each dialog), ``pseudo`` (ours: pseudo-dyads, the partner's
        states from a dialog the source agent did not take part in,
        :func:`synclib.analysis.samples.pseudo_partners`), ``lagJ``.  Conditions whose
        variables are missing are skipped with a note.
    alpha : ridge penalty (float) or ``"cv"`` (episode-grouped CV on each
        training set; the chosen alphas are in ``alpha``).  With a penalty other than the
        paper's (:data:`synclib.ridge.PAPER_ALPHA`) the genuine condition is also fitted at
        the paper's (``paper_alpha_*``, figure 8).
    n_samples : fixed sample size ``N`` per dataset (protocol: 6,500), split by the
        reference's rule (:func:`synclib.splits.episode_split`; fewer available: the test
        set takes ``>= N - int(0.8 N)`` and training all the rest); ``None`` = all.
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
        pairs per direction; default: each of 4 evenly spaced source layers with the
        target layer its affine map predicts best on a validation part of each split's
        training set, :func:`synclib.analysis.blocks.nonlinear_block`), options for
        :func:`synclib.analysis.mlp_r2`.
    nonlinear_seeds : fit the MLPs on the first this many split seeds only (the others'
        ``nonlinear_r2`` and ``affine_r2`` are NaN); None: all.
    tom, tom_options : also appendix J (see :func:`synclib.tom.tom_decode`).
    n_boot : resamples of whole episodes for the dialog-level tests (``sync_r2_boot``,
        :func:`synclib.analysis.blocks.episode_bootstrap`); 0: none.
    cka : also linear CKA of every layer pair on all samples of each condition's dataset
        (``cka``; :data:`synclib.analysis.blocks.CKA_RULE`).
    equal_samples : fit every condition at the smallest condition's training and test counts
        per direction and split seed (ours, :data:`synclib.analysis.blocks.EQUAL_RULE`), and
        each also on its own split of all its samples (``sync_r2_unmatched``); False: each
        condition on its own split, as the reference.
    surrogates : also genuine against this many surrogate partners per dialog (ours,
        :mod:`synclib.analysis.surrogates`: ``sync_r2_surrogate`` and, with ``n_boot``,
        ``surrogate_gap_boot``); 0: none.  Needs the genuine condition.
    max_resident_bytes : hidden-state variables up to this size (default
        ``synclib.cube.DEFAULT_RESIDENT_BYTES``, 2 GiB) are loaded whole; larger
        ones of a lazily opened cube stream from disk, each fit reading only the
        rows of its split (see :class:`synclib.cube.HiddenRows`).
    progress : show a tqdm bar on stderr.
    log : callable for notes (default: print to stderr).

    Returns
    -------
    xarray.Dataset (see book/architecture.md, "Analysis results"); the merge of the
    blocks' Datasets (:mod:`synclib.analysis.blocks`).
    """
    log = log or (lambda m: print(m, file=sys.stderr))
    conditions = _conditions(conditions, lags)
    split_seeds = [int(s) for s in split_seeds]
    _check(cube, conditions, split_seeds, directions,
           needs_genuine=bool(persona_disjoint or relationship or sample_sizes or nonlinear or surrogates))
    skipped = _skip_missing(cube, conditions, log)
    if int(n_boot) < 0:
        raise AnalysisError(f"n_boot must be >= 0, got {n_boot}")
    if int(surrogates) < 0:
        raise AnalysisError(f"surrogates must be >= 0, got {surrogates}")
    ctx = Context(cube=cube, directions=tuple(directions), split_seeds=split_seeds, n_samples=n_samples,
                  alpha=alpha, device=device, precision=precision, max_resident_bytes=max_resident_bytes,
                  progress=progress, log=log, arrays=HiddenCache(cube, max_resident_bytes), n_boot=int(n_boot),
                  equal_samples=bool(equal_samples))
    paper_alpha = "genuine" in conditions and (isinstance(alpha, str) or not np.allclose(alpha, PAPER_ALPHA))
    nd_ns = len(directions) * len(split_seeds)
    steps = nd_ns * (len(conditions) * (1 + bool(equal_samples)) + paper_alpha + bool(persona_disjoint)
                     + len(sample_sizes or ()))
    ctx.bar = tqdm(total=steps, desc="SyncR^2 grids", disable=None if progress else True, file=sys.stderr)
    main = conditions_block(ctx, conditions, cka=cka)
    blocks = [main.dataset]
    if paper_alpha:
        blocks.append(paper_alpha_block(ctx, main.genuine))
    if persona_disjoint:
        blocks.append(persona_block(ctx, main.genuine))
    if sample_sizes:
        blocks.append(sample_size_block(ctx, main.genuine, sample_sizes))
    ctx.bar.close()
    if surrogates:
        counts = episode_draws(cube.sizes["episode"], ctx.n_boot) if ctx.n_boot else None
        blocks.append(surrogate_block(ctx, main.genuine, int(surrogates), counts))
    if relationship:
        blocks.append(relationship_block(ctx, main.genuine, relationship_seeds, relationship_min))
    if nonlinear:
        blocks.append(nonlinear_block(ctx, main.genuine, nonlinear_pairs, nonlinear_options,
                                      n_seeds=nonlinear_seeds))
    if tom:
        blocks.append(tom_block(ctx, tom_options))
    out = xr.merge(blocks, join="exact", combine_attrs="drop_conflicts")
    out.attrs.update(_attrs(ctx, skipped, relationship))
    out.attrs["aggregation"] = _label_aggregation(out)
    return out


def analysis_split(cube, analysis: xr.Dataset, direction: str, seed: int,
                   condition: str = "genuine") -> tuple[np.ndarray, np.ndarray]:
    """The training and test samples the analysis ``analysis`` of ``cube`` fitted ``condition``
    on in ``direction`` and split seed ``seed``: indices into
    ``build_dataset(cube, direction, condition)``, by the analysis' own rule (its conditions,
    ``n_samples`` and ``equal_samples`` attributes; :func:`synclib.analysis.blocks.condition_splits`).

    Raises
    ------
    AnalysisError
        That split could not be made (too few samples).
    """
    n = int(analysis.attrs.get("n_samples", -1))
    conditions = [str(c) for c in analysis["condition"].values]
    ctx = Context(cube=cube, directions=(direction,), split_seeds=[int(seed)], n_samples=None if n < 0 else n,
                  alpha=0.0, device=None, precision="float32", max_resident_bytes=None, progress=False,
                  log=lambda m: None, arrays=HiddenCache(cube), equal_samples=bool(analysis.attrs.get("equal_samples", 0)))
    splits = condition_splits(ctx, [build_dataset(cube, direction, c, ctx.arrays) for c in conditions])
    split = splits[conditions.index(condition)][0]
    if split is None:
        raise AnalysisError(f"{condition} {direction} split {seed}: no split (too few samples); see the analysis' notes")
    return split[0], split[1]
