"""Hooked, batched generation that records last-prompt-token states.

The engine runs a :class:`~synclib.models.LoadedModel` over batches of prompts and returns, for every prompt (a
*row*), the output of every decoder layer at the last prompt token (the position that produces the first new token),
as float32 arrays of shape ``(n_layers, d_model)``.  Nothing else of the sequence is kept.

Entry points
------------
:class:`Engine`
    Holds a model and its session caches.  A row may name a *session*, a hashable key such as
    ``(task_index, sim_seed, agent, view)``, under which its prompt's keys/values are kept for the next prompt that
    starts alike (:mod:`~synclib.engine.sessions`); call :meth:`Engine.forget` when a session ends.  ``generate``
    samples a reply per row, ``read_states`` only prefills (the passive reader), ``sequence_logprobs`` scores given
    token sequences after each prompt (the constrained judge).
:class:`DecodeStream` (:meth:`Engine.stream`)
    Continuous batching: rows join a running decoding batch at any step and leave it at the step they end; a row may
    carry a :class:`Probe` (the ToM read-outs, turned into distributions over words by :class:`CandidateWords`).
:func:`row_seed`
    The sampling seed of a row from integer keys, e.g. ``row_seed(sim_seed, task, utterance)``.

One concept a module
--------------------
================  ==================================================================================================
``requests``      :class:`Request`, :class:`Result`, :func:`row_seed`, each row's uniforms, :data:`DECODE_MODES`
``forward``       the one model call (the cache keyword of the installed transformers)
``masks``         attention windows and explicit masks (boolean or additive)
``sampling``      the sampling distribution, inverse-CDF sampling, stop and line checks
``sessions``      the session caches: blocks shared by sessions, within their budget
``prefill``       the left-padded layout over cached prefixes, the hooked states, prefill groups and their merge
``dynamic``       rows in one growing batch (the CPU's decoding), ``with_room``
``fixed``         rows in fixed slots, each step one CUDA-graph replay on GPUs
``stream``        :class:`DecodeStream`
``probes``        :class:`Probe`: a stream row's read-outs scored inside the stream
``candidates``    prefix-tree scoring of candidate sequences, candidate words
``core``          :class:`Engine`
================  ==================================================================================================

A row's text depends only on its prompt and seed, not on its batch, up to float rounding: padding and cache reuse
change the logits by ~1e-5, which flips a draw whose uniform falls that close to a cumulative-probability boundary.
The same command on the same machine is exactly reproducible.  A row stops at any of the model's stop tokens
(``LoadedModel.stop_token_ids``) or after ``max_new_tokens``.  ``torch`` and ``transformers`` are imported where
they are used, so importing this package loads neither.
"""
from synclib.engine.candidates import CandidateWords, candidate_sequences, continuation_logprobs
from synclib.engine.core import Engine
from synclib.engine.dynamic import with_room
from synclib.engine.probes import Probe
from synclib.engine.requests import DECODE_MODES, Request, Result, row_seed
from synclib.engine.sampling import sampling_distribution
from synclib.engine.stream import DecodeStream

__all__ = ["DECODE_MODES", "sampling_distribution", "Engine", "DecodeStream", "Request", "Result", "row_seed",
           "candidate_sequences", "continuation_logprobs", "with_room", "Probe", "CandidateWords"]
