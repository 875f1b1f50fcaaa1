"""The entry point :func:`simulate`: load the pair, lay out the cube, play its parts, write them (in the
background) and finish it."""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

from synclib import __version__
from synclib.cube import CubeSpec, CubeWriter, check_passive_seeds, is_complete
from synclib.memory import CacheBudget, session_budget
from synclib.models import load_model
from synclib.simulate.options import Batching, Passes, RunOptions, Sampling
from synclib.simulate.runner import _Progress, _Runner
from synclib.tasks.prompts import ACTIONS, EMOTIONS, PASSIVE_PERSONA_RULE, passive_persona
from synclib.tasks.scenarios import Task, TaskSet

__all__ = ["simulate", "episode_coords"]


def episode_coords(task: Task) -> dict:
    """The cube's episode coordinates of one task."""
    a, b = task.agents
    return dict(task_index=int(task.index), env_id=task.env.pk, codename=task.codename,
                source=task.source, relationship=int(task.relationship),
                agent1_id=a.pk, agent2_id=b.pk, agent1_name=a.name, agent2_name=b.name)


def _as_model(m, dtype, device, prompt_format="chat_template"):
    if isinstance(m, str):
        return load_model(m, dtype=dtype, device=device, prompt_format=prompt_format)
    return m


def _check_run(max_utterances, seeds: list, passes: Passes) -> None:
    """The checks across groups, before any model is loaded; the message names the parameter."""
    if isinstance(max_utterances, bool) or not isinstance(max_utterances, int) or max_utterances < 1:
        raise ValueError(f"max_utterances must be an integer >= 1, got {max_utterances!r}")
    if not seeds:
        raise ValueError("seeds: no seeds")
    try:
        check_passive_seeds(passes.passive_seeds, seeds)
    except ValueError as exc:
        raise ValueError(f"Passes.{exc}") from None


def _load_pair(model_a, model_b, dtype, device, prompt_formats) -> tuple:
    """The two agents' models; the same spec in the same format is loaded once."""
    lm_a = _as_model(model_a, dtype, device, prompt_formats[0])
    same = model_b is model_a or (isinstance(model_b, str) and model_b == model_a
                                  and prompt_formats[0] == prompt_formats[1])
    return lm_a, (lm_a if same else _as_model(model_b, dtype, device, prompt_formats[1]))


def _add_engine_stats(engine_stats: dict, engines) -> None:
    """Add to ``engine_stats`` the engines' counters (each once), budgets' peaks and ``seconds_<category>`` times."""
    for eng in {id(e): e for e in engines}.values():
        for k, v in eng.stats.items():
            engine_stats[k] = engine_stats.get(k, 0) + int(v)
        for k, v in eng.seconds.items():
            engine_stats[f"seconds_{k}"] = round(engine_stats.get(f"seconds_{k}", 0) + v, 3)
    budgets = {id(e.budget): e.budget for e in engines}.values()
    engine_stats["cache_peak_bytes"] = engine_stats.get("cache_peak_bytes", 0) + sum(b.peak for b in budgets)


def _play(runner: _Runner, writer: CubeWriter, units: list, units_per_part: int, progress: bool,
          engine_stats: dict | None) -> Path:
    """Play the parts of ``units`` the cube does not hold yet (:meth:`_Runner.play`), each written in the background
    as soon as it ends; the finished cube.  If the loop fails, the part being written is still written whole."""
    parts = [units[i:i + units_per_part] for i in range(0, len(units), units_per_part)]
    todo = [(b, part) for b, part in enumerate(parts)
            if not (writer.has_part(b) and all(u in writer.done for u in part))]
    planned = sum(runner.planned(u) for u in units)
    runner.progress = _Progress(planned, planned - sum(runner.planned(u) for _, p in todo for u in p),
                                f"simulate {writer.path.name}", progress)
    try:
        runner.play(todo, writer)
        with runner.engines[0].timed("cube"):
            return writer.finalize()
    except BaseException:
        with contextlib.suppress(Exception):
            writer.wait()  # the part being written ends whole; the loop's own error goes on
        raise
    finally:
        runner.progress.close()
        if engine_stats is not None:
            _add_engine_stats(engine_stats, runner.engines)


def simulate(model_a, model_b, tasks, seeds, out, *, max_utterances: int = 16, sampling: Sampling = Sampling(),
             passes: Passes = Passes(), batching: Batching = Batching(), options: RunOptions = RunOptions()) -> Path:
    """Run model A (agent 1) against model B (agent 2) and write a cube.

    Parameters
    ----------
    model_a, model_b : str or LoadedModel
        Model specs (see :func:`synclib.models.load_model`) or loaded models; the same spec is loaded once.
    tasks : TaskSet or sequence of Task
        The episodes; their ``index`` is the cube's ``episode`` coordinate.
    seeds : sequence of int
        Simulation seeds (``sim_seed``).
    out : path of the ``.nc`` cube
    max_utterances : int, default 16
        Utterances per dialog, both agents.
    sampling, passes, batching : Sampling, Passes, Batching
        See :mod:`synclib.simulate.options`; no passes by default.  Sessions that do not fit ``batching.cache_gib``
        are recomputed (``engine_stats["recomputed_tokens"]``); on CUDA ``"auto"`` leaves each engine its own share
        of the device memory.
    options : RunOptions
        Its ``engine_stats``, when a dict, is filled with this call's engine counters, both models summed
        (``prefill_tokens``, ``reused_tokens``, ..., ``cache_peak_bytes``, ``kv_reserved_peak``), and wall seconds
        ``seconds_decode``/``_join``/``_read``/``_probe``/``_cube`` (the last: the loop's time lost waiting for the
        part being written and the finalisation).

    Returns the finished cube's path; a re-run after a crash plays only the parts not written.
    """
    out = Path(out)
    seeds = [int(s) for s in seeds]
    _check_run(max_utterances, seeds, passes)
    taskset = passes.taskset if passes.taskset is not None else (tasks if isinstance(tasks, TaskSet) else None)
    tasks = list(tasks)
    if not tasks:
        raise ValueError("no tasks to simulate")
    tom, passive = passes.tom, passes.passive
    tom_tasks = None if not tom or passes.tom_episodes is None else {t.index for t in tasks[:passes.tom_episodes]}
    budget = session_budget(batching.cache_gib)  # measured before any model loads
    if is_complete(out) and not options.overwrite:
        return out
    lm_a, lm_b = _load_pair(model_a, model_b, options.dtype, options.device, tuple(options.prompt_formats))
    per_agent = (sampling.for_model(lm_a), sampling.for_model(lm_b))
    batching = batching.resolve(out, lm_a.device)
    spec = _cube_spec(lm_a, lm_b, tasks, seeds, passes=passes, store_dtype=options.store_dtype, sampling=[s.filters for s in per_agent], attrs=dict(
                          temperature=float(sampling.temperature), max_new_tokens=int(sampling.max_new_tokens),
                          max_utterances=int(max_utterances), units_per_part=int(batching.units_per_part),
                          scheduling=batching.scheduling, stop_at_first_line=bool(sampling.stop_at_first_line),
                          reply_end=str(sampling.reply_end),
                          tom_episodes=len(tom_tasks) if tom_tasks is not None else (len(tasks) if tom else 0),
                          passive_persona_rule=PASSIVE_PERSONA_RULE if taskset is not None
                          else "the reader is told it is the agent it replaces"))
    writer = CubeWriter(out, spec, overwrite=options.overwrite)
    units = spec.units()
    readers = {} if not passive or taskset is None else {
        (e, s): passive_persona(taskset, e, s) for e, s in units if s in spec.read_passive_seeds()}

    shared = None if lm_a.device.type == "cuda" and batching.cache_gib == "auto" else CacheBudget(budget)
    runner = _Runner((lm_a, lm_b), spec, {t.index: t for t in tasks}, max_utterances=max_utterances,
                     sampling=per_agent, batching=batching, readers=readers, tom_tasks=tom_tasks,
                     cache_budget=shared)
    for eng in runner.engines:
        eng.sync_timing = bool(options.sync_timing)
    return _play(runner, writer, units, batching.units_per_part, options.progress, options.engine_stats)


def _cube_spec(lm_a, lm_b, tasks, seeds, *, passes: Passes, store_dtype, sampling, attrs) -> CubeSpec:
    """The cube's layout and identity: shapes, models, every generation setting (``passes``: which readers and
    dialogs beside the genuine ones)."""
    import torch

    passive, tom = passes.passive, passes.tom
    passive_seeds = None if passes.passive_seeds is None else list(passes.passive_seeds)
    models = {}
    for side, lm, samp in (("a", lm_a, sampling[0]), ("b", lm_b, sampling[1])):
        models.update({f"model_{side}": lm.name, f"model_{side}_source": getattr(lm, "source", ""),
                       f"torch_dtype_{side}": str(lm.dtype).replace("torch.", ""),
                       f"prompt_format_{side}": getattr(lm, "prompt_format", "chat_template"),
                       f"top_k_{side}": samp["top_k"] or 0, f"top_p_{side}": samp["top_p"] or 1.0})
    spec = CubeSpec(
        episodes=[episode_coords(t) for t in tasks], seeds=seeds,
        n_rounds=math.ceil(attrs["max_utterances"] / 2),
        n_layers_a=lm_a.n_layers, d_model_a=lm_a.d_model,
        n_layers_b=lm_b.n_layers, d_model_b=lm_b.d_model,
        passive=passive, tom=tom, emotions=EMOTIONS, actions=ACTIONS, store_dtype=store_dtype,
        passive_seeds=passive_seeds if passive else None, passive_own=bool(passive and passes.passive_own),
        attrs=dict(**models, **attrs, synclib_version=__version__, torch_version=torch.__version__,
                   protocol="protocol.md (Sotopia dialog loop, last-prompt-token states)"),
    )
    if not tom:  # the word lists only matter for ToM cubes; keep the spec minimal
        spec.emotions, spec.actions = [], []
    return spec

