"""SyncR^2 from an activation cube: datasets, splits, controls, sensitivity.

Protocol (the paper's sections 3.2-3.3, appendices B-E, G, I, J):

* datasets, with rounds ``k`` (see book/architecture.md): A->B pairs
  ``(hidden_a[k], hidden_b[k])``; B->A ``(hidden_b[k], hidden_a[k+1])``; lag ``j``:
  A->B ``(hidden_a[k], hidden_b[k+j])``, B->A ``(hidden_b[k], hidden_a[k+1+j])``;
  passive: the ``_passive`` source with the genuine target; shuffled: the genuine
  samples with the training targets permuted within each dialog (the reference's
  control).  Samples whose source or target is not finite (unreached rounds) are dropped.
* split (per split seed, :func:`synclib.splits.episode_split`), the reference's rule:
  ``RandomState(seed).permutation`` over all cube episodes; whole episodes to the test
  set until it holds ``>= N - int(0.8 N)`` samples, then to the training set until it
  holds ``>= int(0.8 N)`` or the episodes run out (a cube with fewer than ``N``
  samples: training = all the rest; recorded in ``split_short``).  The
  persona-disjoint variant (ours) assigns whole (unordered) agent pairs instead.
* ridge (:func:`synclib.ridge.r2_grid`) for every layer pair: test and training R^2.
* SyncR^2 as the reference aggregates it (:mod:`synclib.analysis.scores`): grids
  averaged over split seeds first, then per source layer the best target layer, clip
  at 0, mean over source layers; its standard error from the variance over split
  seeds at the chosen target.  The per-seed scores are kept (``*_per_seed``).

:func:`analyze` returns everything as an ``xarray.Dataset`` (schema in
book/architecture.md, "Analysis results"); ``synclib analyze`` (:mod:`synclib.cli.analyze`)
writes it to netCDF.

Modules
-------
``samples``  paired samples of one condition and direction (index arithmetic), persona keys
``scores``   SyncR^2, its variants and standard error from R^2 grids (seed aggregation)
``mlp``      the two-layer MLP comparator (appendix I)
``cka``      linear CKA per layer pair (ours: a second measure, nothing fitted)
``context``  what the blocks share: settings, notes, the ridge fit of one split
``blocks``   one function per analysis block, each returning an ``xarray.Dataset``
``core``     :func:`analyze`: checks the options, runs the blocks, merges their Datasets
"""
from synclib.analysis.blocks import RELATIONSHIP_SOURCES
from synclib.analysis.cka import cka_grid, linear_cka
from synclib.analysis.core import analyze
from synclib.analysis.mlp import mlp_r2
from synclib.analysis.samples import (DIRECTIONS, AnalysisError, PairedSamples, build_dataset, parse_condition,
                                      persona_keys, shuffle_training_targets, sim_seed_rank)
from synclib.analysis.scores import SeedAggregate, seed_aggregate, sync_r2, sync_r2_noclip, sync_r2_se, sync_r2_topk

__all__ = [
    "analyze", "AnalysisError", "PairedSamples", "build_dataset", "parse_condition", "persona_keys",
    "shuffle_training_targets", "sim_seed_rank", "sync_r2", "sync_r2_topk", "sync_r2_noclip", "sync_r2_se",
    "seed_aggregate", "SeedAggregate", "mlp_r2", "DIRECTIONS", "RELATIONSHIP_SOURCES", "linear_cka", "cka_grid",
]
