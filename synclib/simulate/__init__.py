"""The dialog loop: two models play Sotopia tasks and fill an activation cube.

:func:`simulate` runs model A as agent 1 and model B as agent 2 over a set of tasks and simulation seeds, following
``protocol.md``: agent 1 speaks at even utterance indices, agent 2 at odd ones, at most ``max_utterances`` (16); an
episode ends after an utterance for which :func:`synclib.tasks.prompts.is_leave` holds; every reply goes through
:func:`synclib.tasks.prompts.postprocess_reply`.  Sampling: temperature 0.7, at most 300 new tokens, from the
distribution ``transformers``' ``generate`` samples from (top-k 50 and the checkpoint's top-p unless set otherwise;
:func:`resolve_sampling`).

Batching (:class:`Batching`).  The (episode, seed) *units* are cut, in cube order, into parts of ``units_per_part``
(one crash-safe cube part each).  Every row samples with its own generator seeded from (sim_seed, task index,
utterance, run) (:func:`synclib.engine.row_seed`), so a dialog does not depend on its batch, and each agent's prompt
reuses the keys/values of its previous one (one engine session per episode, seed and agent).  The states of every
decoder layer at the last prompt token of utterance ``t`` go to round ``t // 2`` of ``hidden_a`` (even ``t``) or
``hidden_b`` (odd ``t``).

Scheduling (:class:`Scheduler`, one loop: :mod:`synclib.simulate.runner`).  ``"turns"`` (the default): all live
episodes of a part advance together; at utterance ``t`` every live row is agent ``t % 2``'s turn, served by batches
of that model's stream that are not refilled.  ``"continuous"``: the genuine and ToM dialogs share one refilled stream
per model for the whole call (``max_in_flight`` rows at most), the next part in play beside the oldest.  Every row's
request, seed and session are the same either way, so the cube is the same up to float rounding.

Optional passes (:class:`Passes`), per part:
* passive (``Passes(passive=True)``): the genuine dialogs of the ``passive_seeds`` are re-read, prefill only, in the
  passive prompt view, model A in agent 1's slot (``hidden_a_passive``), model B in agent 2's (``hidden_b_passive``).
  The reader is told it is the persona drawn for (task, seed) as the paper's code draws it
  (:func:`synclib.tasks.prompts.passive_persona`, recorded in ``passive_reader``); with ``passive_own`` a second
  reader of the same dialogs is told it is the agent it replaces (``hidden_*_passive_own``; ours).
* Theory of Mind (``Passes(tom=True)``): a separate dialog run with the ToM view (emotion/action instruction; the
  partner's history without those words), for every unit or those of the first ``tom_episodes`` tasks (the others
  keep the "unreached" values: ``n_utterances_tom`` is -1), storing ``hidden_*_tom``, ``text_*_tom``, the
  distributions over the 8 emotion and 5 action words (``emotion_*``, ``action_*``; :class:`TomReadout`) and
  ``tom_format_*`` (an addition: 1 where the raw reply opened with an emotion word and then an action word).

Crash safety: every part is written as one part of the cube as soon as its units are done, in a background thread
(:meth:`synclib.cube.CubeWriter.submit_part`); a re-run of the same command skips the parts written and re-runs the
rest with the same ``units_per_part``, so the resumed cube equals an uninterrupted one.
"""
from synclib.simulate.dialog import Dialog, Scheduler, Status
from synclib.simulate.options import (Batching, Passes, RunOptions, Sampling, default_units_per_part,
                                      resolve_sampling)
from synclib.simulate.play import episode_coords, simulate
from synclib.simulate.readout import TomReadout

__all__ = ["simulate", "episode_coords", "default_units_per_part", "resolve_sampling", "Sampling", "Passes",
           "Batching", "RunOptions", "Dialog", "Scheduler", "Status", "TomReadout"]
