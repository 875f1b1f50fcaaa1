"""The simulation's dialog objects, their scheduler, and the batching knobs' single meanings.

The scheduler is checked on its own (statuses and queues) and inside the continuous loop on
tiny random models: every dialog ends FINISHED, the ToM replies come back read from inside
the stream (probes scored over its own keys/values, batched even when an out-of-memory error
halved an engine's rows), and the dialogs leave with their written part.  Across parts: one stream per model serves them all (the next part's dialogs start
before the part before is written), with the cube of the turn-by-turn run; a writer's error
in its thread reaches the caller, and a resumed run writes only the parts missing.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from synclib.cube import CubeSpec, CubeWriter, Unit, open_cube, parts_dir, var_name
from synclib.tasks.prompts import ACTIONS, EMOTIONS, render_prompt
from synclib.tasks.scenarios import load_tasks
from synclib.simulate import (Batching, Dialog, Passes, RunOptions, Sampling, Scheduler, Status, default_units_per_part,
                              episode_coords, simulate)
from synclib.simulate import runner as runner_module


# ----------------------------------------------------------------------------- the scheduler

def test_the_scheduler_moves_a_dialog_through_its_statuses():
    talk, tom = Dialog(Unit(0, 0, {}), "active"), Dialog(Unit(0, 0, {}), "tom")
    sched = Scheduler([talk, tom])
    assert sched and list(sched.waiting) == [talk, tom] and talk.status is Status.WAITING
    assert sched.schedule() == [talk, tom]
    assert talk.status is tom.status is Status.RUNNING and not sched.waiting and len(sched.running) == 2
    talk.request = "req"
    sched.advance(talk)  # its reply recorded, the dialog goes on
    assert talk.status is Status.WAITING and talk.turn == 1 and talk.request is None and talk.agent == 1
    assert talk.session(1) == (0, 0, 1, "active") and talk.session(0, "passive") == (0, 0, 0, "passive")
    sched.finish(tom)  # its reply recorded, the dialog ends
    assert tom.status is Status.FINISHED and not sched.running and list(sched.waiting) == [talk]
    assert sched.schedule() == [talk] and talk.status is Status.RUNNING
    sched.finish(talk)
    assert not sched and sched.finished == [tom, talk] and talk.status is Status.FINISHED
    with pytest.raises(ValueError, match="not running"):
        sched.advance(talk)
    with pytest.raises(ValueError, match="must be WAITING"):
        Scheduler([talk])
    later = Dialog(Unit(1, 0, {}), "active")  # a dialog of the next part joins
    sched.add([later])
    assert sched and list(sched.waiting) == [later] and sched.dialogs == [talk, tom, later]
    with pytest.raises(ValueError, match="only a finished dialog can leave"):
        sched.remove([later])
    sched.remove([talk, tom])  # their part is done
    assert sched.dialogs == [later] and sched.finished == []


def test_the_turns_policy_sends_a_turn_together_and_hands_its_replies_back_together():
    """``policy="turns"``: nothing is scheduled while a dialog runs, and a turn's replies come
    back together once the last has come, in the order the dialogs were scheduled (whatever
    order they ended in); ``"continuous"`` hands each back at once."""
    a, b, c = (Dialog(Unit(i, 0, {}), "active") for i in range(3))
    sched = Scheduler([a, b, c], policy="turns")
    assert sched.schedule() == [a, b, c]
    assert sched.replied(c, "rc") == [] and sched.replied(a, "ra") == []
    sched.add([Dialog(Unit(3, 0, {}), "active")])
    assert sched.schedule() == []  # the turn is still running
    assert sched.replied(b, "rb") == [(a, "ra"), (b, "rb"), (c, "rc")]
    sched.advance(a)
    sched.finish(b)
    assert sched.schedule() == []  # c is still running
    sched.advance(c)
    assert [d.unit for d in sched.schedule()] == [(3, 0), (0, 0), (2, 0)]
    with pytest.raises(ValueError, match="not running"):
        sched.replied(b, "again")
    loose = Scheduler([Dialog(Unit(0, 0, {}), "tom")], policy="continuous")
    (d,) = loose.schedule()
    assert loose.replied(d, "r") == [(d, "r")]
    with pytest.raises(ValueError, match="policy must be one of 'turns', 'continuous', got 'fast'"):
        Scheduler(policy="fast")


# ----------------------------------------------------------------------------- the knobs

def test_each_batching_knob_has_one_meaning_and_defaults_as_before(tmp_path):
    """units_per_part: the part (and what resume reads from an unfinished run's attribute of that name);
    max_rows: rows per forward, default the units per part; a stream's capacity: max_in_flight,
    else the largest part's dialogs, with kv_tokens the two largest parts'."""
    out = tmp_path / "x.nc"
    assert default_units_per_part("cpu") == 8 and default_units_per_part("cuda:0") == 64
    b = Batching().resolve(out, "cpu")
    assert (b.units_per_part, b.max_rows, b.max_in_flight) == (8, 8, None)
    b = Batching(units_per_part=20).resolve(out, "cuda")
    assert (b.units_per_part, b.max_rows) == (20, 20)
    b = Batching(units_per_part=20, max_rows=5, max_in_flight=7).resolve(out, "cpu")
    assert (b.units_per_part, b.max_rows, b.max_in_flight) == (20, 5, 7)
    assert b.stream_capacity([3, 9, 5]) == 7
    assert Batching().stream_capacity([3, 9, 5]) == 9 and Batching(kv_tokens=100).stream_capacity([3, 9, 5]) == 14
    parts_dir(out).mkdir()
    (parts_dir(out) / "spec.json").write_text(json.dumps({"attrs": {"units_per_part": 3}}))  # an unfinished run
    assert Batching().resolve(out, "cpu").units_per_part == 3
    assert Batching(units_per_part=4).resolve(out, "cpu").units_per_part == 4  # (the writer then refuses it)


@pytest.mark.parametrize("make, field", [
    (lambda: Batching(max_rows=0), "Batching.max_rows"),
    (lambda: Batching(units_per_part=2.5), "Batching.units_per_part"),
    (lambda: Batching(scheduling="fast"), "Batching.scheduling"),
    (lambda: Batching(cache_gib=-1), "cache_gib"),
    (lambda: Batching(kv_tokens=0), "Batching.kv_tokens"),
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


def test_play_part_plays_turn_by_turn_whatever_the_scheduling(tiny_models):
    """``play_part`` (the benchmarks' entry) plays a part turn by turn on streams that are not
    refilled, even on a runner scheduled ``"continuous"``, after that runner played its own
    refilled streams: its cells are the turns runner's exactly."""
    from synclib.models import load_model

    lms = (load_model(tiny_models[0]), load_model(tiny_models[1]))
    tasks = [load_tasks("embedded")[i] for i in (0, 3)]
    cells = {}
    for scheduling in ("turns", "continuous"):
        spec, runner = _runner(lms, tasks, Batching(units_per_part=4, max_rows=2, scheduling=scheduling))
        if scheduling == "continuous":
            runner._open_streams(4, refill=True)  # as its own play leaves them
        cells[scheduling] = runner.play_part(spec.units())
        assert not any(st.refill for st in runner.streams)
    for a, b in zip(cells["turns"], cells["continuous"]):
        for name, value in a.values.items():
            np.testing.assert_array_equal(value, b.values[name], err_msg=name)


@pytest.mark.parametrize("scheduling", ["continuous", "turns"])
def test_the_tom_replies_come_back_read_from_the_stream(tiny_models, monkeypatch, tmp_path, scheduling):
    """Neither policy reads a ToM reply after the fact: each ToM request carries its
    read-outs as a probe, scored inside the stream (one point per reply at its prompt's end,
    one more where a "." came in time), even with an engine's rows halved to one by an
    out-of-memory error; every ToM utterance has its emotion distribution, and every dialog
    ends FINISHED (continuous: and leaves the scheduler with its written part)."""
    from synclib.models import load_model

    lms = (load_model(tiny_models[0]), load_model(tiny_models[1]))
    tasks = [load_tasks("embedded")[i] for i in (0, 3)]
    spec, runner = _runner(lms, tasks, Batching(units_per_part=4, max_rows=4, scheduling=scheduling))
    for eng in runner.engines:
        eng.max_rows = 1  # as an out-of-memory error leaves it
    scheds, added = [], []

    class Spy(Scheduler):
        def __init__(self, dialogs=(), policy="continuous"):
            super().__init__(dialogs, policy)
            scheds.append(self)

        def add(self, dialogs):
            dialogs = list(dialogs)
            added.extend(dialogs)
            super().add(dialogs)

    def no_readout(*args, **kwargs):
        raise AssertionError("the loop read a ToM reply outside the stream")

    for eng in runner.engines:
        monkeypatch.setattr(eng, "sequence_logprobs", no_readout)
    monkeypatch.setattr(runner_module, "Scheduler", Spy)
    writer = CubeWriter(tmp_path / "x.nc", spec)
    runner.play([(0, spec.units())], writer)
    writer.wait()
    assert writer.done == set(spec.units()) and len(added) == 8 and all(d.status is Status.FINISHED for d in added)
    assert not any(sched.waiting or sched.running for sched in scheds)
    if scheduling == "continuous":  # one scheduler for the run, the dialogs gone with their part
        assert len(scheds) == 1 and not (scheds[0].dialogs or scheds[0].finished)
    toms = [d for d in added if d.view == "tom"]
    n_tom = sum(len(d.history) for d in toms)
    points = sum(eng.stats["probe_points"] for eng in {id(e): e for e in runner.engines}.values())
    assert n_tom <= points <= 2 * n_tom
    for d in toms:  # agent 1 spoke utterances 0, 2, ..., agent 2 the odd ones
        for t in range(len(d.history)):
            emo = d.cells.values[var_name("emotion", "ab"[t % 2], "tom")][t // 2]
            assert np.isclose(emo.sum(), 1.0, atol=1e-6)


# ----------------------------------------------------------------------------- across parts

def _stopper(spec: str, seed: int):
    """A tiny model whose replies end at different steps (a random twelfth of the vocabulary stops them)."""
    from synclib.models import load_model

    lm = load_model(spec)
    vocab = lm.model.config.vocab_size
    pick = np.random.default_rng(seed).choice(vocab, vocab // 12, replace=False)
    return dataclasses.replace(lm, stop_token_ids=frozenset(int(t) for t in pick) | frozenset(lm.stop_token_ids))


def _assert_same_cube(x, y) -> None:
    """Texts, lengths and prompts exactly; states and ToM distributions to float rounding."""
    assert set(x.data_vars) == set(y.data_vars)
    for name in x.data_vars:
        if name.startswith(("hidden_", "emotion_", "action_")):
            np.testing.assert_allclose(x[name].values, y[name].values, rtol=1e-4, atol=1e-4, err_msg=name)
        else:
            np.testing.assert_array_equal(x[name].values, y[name].values, err_msg=name)


_SEEDS = [0, 1]
_RUN = dict(max_utterances=4, sampling=Sampling(max_new_tokens=8), passes=Passes(passive=True, tom=True))


def _simulate(pair, out, units_per_part: int, scheduling: str = "continuous", stats=None, kv_tokens=None):
    tasks = [load_tasks("embedded")[i] for i in (0, 3)]  # with two seeds: four units
    return simulate(*pair, tasks, _SEEDS, out, batching=Batching(units_per_part=units_per_part, scheduling=scheduling,
                                                                  kv_tokens=kv_tokens),
                    options=RunOptions(progress=False, engine_stats=stats), **_RUN)


@pytest.fixture(scope="module")
def pair(tiny_models):
    return _stopper(tiny_models[0], 0), _stopper(tiny_models[1], 1)


@pytest.fixture(scope="module")
def four_parts(pair, tmp_path_factory):
    """The continuous run of four units in four parts (A against B, ToM and passive on), watched:
    when each dialog joined the scheduler and each part went to the writer, the sessions the
    runner dropped, the requests it made, the engines' session-cache clears."""
    from synclib.engine import Engine

    log, forgotten, clears, engines, stats = [], set(), [], set(), {}
    real_add, real_submit = Scheduler.add, CubeWriter.submit_part
    real_forget, real_clear, real_request = Engine.forget, Engine.clear, runner_module._Runner._request

    def add(self, dialogs):
        dialogs = list(dialogs)
        log.extend(("start", d.unit) for d in dialogs)
        real_add(self, dialogs)

    def submit_part(self, part_id, units):
        log.append(("write", part_id))
        real_submit(self, part_id, units)
        self.wait()  # the write done here: when the next part starts does not hang on the writer thread's speed

    def forget(self, session):
        engines.add(self)
        forgotten.add(session)
        real_forget(self, session)

    def clear(self):
        clears.append(self)
        real_clear(self)

    def request(self, d):
        req = real_request(self, d)
        assert req.session not in forgotten, f"{req.session} was dropped while its dialog went on"
        return req

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "add", add)
        mp.setattr(CubeWriter, "submit_part", submit_part)
        mp.setattr(Engine, "forget", forget)
        mp.setattr(Engine, "clear", clear)
        mp.setattr(runner_module._Runner, "_request", request)
        path = _simulate(pair, tmp_path_factory.mktemp("parts") / "four.nc", 1, stats=stats)
    return dict(cube=open_cube(path, chunks=None), log=log, forgotten=forgotten, clears=clears, engines=engines,
                stats=stats)


def test_a_continuous_run_refills_its_streams_across_parts_and_plays_the_same_dialogs(pair, four_parts, tmp_path):
    """One stream per model for the four parts: the next part's dialogs start before the part
    before it is written, each part goes to the writer once, no in-flight dialog's session is
    dropped (only finished dialogs' and the passive reader's, never all of an engine's), and
    none is left at the end.  The cube is the one-part continuous run's and the turn-by-turn
    run's (texts exactly, states to float rounding)."""
    log = four_parts["log"]
    units = [(e, s) for e in (0, 3) for s in _SEEDS]  # cube order: part b holds units[b]
    assert sorted(b for kind, b in log if kind == "write") == [0, 1, 2, 3]
    first_start = {b: log.index(("start", units[b])) for b in range(4)}
    written_at = {b: log.index(("write", b)) for b in range(4)}
    assert all(first_start[b + 1] < written_at[b] for b in range(3)), log  # refilled across every part
    assert not four_parts["clears"]
    assert {(e, s, a, "passive") for e, s in units for a in (0, 1)} <= four_parts["forgotten"]
    assert all(eng.cached_sessions == 0 for eng in four_parts["engines"])
    assert four_parts["stats"]["seconds_cube"] > 0 and four_parts["stats"]["stream_joins"] > 0
    x = four_parts["cube"]
    lengths = np.array([len(t) for t in x.text_a.values.ravel() if t])
    assert lengths.min() < lengths.max()  # replies of different lengths
    for units_per_part, scheduling in ((4, "continuous"), (1, "turns")):
        y = open_cube(_simulate(pair, tmp_path / f"{scheduling}.nc", units_per_part, scheduling), chunks=None)
        _assert_same_cube(x, y)


def test_a_token_budget_sets_the_rows_in_flight_and_plays_the_same_dialogs(pair, four_parts, tmp_path):
    """``kv_tokens``: the streams' rows in flight are those whose reserves fit the budget (here
    about two rows of the embedded prompts), not a count; the dialogs are the same."""
    from synclib.engine import DecodeStream, Engine

    peaks, rows = [], []
    real_stream, real_step = Engine.stream, DecodeStream.step

    def stream(self, **kw):
        st = real_stream(self, **kw)
        peaks.append(st)
        return st

    def step(self):
        out = real_step(self)
        rows.append(len(self._rows) + len(out))
        return out

    first = [len(lm.encode(lm.chat_prompt(render_prompt(t, 0, [], v)))) for lm in pair
             for t in (load_tasks("embedded")[i] for i in (0, 3)) for v in ("active", "tom")]
    budget = 2 * (max(first) + 200)  # the prompts grow with the dialog: two or three rows at a time
    most = budget // (min(first) + 8 - 1)  # rows of the shortest prompts that fit (max_new_tokens 8)
    stats = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "stream", stream)
        mp.setattr(DecodeStream, "step", step)
        y = open_cube(_simulate(pair, tmp_path / "budget.nc", 2, stats=stats, kv_tokens=budget), chunks=None)
    assert all(0 < st.stats["kv_reserved_peak"] <= budget for st in peaks)
    assert stats["kv_reserved_peak"] == sum(st.stats["kv_reserved_peak"] for st in peaks)  # both models summed
    assert all(st.capacity == 8 for st in peaks)  # two parts' genuine and ToM dialogs: the budget decides
    assert 2 <= max(rows) <= most < 8  # where eight could
    _assert_same_cube(four_parts["cube"], y)


def test_a_writer_error_reaches_the_caller_and_a_resume_writes_only_the_missing_parts(pair, four_parts, tmp_path,
                                                                                      monkeypatch):
    """The second part's write fails in the writer's thread: ``simulate`` raises that error with
    its message, the parts written before it stay; the same call again plays and writes only
    the parts missing, and the cube is the uninterrupted run's."""
    out = tmp_path / "crash.nc"
    real, written = CubeWriter.write_part, []

    def failing(self, part_id, units):
        if part_id == 1:
            raise OSError("no space left on device while writing part 1")
        written.append(part_id)
        return real(self, part_id, units)

    monkeypatch.setattr(CubeWriter, "write_part", failing)
    with pytest.raises(OSError, match="no space left on device while writing part 1"):
        _simulate(pair, out, 1)
    kept = sorted(int(f.stem.split("-")[1]) for f in parts_dir(out).glob("part-*.nc"))
    assert kept == sorted(written) and 0 in kept and 1 not in kept and not out.exists()
    assert not list(parts_dir(out).glob("*.tmp"))

    resumed = []

    def recording(self, part_id, units):
        resumed.append(part_id)
        return real(self, part_id, units)

    monkeypatch.setattr(CubeWriter, "write_part", recording)
    _simulate(pair, out, 1)
    assert sorted(resumed) == sorted(set(range(4)) - set(kept))
    _assert_same_cube(four_parts["cube"], open_cube(out, chunks=None))
