"""The Theory-of-Mind reply format and its read-out (:func:`_tom_readout`).

The ToM instruction asks for ``Emotion. Action type. Response.``; this module owns how such
a reply is read: the emotion word's distribution at the reply's first position, the action
word's after the first generated token holding a ``.``, and whether the reply followed the
format.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from synclib.tasks.prompts import ACTIONS, EMOTIONS

__all__ = ["_tom_readout"]

#: a ToM reply in the instructed format opens with an emotion word, then an action word
_TOM_FORMAT = re.compile(r"^\W*(?:" + "|".join(EMOTIONS) + r")\W+(?:" + "|".join(ACTIONS) + r")\b", re.I)
#: generated tokens searched for the "." that ends a ToM reply's emotion word
_TOM_SEARCH_TOKENS = 16


def _tom_readout(eng, requests: Sequence, results: Sequence, store: bool = True
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read the ToM replies: emotion and action distributions, and whether each followed the format.

    The ToM instruction asks for ``Emotion. Action type. Response.``  The emotion
    distribution is read at the first generated position (the prompt's next token); the
    action distribution at the position after the first generated token containing ``.``
    (searched among the first :data:`_TOM_SEARCH_TOKENS` generated tokens), i.e. after
    ``"Joy."``: the leading-space spelling of each action word covers ``" Assertive"``.
    Both are :meth:`synclib.engine.Engine.word_distributions` over :data:`EMOTIONS` /
    :data:`ACTIONS` on the exact prompt and generated token ids, with the requests'
    sessions, so only a token or two is prefilled per row.

    Parameters
    ----------
    eng : synclib.engine.Engine
        The engine that generated ``results`` (its sessions are re-used).
    requests, results : sequences of R ``Request`` / ``Result``
        What was passed to and returned by ``eng.generate``.
    store : bool, default True
        Store the read-outs' prompts in the sessions; the continuous loop reads older
        replies after a session has moved on and passes False, so that the newer prompt
        stays cached.

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
    emotion = eng.word_distributions([r.prompt_ids for r in results], EMOTIONS, sessions, store=store)
    action = np.full((len(results), len(ACTIONS)), np.nan)
    prefixes, where, sess = [], [], []
    for i, (req, res) in enumerate(zip(requests, results)):
        for k, t in enumerate(res.token_ids[:_TOM_SEARCH_TOKENS]):
            if "." in eng.lm.tokenizer.decode([t]):
                prefixes.append(list(res.prompt_ids) + list(res.token_ids[:k + 1]))
                where.append(i)
                sess.append(req.session)
                break
    if prefixes:
        action[where] = eng.word_distributions(prefixes, ACTIONS, sess, store=store)
    formatted = np.array([int(bool(_TOM_FORMAT.match(r.text))) for r in results], dtype=int)
    return emotion, action, formatted
