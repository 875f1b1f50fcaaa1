"""Hooked, batched generation that records last-prompt-token states.

The engine runs a :class:`~synclib.models.LoadedModel` over batches of prompts and
returns, for every prompt (a *row*), the output of every decoder layer at the last
prompt token (the position that produces the first new token), as float32 arrays of
shape ``(n_layers, d_model)``.  Nothing else of the sequence is kept.

Entry points
------------
:class:`Engine`
    Holds a model and the per-session key/value caches.  ``generate``, ``read_states``,
    ``sequence_logprobs`` and ``word_distributions`` all accept a *session* per row: an
    arbitrary hashable key (e.g. ``(task_index, sim_seed, agent, view)``) under which the
    keys/values of that row's prompt are kept; the next prompt of the same session only
    prefills the tokens after the longest common token prefix with the previous one, and a
    prompt of any session only those after the whole blocks (``block_size`` tokens) another
    session's prompt started with, which the two then hold once.
    Call :meth:`Engine.forget` when a session (episode) ends.
    ``sequence_logprobs`` scores multi-token candidates: the unnormalised log-probability
    of given token sequences after each prompt (the constrained judge's scores; it and a
    stream's probes feed them through one prefix-tree scorer, ``continuation_logprobs``);
    ``word_distributions`` builds normalised distributions over candidate words
    on it (the reference the ToM read-out's stream probes are tested against).
:class:`DecodeStream` (:meth:`Engine.stream`)
    Continuous batching: rows join a running decoding batch at any step and leave it at
    the step they end, so a dialog's next utterance need not wait for other rows' longer
    replies; the same per-row sampling and sessions as ``generate``.  Not refilled
    (``refill=False``), rows join only an empty batch and it decodes to its last row:
    ``generate``'s batches, bit for bit.  A row may carry a
    :class:`Probe`: token sequences scored at its prompt's end and after a marked token of its
    reply, over the stream's own keys/values (the ToM read-outs).
:func:`generate`, :func:`read_states`, :func:`word_distributions`
    One-shot wrappers around a fresh :class:`Engine` (no cache kept between calls).
:func:`row_seed`
    The sampling seed of a row from integer keys, e.g. ``row_seed(sim_seed, task, utterance)``.

One concept a module
--------------------
========================  ====================================================================
``requests``              :class:`Request`, :class:`Result`, :func:`row_seed`, each row's uniforms,
                          the vocabulary :data:`DECODE_MODES`
``forward``               the one model call (the cache keyword of the installed transformers)
``masks``                 attention windows and explicit masks (boolean or additive)
``sampling``              the sampling distribution, inverse-CDF sampling, stop and line checks,
                          a decoding batch's replies
``sessions``              the session caches: blocks shared by sessions, within their budget
``prefill``               the left-padded layout over cached prefixes, the hooked states,
                          prefill groups and their merge
``dynamic``               rows in one growing batch (the CPU's decoding), ``with_room``
``fixed``                 rows in fixed slots, each step one CUDA-graph replay on GPUs
``stream``                :class:`DecodeStream`
``probes``                :class:`Probe`: a stream row's read-outs scored inside the stream
``candidates``            prefix-tree scoring of candidate sequences, candidate words
``core``                  :class:`Engine` and the one-shot wrappers
========================  ====================================================================

How a batch is laid out, how rows sample and when they stop: :mod:`synclib.engine.prefill`
and :mod:`synclib.engine.sampling`.  A row's text depends only on its prompt and seed, not on
which other rows share its batch, up to float rounding: padding and cache reuse change the
logits by ~1e-5, which flips a draw when its uniform falls that close to a
cumulative-probability boundary (seen about once in a few hundred draws with SmolLM2; later
utterances of that dialog then differ too).  The same command on the same machine is exactly
reproducible.  A row stops at any of the model's stop tokens (EOS and end-of-turn,
``LoadedModel.stop_token_ids``) or after ``max_new_tokens``.

``torch`` and ``transformers`` are imported where they are used, so importing this package
loads neither.
"""
from synclib.engine.candidates import CandidateWords, candidate_sequences, continuation_logprobs
from synclib.engine.core import Engine, generate, read_states, word_distributions
from synclib.engine.dynamic import with_room
from synclib.engine.probes import Probe
from synclib.engine.requests import DECODE_MODES, Request, Result, row_seed
from synclib.engine.sampling import sampling_distribution
from synclib.engine.stream import DecodeStream

__all__ = ["DECODE_MODES", "sampling_distribution", "Engine", "DecodeStream", "Request", "Result",
           "generate", "read_states", "word_distributions", "row_seed", "candidate_sequences",
           "continuation_logprobs", "with_room", "Probe", "CandidateWords"]
