"""SyncR^2 from an activation cube: datasets, splits, controls, sensitivity.

Protocol (``../shared/protocol.md``; paper sections 3.2-3.3, appendices B-E, G, I, J):

* datasets, with rounds ``k`` (see book/architecture.md): A->B pairs
  ``(hidden_a[k], hidden_b[k])``; B->A ``(hidden_b[k], hidden_a[k+1])``; lag ``j``:
  A->B ``(hidden_a[k], hidden_b[k+j])``, B->A ``(hidden_b[k], hidden_a[k+1+j])``;
  passive: the ``_passive`` source with the genuine target.  Samples whose source or
  target is not finite (unreached rounds) are dropped.
* split (per split seed, :func:`synclib.ridge.episode_split`): shuffle episodes, whole
  episodes to the test set until it holds >= 20 % of ``n_samples``, then to the
  training set until it holds >= 80 %.  A cube with fewer samples is used whole,
  still 80/20 by episodes (recorded).  The persona-disjoint variant assigns whole
  (unordered) agent pairs instead.
* ridge (:func:`synclib.ridge.r2_grid`) for every layer pair; SyncR^2 = mean over
  source layers of ``max(0, max over target layers of R^2)``.
* summaries over split seeds: :func:`synclib.stats.mean_se` (standard error NaN for a
  single seed).

:func:`analyze` returns everything as an ``xarray.Dataset`` (schema in
book/architecture.md, "Analysis results"); ``synclib analyze`` writes it to netCDF.

Modules
-------
``samples``  paired samples of one condition and direction (index arithmetic), persona keys
``scores``   SyncR^2 and its variants from one R^2 grid
``mlp``      the two-layer MLP comparator (appendix I)
``context``  what the blocks share: settings, notes, the ridge fit of one split
``blocks``   one function per analysis block, each returning an ``xarray.Dataset``
``core``     :func:`analyze`: checks the options, runs the blocks, merges their Datasets
``cli``      ``synclib analyze``
"""
from synclib.analysis.blocks import RELATIONSHIP_SOURCES
from synclib.analysis.cli import configure_parser, run
from synclib.analysis.core import analyze
from synclib.analysis.mlp import mlp_r2
from synclib.analysis.samples import (DIRECTIONS, AnalysisError, PairedSamples, build_dataset, parse_condition,
                                      persona_keys)
from synclib.analysis.scores import sync_r2, sync_r2_noclip, sync_r2_topk

__all__ = [
    "analyze", "AnalysisError", "PairedSamples", "build_dataset", "parse_condition", "persona_keys",
    "sync_r2", "sync_r2_topk", "sync_r2_noclip", "mlp_r2", "DIRECTIONS", "RELATIONSHIP_SOURCES",
    "configure_parser", "run",
]
