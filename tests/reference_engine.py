"""Word distributions computed apart from the decoding stream: the tests' and benchmarks' reference.

The simulation reads its ToM distributions inside the stream (a row's
:class:`~synclib.engine.Probe`, :mod:`synclib.simulate.readout`); the tests compare them with
:func:`word_distributions`, which scores the same words after the same tokens through
:meth:`Engine.sequence_logprobs` (one prefill per prompt, then the candidates' prefix tree).
A benchmark imports it after adding this folder to ``sys.path``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from synclib.engine import CandidateWords, Engine


def word_distributions(engine, prompts: Sequence, candidates, sessions: Sequence | None = None,
                       return_mass: bool = False):
    """Probabilities over candidate words at the next position of each prompt.

    Each candidate is scored by the probability that the model's continuation spells it, as
    is or with a leading space (:func:`~synclib.engine.candidate_sequences`); a candidate of
    several tokens by teacher forcing (:meth:`Engine.sequence_logprobs`); a candidate whose
    tokens start another's excludes the longer one, and the scores are normalised over the
    candidates (:meth:`CandidateWords.distribution`).

    Parameters
    ----------
    engine : Engine or LoadedModel
        The engine to score with, or a model (then a fresh engine without session reuse).
    prompts : sequence of P str or token-id lists
        Prompts whose next token is the candidate word (chat-formatted, plus any text
        already generated, e.g. ``"Joy."`` before a second word).
    candidates : sequence of C str, or CandidateWords
        Distinct candidate words, e.g. ``["yes", "no"]``, or their spellings for the model's
        tokenizer.
    sessions : sequence of P hashable, optional
        Session key per prompt for KV reuse.
    return_mass : bool, default False
        Also return the candidates' total probability before normalising.

    Returns
    -------
    numpy.ndarray
        ``(P, C)`` float64, rows summing to 1 (NaN rows when the candidates have zero
        probability); with ``return_mass``, also ``(P,)``.
    """
    if not isinstance(engine, Engine):
        engine = Engine(engine, kv_reuse=False)
    lm = engine.lm
    words = candidates if isinstance(candidates, CandidateWords) else CandidateWords(lm.tokenizer, candidates)
    prompts = list(prompts)
    logps = engine.sequence_logprobs(prompts, [words.seqs] * len(prompts), sessions)
    probs = np.empty((len(prompts), len(words.words)))
    mass = np.empty(len(prompts))
    for i, logp in enumerate(logps):
        probs[i], mass[i] = words.distribution(logp)
    return (probs, mass) if return_mass else probs
