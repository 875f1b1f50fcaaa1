"""The Theory-of-Mind reply format and its read-out (:class:`TomReadout`).

The ToM instruction asks for ``Emotion. Action type. Response.``.  Each ToM request carries the two read-outs as a
:class:`~synclib.engine.Probe` (:attr:`TomReadout.probe`), scored inside the decoding stream over the row's own
keys/values; they equal the same words' distributions scored after the same tokens by
:meth:`~synclib.engine.Engine.sequence_logprobs` up to float rounding (``tests/test_simulate.py``).
"""
from __future__ import annotations

import re

import numpy as np

from synclib.engine import CandidateWords, Probe
from synclib.tasks.prompts import ACTIONS, EMOTIONS

__all__ = ["TomReadout"]

#: a ToM reply in the instructed format opens with an emotion word, then an action word
_TOM_FORMAT = re.compile(r"^\W*(?:" + "|".join(EMOTIONS) + r")\W+(?:" + "|".join(ACTIONS) + r")\b", re.I)
#: generated tokens searched for the "." that ends a ToM reply's emotion word
_TOM_SEARCH_TOKENS = 16


class TomReadout:
    """The ToM read-out of one model (``lm``, a LoadedModel): its spellings of the emotion and action words, the
    tokens that end the emotion word (those holding a ``.``), and the stream probe that scores both."""

    def __init__(self, lm):
        self.lm = lm
        self.emotion = CandidateWords(lm.tokenizer, EMOTIONS)
        self.action = CandidateWords(lm.tokenizer, ACTIONS)
        self._dot: dict[int, bool] = {}
        #: what a ToM request carries (:meth:`DecodeStream.submit`)
        self.probe = Probe(first=tuple(self.emotion.seqs), then=tuple(self.action.seqs), mark=self.ends_emotion,
                           within=_TOM_SEARCH_TOKENS)

    def ends_emotion(self, token: int) -> bool:
        """Whether generated ``token`` holds the ``.`` after the emotion word."""
        if token not in self._dot:
            self._dot[token] = "." in self.lm.tokenizer.decode([token])
        return self._dot[token]

    def from_scores(self, result) -> tuple[np.ndarray, np.ndarray, int]:
        """One reply's read-out from its stream probe's scores (:attr:`Result.scores`): ``(emotion, action,
        formatted)``.  ``emotion`` ``(len(EMOTIONS),)`` float64 sums to 1, read at the first generated position;
        ``action`` ``(len(ACTIONS),)``, read after the first generated token containing ``.`` (among the first
        :data:`_TOM_SEARCH_TOKENS`, i.e. after ``"Joy."``; the leading-space spellings cover ``" Assertive"``), NaN
        where none came in time; ``formatted`` 1 where the raw reply opens with an emotion then an action word
        (:data:`_TOM_FORMAT`), else 0."""
        first, then = result.scores
        action = np.full(len(ACTIONS), np.nan) if then is None else self.action.distribution(then)[0]
        return self.emotion.distribution(first)[0], action, formatted(result.text)


def formatted(text: str) -> int:
    """1 where a raw ToM reply opens with an emotion word and then an action word, else 0."""
    return int(bool(_TOM_FORMAT.match(text)))
