"""Activation cubes: crash-safe netCDF4 writing and lazy opening.

``schema``  dimensions, variables (:func:`var_name`), identity (:class:`CubeSpec`), file layout
``writer``  :class:`CubeWriter`: parts, then the finished file
``reader``  :func:`open_cube`, :class:`HiddenRows`

One cube per model pair (and condition set) holds, for every episode (task index) and simulation seed, both
agents' hidden states at the last prompt token of each of their utterances, the utterance texts and prompt
lengths, and the optional passive-reader and Theory-of-Mind variables (``book/architecture.md``, "The cube"):

=====================================  ==============================================
variable                               dims
=====================================  ==============================================
``hidden_a`` (``_passive``, ``_tom``)  episode, sim_seed, round, layer_a, dim_a (also ``_passive_own``)
``hidden_b`` (``_passive``, ``_tom``)  episode, sim_seed, round, layer_b, dim_b (also ``_passive_own``)
``text_a``, ``text_b`` (``_tom``)      episode, sim_seed, round   (``""`` unreached)
``prompt_len_a``, ``prompt_len_b``     episode, sim_seed, round   (``-1`` unreached)
``n_utterances`` (``_tom``)            episode, sim_seed
``emotion_a``, ``emotion_b``           episode, sim_seed, round, emotion
``action_a``, ``action_b``             episode, sim_seed, round, action
``passive_reader``                     episode, sim_seed   (persona id; ``""`` where not read)
=====================================  ==============================================

The ToM run adds ``prompt_len_a_tom``, ``prompt_len_b_tom``, ``n_utterances_tom``, ``tom_format_a`` and
``tom_format_b``.  Unreached rounds are NaN.  The attribute ``passive_seeds`` names the seeds the passive
reader read (cube v2; v1 cubes read every seed).

Crash safety
------------
A run writes *parts*: every finished batch of whole (episode, seed) *units* goes to
``PATH.parts/part-NNNNN.nc`` under a temporary name, fsynced and atomically renamed, so a part exists
completely or not at all, even after ``kill -9``.  A part may be written in a background thread
(:meth:`CubeWriter.submit_part`, one at a time; its error is re-raised in the caller's thread).  Parts are
keyed by id, in any order.  ``PATH.parts/spec.json`` records the run's settings; a re-run with the same
settings skips the units already in parts.  :meth:`CubeWriter.finalize` streams the parts into ``PATH.tmp``
one unit at a time, sets the global attribute ``complete = 1``, fsyncs, renames to ``PATH`` and removes the
parts.  :func:`open_cube` refuses any file without ``complete = 1``.

Storage
-------
Hidden states are float32 on disk, one (episode, seed) unit per chunk (``(1, 1, rounds, layers, dim)``;
4 MiB at 8 x 32 x 4096), zlib + shuffle.  ``store_dtype="float16"`` (``"bfloat16"``) keeps float32's range
but rounds the mantissa to 10 (7) bits, round-to-nearest-even ("bit rounding"), so the zeroed low bits
compress away: relative error at most 2**-11 (2**-8), and no overflow, unlike a cast to IEEE float16.
"""
from synclib.cube.reader import DEFAULT_RESIDENT_BYTES, READ_BATCH_BYTES, HiddenRows, open_cube
from synclib.cube.schema import (CUBE_VERSION, EPISODE_COORDS, STORE_DTYPES, VIEWS, CubeError, CubeSpec,
                                 IncompleteCubeError, StalePartsError, Unit, check_passive_seeds, cube_version, is_complete,
                                 parts_dir, var_name)
from synclib.cube.writer import CubeWriter, bitround

__all__ = [
    "CubeError", "IncompleteCubeError", "StalePartsError", "CubeSpec", "Unit", "CubeWriter", "EPISODE_COORDS", "STORE_DTYPES",
    "VIEWS", "var_name", "bitround", "open_cube", "is_complete", "parts_dir", "HiddenRows",
    "DEFAULT_RESIDENT_BYTES", "READ_BATCH_BYTES", "CUBE_VERSION", "cube_version", "check_passive_seeds",
]
