"""The simulation's dialog objects, their scheduler, and the batching knobs' single meanings.

The scheduler is checked on its own (statuses and queues) and inside the continuous loop on
tiny random models: every dialog ends FINISHED, the ToM dialogs through AWAITING_TOM, and the
ToM read-out's batch follows its own knob, not an engine's row cap that an out-of-memory error
halved.
"""
from __future__ import annotations

import json

import pytest

from synclib.cube import CubeSpec, parts_dir
from synclib.tasks.prompts import ACTIONS, EMOTIONS
from synclib.tasks.scenarios import load_tasks
from synclib.simulate import (Batching, Dialog, Passes, RunOptions, Sampling, Scheduler, Status, default_units_per_part,
                              episode_coords)
from synclib.simulate import runner as runner_module


# ----------------------------------------------------------------------------- the scheduler

def test_the_scheduler_moves_a_dialog_through_its_statuses():
    talk, tom = Dialog((0, 0), None, "active"), Dialog((0, 0), None, "tom")
    sched = Scheduler([talk, tom])
    assert sched and list(sched.waiting) == [talk, tom] and talk.status is Status.WAITING
    assert sched.schedule() == [talk, tom]
    assert talk.status is tom.status is Status.RUNNING and not sched.waiting and len(sched.running) == 2
    talk.request = "req"
    sched.advance(talk)  # its reply recorded, the dialog goes on
    assert talk.status is Status.WAITING and talk.turn == 1 and talk.request is None and talk.agent == 1
    assert talk.session(1) == (0, 0, 1, "active")
    sched.queue_readout("engine", tom, "reply")  # a ToM reply waits for its read-out
    assert tom.unread == 1 and sched.readouts("engine") == 1
    sched.await_tom(tom)  # the ToM dialog ended with that reply unread
    assert tom.status is Status.AWAITING_TOM and sched.read_out() == []
    assert sched.take_readouts("engine") == [(tom, 0, None, "reply")] and tom.unread == 0
    assert sched.read_out() == [tom]
    sched.finish(tom)
    assert tom.status is Status.FINISHED and not sched.awaiting_tom
    assert sched.schedule() == [talk] and talk.status is Status.RUNNING
    sched.finish(talk)
    assert not sched and sched.finished == [tom, talk] and talk.status is Status.FINISHED
    with pytest.raises(ValueError, match="not running"):
        sched.advance(talk)
    with pytest.raises(ValueError, match="must be WAITING"):
        Scheduler([talk])


# ----------------------------------------------------------------------------- the knobs

def test_each_batching_knob_has_one_meaning_and_defaults_as_before(tmp_path):
    """units_per_part: the part (and what resume reads from an unfinished run's ``batch_size``);
    max_rows: rows per forward, default the units per part; tom_flush: default max_rows."""
    out = tmp_path / "x.nc"
    assert default_units_per_part("cpu") == 8 and default_units_per_part("cuda:0") == 64
    b = Batching().resolve(out, "cpu")
    assert (b.units_per_part, b.max_rows, b.tom_flush, b.max_in_flight) == (8, 8, 8, None)
    b = Batching(units_per_part=20).resolve(out, "cuda")
    assert (b.units_per_part, b.max_rows, b.tom_flush) == (20, 20, 20)
    b = Batching(units_per_part=20, max_rows=5, max_in_flight=7).resolve(out, "cpu")
    assert (b.units_per_part, b.max_rows, b.tom_flush, b.max_in_flight) == (20, 5, 5, 7)
    parts_dir(out).mkdir()
    (parts_dir(out) / "spec.json").write_text(json.dumps({"attrs": {"batch_size": 3}}))  # an unfinished run
    assert Batching().resolve(out, "cpu").units_per_part == 3
    assert Batching(units_per_part=4).resolve(out, "cpu").units_per_part == 4  # (the writer then refuses it)


@pytest.mark.parametrize("make, field", [
    (lambda: Batching(max_rows=0), "Batching.max_rows"),
    (lambda: Batching(units_per_part=2.5), "Batching.units_per_part"),
    (lambda: Batching(scheduling="fast"), "Batching.scheduling"),
    (lambda: Batching(cache_gib=-1), "cache_gib"),
    (lambda: Sampling(temperature=-1), "Sampling.temperature"),
    (lambda: Sampling(max_new_tokens=0), "Sampling.max_new_tokens"),
    (lambda: Sampling(top_p=1.5), "Sampling.top_p"),
    (lambda: Sampling(reply_end="word"), "Sampling.reply_end"),
    (lambda: Passes(tom_episodes=0), "Passes.tom_episodes"),
    (lambda: Passes(passive_seeds=[-1]), "Passes.passive_seeds"),
    (lambda: RunOptions(store_dtype="int8"), "RunOptions.store_dtype"),
])
def test_a_bad_setting_is_refused_naming_its_field(make, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        make()


# ----------------------------------------------------------------------------- inside the loop

def _runner(lms, tasks, batching: Batching):
    spec = CubeSpec(episodes=[episode_coords(t) for t in tasks], seeds=[0, 1], n_rounds=2,
                    n_layers_a=lms[0].n_layers, d_model_a=lms[0].d_model,
                    n_layers_b=lms[1].n_layers, d_model_b=lms[1].d_model, tom=True,
                    emotions=EMOTIONS, actions=ACTIONS)
    sampling = tuple(Sampling(max_new_tokens=8).for_model(lm) for lm in lms)
    return spec, runner_module._Runner(lms, spec, {t.index: t for t in tasks}, max_utterances=4, sampling=sampling,
                                       batching=batching)


@pytest.mark.parametrize("tom_flush", [None, 1000])
def test_the_tom_flush_keeps_its_own_knob_after_an_engine_halved_its_rows(tiny_models, monkeypatch, tom_flush):
    """An engine that ran out of memory keeps a lower row cap (``Engine._batched``); the ToM
    read-out of the continuous loop still collects ``tom_flush`` replies (default: the
    configured ``max_rows``), and every dialog ends FINISHED, the ToM ones via AWAITING_TOM."""
    from synclib.models import load_model

    lms = (load_model(tiny_models[0]), load_model(tiny_models[1]))
    tasks = [load_tasks("embedded")[i] for i in (0, 3)]
    spec, runner = _runner(lms, tasks, Batching(units_per_part=4, max_rows=4, tom_flush=tom_flush,
                                                scheduling="continuous"))
    for eng in runner.engines:
        eng.batch_size = 1  # as an out-of-memory error leaves it
    assert runner.tom_flush == (tom_flush or 4) and runner.batching.max_rows == 4
    sizes, scheds, awaited = [], [], []
    real = runner_module._tom_readout

    def readout(eng, requests, results, store=True):
        sizes.append(len(requests))
        return real(eng, requests, results, store=store)

    class Spy(Scheduler):
        def __init__(self, dialogs):
            super().__init__(dialogs)
            scheds.append(self)

        def await_tom(self, d):
            awaited.append(d)
            super().await_tom(d)

    monkeypatch.setattr(runner_module, "_tom_readout", readout)
    monkeypatch.setattr(runner_module, "Scheduler", Spy)
    values = runner.run_batch(spec.units())
    assert len(values) == 4 and len(scheds) == 1
    sched = scheds[0]
    assert len(sched.dialogs) == 8 and all(d.status is Status.FINISHED for d in sched.dialogs)
    assert not (sched.waiting or sched.running or sched.awaiting_tom) and len(sched.finished) == 8
    assert {id(d) for d in awaited} == {id(d) for d in sched.dialogs if d.view == "tom"}
    n_tom = sum(len(d.history) for d in sched.dialogs if d.view == "tom")
    assert sum(sizes) == n_tom
    if tom_flush == 1000:  # nothing reaches the flush: one read-out per engine, at the end
        assert len(sizes) == 2
    else:  # every read-out but the two final ones collected at least max_rows replies
        assert all(n >= 4 for n in sizes[:-2]) and len(sizes) < n_tom
