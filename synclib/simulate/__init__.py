"""The dialog loop: two models play Sotopia tasks and fill an activation cube.

:func:`simulate` runs model A as agent 1 and model B as agent 2 over a set of
tasks and simulation seeds, following ``protocol.md``: agent 1 speaks at even
utterance indices, agent 2 at odd ones, at most ``max_utterances`` (16)
utterances, an episode ends after an utterance for which
:func:`synclib.tasks.prompts.is_leave` holds, every reply goes through
:func:`synclib.tasks.prompts.postprocess_reply`; sampling at temperature 0.7 with
at most 300 new tokens, from the distribution ``transformers``' ``generate`` samples from
(top-k 50 and the checkpoint's top-p unless set otherwise; :func:`resolve_sampling`).

Batching (:class:`Batching`, one meaning a knob).  The (episode, seed) *units* are cut, in
cube order, into parts of ``units_per_part`` (one crash-safe cube part each; the cube's
attribute of that name).  The engines run at most ``max_rows`` rows per forward pass
(halved by an engine that runs out of memory, for that engine only).  With
``scheduling="turns"`` all live episodes of a part advance together: at
utterance ``t`` every live row is agent ``t % 2``'s turn, so one call of
:func:`synclib.engine.generate` on that agent's model serves them all;
finished episodes drop out.  Every row samples with its own generator, seeded
from (sim_seed, task index, utterance, run) (:func:`synclib.engine.row_seed`),
so a dialog does not depend on which other rows share its batch, and each
agent's prompt re-uses the keys/values of its previous prompt (one engine
session per episode, seed and agent).  The hidden states of every decoder layer at
the last prompt token of utterance ``t`` go to round ``t // 2`` of
``hidden_a`` (even ``t``) or ``hidden_b`` (odd ``t``).

Optional passes (:class:`Passes`), run per part (with ``scheduling="turns"`` the passive
reader reads a part's genuine dialogs after they end, with ``"continuous"`` each genuine
utterance's prompt beside its request):

* passive (``Passes(passive=True)``): the genuine dialogs of the ``passive_seeds`` are re-read
  with the passive prompt view, model A in agent 1's slot (``hidden_a_passive``) and
  model B in agent 2's slot (``hidden_b_passive``); prefill only.  The reader is told it
  is the persona drawn for (task, seed) as the paper's code draws it
  (:func:`synclib.tasks.prompts.passive_persona`, recorded in ``passive_reader``).
* Theory of Mind (``Passes(tom=True)``): a separate dialog run with the ToM view
  (emotion/action instruction; the partner's history without those words), for every
  unit or, with ``tom_episodes``, only for the units of the first that many tasks (the
  others keep the cube's "unreached" values: ``n_utterances_tom`` is -1),
  storing ``hidden_*_tom``, ``text_*_tom`` and the distributions over the 8
  emotion and 5 action words where the agent generates them (``emotion_*``,
  ``action_*``).  :mod:`~synclib.simulate.readout` owns the ToM reply format (:class:`TomReadout`:
  its stream probe, which each ToM request carries, and a reply's read-out from the probe's
  scores): the emotion word
  at the reply's first position, the action word after the first generated
  token holding a ``.`` (NaN when none came within 16 tokens).
  ``tom_format_*`` (an addition) is 1 where the raw reply opened with an
  emotion word and then an action word, as instructed, else 0.

One loop plays every dialog (:mod:`synclib.simulate.runner`): schedule, one step of each
model's :class:`~synclib.engine.DecodeStream`, postprocess; the scheduling is the
:class:`Scheduler`'s policy.  With ``scheduling="turns"`` (the default) a turn's requests go
out together in batches that are not refilled and its replies come back together.  With
``"continuous"`` (continuous batching) the genuine and the ToM dialogs share
one refilled stream per model for the whole call (``max_in_flight`` rows at most,
default the dialogs of one part).  The next part
is in play beside the oldest one, so the places a part's ending dialogs free are taken by the
next part's; the passive reader's prompt of each genuine utterance is prefilled in the same
forward as the utterance's request (:meth:`synclib.engine.DecodeStream.read`).  Every row's
request, seed and session are the same, so the cube is the same up to float rounding.

Crash safety and resume: every part is written, as soon as its units are done, as one part of
the cube, in a background thread while the loop goes on (:class:`synclib.cube.CubeWriter`,
:meth:`~synclib.cube.CubeWriter.submit_part`; the parts of a continuous run may end out of
order); a re-run of the same command skips the parts written and re-runs the rest with the
same composition (an unfinished run's ``units_per_part`` attribute),
so the resumed cube equals an uninterrupted one.

The package: :mod:`~synclib.simulate.options` (the settings' groups),
:mod:`~synclib.simulate.dialog` (a dialog with its status; the scheduler's queues and policy),
:mod:`~synclib.simulate.runner` (the one loop over the parts), :mod:`~synclib.simulate.readout` (the ToM reply
format), :mod:`~synclib.simulate.play` (:func:`simulate`).
"""
from synclib.simulate.dialog import Dialog, Scheduler, Status
from synclib.simulate.options import (Batching, Passes, RunOptions, Sampling, default_units_per_part,
                                      resolve_sampling)
from synclib.simulate.play import episode_coords, simulate
from synclib.simulate.readout import TomReadout

__all__ = ["simulate", "episode_coords", "default_units_per_part", "resolve_sampling", "Sampling", "Passes",
           "Batching", "RunOptions", "Dialog", "Scheduler", "Status", "TomReadout"]
