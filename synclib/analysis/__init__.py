"""SyncR^2 from an activation cube: datasets, splits, controls, sensitivity (the paper's sections 3.2-3.3,
appendices B-E, G, I, J).

:func:`analyze` pairs hidden states into datasets per condition and direction (:mod:`synclib.analysis.samples`),
splits them by whole episodes with the reference's rule (:func:`synclib.splits.episode_split`; ``split_short`` where
the cube holds fewer than ``N`` samples; a persona-disjoint variant is ours), fits ridge maps for every layer pair
(:func:`synclib.analysis.ridge.r2_grid`: test and training R^2) and aggregates SyncR^2 over split seeds as the
reference does (:mod:`synclib.analysis.scores`; per-seed scores kept as ``*_per_seed``).  It returns an
``xarray.Dataset`` (book/architecture.md, "Analysis results"); ``synclib analyze`` (:mod:`synclib.cli.analyze`)
writes it to netCDF.
Modules
-------
``samples``  paired samples of one condition and direction (index arithmetic), persona keys
``scores``   SyncR^2, its variants and standard error from R^2 grids (seed aggregation)
``mlp``      the two-layer MLP comparator (appendix I)
``cka``      linear CKA per layer pair (ours: a second measure, nothing fitted)
``context``  what the blocks share: settings, notes, the ridge fit of one split
``contrasts`` every control against genuine on the samples both hold (ours)
``surrogates`` genuine against surrogate partners, each with its own penalty (ours)
``blocks``   one function per analysis block, each returning an ``xarray.Dataset``
``settings`` :class:`AnalysisSettings`: analyze's options, checked once; ``from_config``
``core``     :func:`analyze`: runs the blocks, merges their Datasets
``ridge``    ridge maps and their R² grids: ridge_solve, r2_grid (GridFit), the CV penalty's solver
``tom``      Theory-of-Mind probes (appendix J): tom_decode, tom_dataset, kl_divergence
``power``    paired tests of the controls and settings, detectable sizes, surrogate_test, planted_power
``planted``  differences planted in a run's own states, on re-splits (the power page's curve)
``sizing``   a run's training samples per dataset against the measured sample curves (numpy only)
``results``  load_results -> Results: a results directory's analyses, judge tables and claims, looked up
``tables``   the figures' tidy tables (a base of Results)
``claims``   the paper's claims judged once per run, and the tests behind them (claims.json)
``dialogs``  the dialogs of a cube as the simulator stored them, with their tasks and judge scores
"""
import importlib

#: the analysis files' format, in the analyze job's fingerprint: raised when the same settings write other files
ANALYSIS_FORMAT = 5

#: where each public name lives; a name is imported when first used, so that the light modules of
#: this package (``sizing``, ``settings``) load without torch for the config and the dry run
_NAMES = {
    "RELATIONSHIP_SOURCES": "synclib.analysis.blocks",
    "cka_grid": "synclib.analysis.cka",
    "linear_cka": "synclib.analysis.cka",
    "analyze": "synclib.analysis.core",
    "MLPOptions": "synclib.analysis.mlp",
    "mlp_r2": "synclib.analysis.mlp",
    "DIRECTIONS": "synclib.analysis.samples",
    "AnalysisError": "synclib.analysis.samples",
    "PairedSamples": "synclib.analysis.samples",
    "build_dataset": "synclib.analysis.samples",
    "parse_condition": "synclib.analysis.samples",
    "persona_keys": "synclib.analysis.samples",
    "shuffle_training_targets": "synclib.analysis.samples",
    "sim_seed_rank": "synclib.analysis.samples",
    "SeedAggregate": "synclib.analysis.scores",
    "seed_aggregate": "synclib.analysis.scores",
    "sync_r2": "synclib.analysis.scores",
    "sync_r2_noclip": "synclib.analysis.scores",
    "sync_r2_se": "synclib.analysis.scores",
    "sync_r2_topk": "synclib.analysis.scores",
    "AnalysisSettings": "synclib.analysis.settings",
}


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ANALYSIS_FORMAT", "analyze", "AnalysisSettings", "MLPOptions", "AnalysisError", "PairedSamples", "build_dataset", "parse_condition", "persona_keys",
    "shuffle_training_targets", "sim_seed_rank", "sync_r2", "sync_r2_topk", "sync_r2_noclip", "sync_r2_se",
    "seed_aggregate", "SeedAggregate", "mlp_r2", "DIRECTIONS", "RELATIONSHIP_SOURCES", "linear_cka", "cka_grid",
]
