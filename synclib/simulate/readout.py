"""The Theory-of-Mind reply format and its read-out (:class:`TomReadout`).

The ToM instruction asks for ``Emotion. Action type. Response.``; this module owns how such
a reply is read: the emotion word's distribution at the reply's first position, the action
word's after the first generated token holding a ``.``, and whether the reply followed the
format.  The turn-by-turn loop reads a batch's replies after its ``generate`` call
(:meth:`TomReadout.read`, over the session caches); the continuous loop has each ToM row carry
the same two read-outs as a :class:`~synclib.engine.Probe`, scored inside the decoding stream
over the row's own keys/values (:meth:`TomReadout.from_scores`).  Both score the same token
sequences after the same tokens, so they agree up to float rounding.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from synclib.engine import CandidateWords, Probe
from synclib.tasks.prompts import ACTIONS, EMOTIONS

__all__ = ["TomReadout"]

#: a ToM reply in the instructed format opens with an emotion word, then an action word
_TOM_FORMAT = re.compile(r"^\W*(?:" + "|".join(EMOTIONS) + r")\W+(?:" + "|".join(ACTIONS) + r")\b", re.I)
#: generated tokens searched for the "." that ends a ToM reply's emotion word
_TOM_SEARCH_TOKENS = 16


class TomReadout:
    """The ToM read-out of one model: its spellings of the emotion and action words, the
    tokens that end the emotion word (those holding a ``.``), and the stream
    :class:`~synclib.engine.Probe` that scores both read-outs.

    Parameters
    ----------
    lm : LoadedModel
    """

    def __init__(self, lm):
        self.lm = lm
        self.emotion = CandidateWords(lm.tokenizer, EMOTIONS)
        self.action = CandidateWords(lm.tokenizer, ACTIONS)
        self._dot: dict[int, bool] = {}
        #: what a ToM row of the continuous loop carries (:meth:`DecodeStream.submit`)
        self.probe = Probe(first=tuple(self.emotion.seqs), then=tuple(self.action.seqs), mark=self.ends_emotion,
                           within=_TOM_SEARCH_TOKENS)

    def ends_emotion(self, token: int) -> bool:
        """Whether generated ``token`` holds the ``.`` after the emotion word."""
        if token not in self._dot:
            self._dot[token] = "." in self.lm.tokenizer.decode([token])
        return self._dot[token]

    def action_at(self, token_ids: Sequence[int]) -> int | None:
        """The index of the first of a reply's first :data:`_TOM_SEARCH_TOKENS` tokens that
        ends the emotion word (the action word is read after it), or None."""
        return next((k for k, t in enumerate(token_ids[:_TOM_SEARCH_TOKENS]) if self.ends_emotion(t)), None)

    def read(self, eng, requests: Sequence, results: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read the ToM replies of a ``generate`` call (the turn-by-turn loop): emotion and
        action distributions, and whether each followed the format.

        The ToM instruction asks for ``Emotion. Action type. Response.``  The emotion
        distribution is read at the first generated position (the prompt's next token); the
        action distribution at the position after the first generated token containing ``.``
        (searched among the first :data:`_TOM_SEARCH_TOKENS` generated tokens), i.e. after
        ``"Joy."``: the leading-space spelling of each action word covers ``" Assertive"``.
        Both are :meth:`synclib.engine.Engine.word_distributions` of this model's spellings
        of :data:`EMOTIONS` / :data:`ACTIONS` on the exact prompt and generated token ids,
        with the requests' sessions, so only a token or two is prefilled per row.

        Parameters
        ----------
        eng : synclib.engine.Engine
            The engine that generated ``results`` (its sessions are re-used).
        requests, results : sequences of R ``Request`` / ``Result``
            What was passed to and returned by ``eng.generate``.

        Returns
        -------
        emotion : numpy.ndarray
            ``(R, len(EMOTIONS))`` float64, rows summing to 1.
        action : numpy.ndarray
            ``(R, len(ACTIONS))`` float64; NaN rows where no ``.`` was generated in time.
        formatted : numpy.ndarray
            ``(R,)`` int: 1 where the raw reply opens with an emotion word and then an action
            word (:data:`_TOM_FORMAT`), else 0.
        """
        if len(requests) != len(results):
            raise ValueError(f"{len(requests)} requests but {len(results)} results")
        sessions = [r.session for r in requests]
        emotion = eng.word_distributions([r.prompt_ids for r in results], self.emotion, sessions)
        action = np.full((len(results), len(ACTIONS)), np.nan)
        prefixes, where, sess = [], [], []
        for i, (req, res) in enumerate(zip(requests, results)):
            k = self.action_at(res.token_ids)
            if k is not None:
                prefixes.append(list(res.prompt_ids) + list(res.token_ids[:k + 1]))
                where.append(i)
                sess.append(req.session)
        if prefixes:
            action[where] = eng.word_distributions(prefixes, self.action, sess)
        return emotion, action, np.array([formatted(r.text) for r in results], dtype=int)

    def from_scores(self, result) -> tuple[np.ndarray, np.ndarray, int]:
        """One reply's read-out from its stream probe's scores (:attr:`Result.scores`):
        ``(emotion (8,), action (5,), formatted)`` as a row of :meth:`read`."""
        first, then = result.scores
        action = np.full(len(ACTIONS), np.nan) if then is None else self.action.distribution(then)[0]
        return self.emotion.distribution(first)[0], action, formatted(result.text)


def formatted(text: str) -> int:
    """1 where a raw ToM reply opens with an emotion word and then an action word, else 0."""
    return int(bool(_TOM_FORMAT.match(text)))
