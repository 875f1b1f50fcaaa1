""":func:`analyze`: checks the options, runs the analysis blocks
(:mod:`synclib.analysis.blocks`) and merges their Datasets into one."""
from __future__ import annotations

import sys

import numpy as np
import xarray as xr
from tqdm import tqdm

from synclib import __version__
from synclib.analysis.blocks import (AGGREGATION, PERSONA_SPLIT_RULE, RELATIONSHIP_SOURCES, SHUFFLE_RULE,
                                     SPLIT_RULE, episode_draws, own_splits, conditions_block, nonlinear_block, paper_alpha_block, persona_block,
                                     relationship_block, sample_size_block, tom_block)
from synclib.analysis.context import Context
from synclib.analysis.planted import planted_block
from synclib.analysis.samples import AnalysisError, HiddenCache, build_dataset
from synclib.analysis.settings import AnalysisSettings
from synclib.analysis.surrogates import surrogate_block
from synclib.cube import var_name
from synclib.penalty import Penalty

__all__ = ["analyze", "analysis_split"]


def _check(cube) -> None:
    for v in (var_name("hidden", "a"), var_name("hidden", "b")):
        if v not in cube.variables:
            raise AnalysisError(f"the cube has no variable {v!r}; is it a synclib cube?")


def _skip_missing(cube, conditions: list, log) -> list:
    """Remove from ``conditions`` (in place) those whose variables the cube lacks (the passive readers); returns
    them."""
    gone = [c for c in ("passive", "passive_own")
            if c in conditions and var_name("hidden", "a", c) not in cube.variables]
    for c in gone:
        conditions.remove(c)
        log(f"note: the cube has no {var_name('hidden', 'a', c)} (its reader was not simulated); condition {c!r} skipped")
    return gone


def _label_aggregation(out: xr.Dataset) -> str:
    """Set each SyncR^2-type variable's ``aggregation`` attribute; returns them as ``name: rule`` lines."""
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
        **ctx.penalty.attrs(), "n_samples": -1 if ctx.n_samples is None else int(ctx.n_samples),
        "precision": ctx.precision,
        "model_a": str(cube.attrs.get("model_a", "")), "model_b": str(cube.attrs.get("model_b", "")),
        **{f"torch_dtype_{s}": str(cube.attrs.get(f"torch_dtype_{s}", "")) for s in "ab"},
        "n_layers_a": int(cube.sizes["layer_a"]), "n_layers_b": int(cube.sizes["layer_b"]),
        "n_episodes": int(cube.sizes["episode"]), "n_sim_seeds": int(cube.sizes["sim_seed"]),
        "notes": "\n".join(ctx.notes), "skipped_conditions": " ".join(skipped),
        "relationship_sources": " ".join(RELATIONSHIP_SOURCES) if relationship else "",
        "synclib_version": __version__,
    }


def analyze(cube, settings: AnalysisSettings | None = None, *, progress: bool = True, log=None,
            **options) -> xr.Dataset:
    """All SyncR^2 analyses of one cube (one model pair), in memory or dask-backed.

    Parameters
    ----------
    settings : AnalysisSettings, optional
        What to compute and how (default: its fields' defaults; from a run config:
        ``AnalysisSettings.from_config(cfg)``).
    progress : show a tqdm bar on stderr.
    log : callable for notes (default: print to stderr).
    **options : fields of ``settings`` to change (:meth:`AnalysisSettings.replace`: e.g. ``conditions=("genuine",)``,
        ``n_samples=None``, ``penalty="cv"`` or, in the config's spelling, ``alpha="cv"``), checked as the settings are.

    Returns the merge of the blocks' Datasets (:mod:`synclib.analysis.blocks`; book/architecture.md, "Analysis
    results"), its attributes recording the settings that shape the numbers (the penalty's:
    :meth:`synclib.penalty.Penalty.attrs`).
    """
    if settings is not None and not isinstance(settings, AnalysisSettings):
        raise AnalysisError(f"settings must be an AnalysisSettings (pass conditions=... by name), got {settings!r}")
    st = (settings or AnalysisSettings()).replace(**options) if options else (settings or AnalysisSettings())
    log = log or (lambda m: print(m, file=sys.stderr))
    conditions = st.all_conditions()
    split_seeds = list(st.split_seeds)
    _check(cube)
    skipped = _skip_missing(cube, conditions, log)
    ctx = Context(cube=cube, directions=st.directions, split_seeds=split_seeds, n_samples=st.n_samples,
                  penalty=st.penalty, device=st.device, precision=st.precision,
                  max_resident_bytes=st.max_resident_bytes, progress=progress, log=log,
                  arrays=HiddenCache(cube, st.max_resident_bytes), n_boot=st.n_boot)
    paper_alpha = "genuine" in conditions and not st.penalty.is_paper()
    nd_ns = len(st.directions) * len(split_seeds)
    # each condition's own fits, then both sides of each control's contrast with genuine
    contrasts = (2 * (len(conditions) - 1) + sum(c.startswith("lag") for c in conditions)  # lags: + size-matched
                 if "genuine" in conditions else 0)
    steps = nd_ns * (len(conditions) + contrasts + paper_alpha + bool(st.persona_disjoint) + len(st.sample_sizes or ()))
    ctx.bar = tqdm(total=steps, desc="SyncR^2 grids", disable=None if progress else True, file=sys.stderr)
    main = conditions_block(ctx, conditions, cka=st.cka)
    blocks = [main.dataset]
    if paper_alpha:
        blocks.append(paper_alpha_block(ctx, main.genuine))
    persona = None
    if st.persona_disjoint:
        block, persona = persona_block(ctx, main.genuine)
        blocks.append(block)
    if st.sample_sizes:
        blocks.append(sample_size_block(ctx, main.genuine, st.sample_sizes))
    ctx.bar.close()
    counts = episode_draws(cube.sizes["episode"], ctx.n_boot) if ctx.n_boot else None
    if st.surrogates:
        blocks.append(surrogate_block(ctx, main.genuine, st.surrogates, counts))
        if persona is not None:  # the same test under the persona-disjoint split (variables persona_disjoint_*)
            block = surrogate_block(ctx, persona, st.surrogates, counts)
            blocks.append(block.rename({v: f"persona_disjoint_{v}" for v in block.data_vars}))
    if st.planted:
        blocks.append(planted_block(ctx, main.genuine, st.planted))
    if st.relationship:
        blocks.append(relationship_block(ctx, main.genuine, st.relationship_seeds, st.relationship_min))
    if st.nonlinear:
        blocks.append(nonlinear_block(ctx, main.genuine, st.nonlinear_pairs, st.nonlinear_options,
                                      n_seeds=st.nonlinear_seeds, counts=counts))
    if st.tom:
        blocks.append(tom_block(ctx, st.tom_options))
    out = xr.merge(blocks, join="exact", combine_attrs="drop_conflicts")
    out.attrs.update(_attrs(ctx, skipped, st.relationship))
    out.attrs["aggregation"] = _label_aggregation(out)
    return out


def analysis_split(cube, analysis: xr.Dataset, direction: str, seed: int,
                   condition: str = "genuine") -> tuple[np.ndarray, np.ndarray]:
    """The training and test samples the analysis ``analysis`` of ``cube`` fitted ``condition`` on in ``direction``
    and split seed ``seed``: indices into ``build_dataset(cube, direction, condition)``, by the analysis' own rule
    (its ``n_samples`` attribute; :func:`synclib.analysis.blocks.own_splits`).  Raises :class:`AnalysisError` where
    that split could not be made (too few samples)."""
    n = int(analysis.attrs.get("n_samples", -1))
    ctx = Context(cube=cube, directions=(direction,), split_seeds=[int(seed)], n_samples=None if n < 0 else n,
                  penalty=Penalty.from_attrs(analysis.attrs), device=None, precision="float32", max_resident_bytes=None,
                  progress=False, log=lambda m: None, arrays=HiddenCache(cube))
    split = own_splits(ctx, build_dataset(cube, direction, condition, ctx.arrays))[0]
    if split is None:
        raise AnalysisError(f"{condition} {direction} split {seed}: no split (too few samples); see the analysis' notes")
    return split[0], split[1]
