"""Scoring candidate words and answers on CPU: one pass over a prefix tree against one cache
copy per prefix, on the same prompts, in the same run.

Two places score given token sequences after a prompt (:func:`synclib.engine.continuation_logprobs`):
the Theory-of-Mind read-out of the simulation (8 emotion and 5 action words, each as is and
with a leading space, several of them two or three tokens) and the constrained judge (the
allowed scores of each Sotopia-eval dimension plus the end-of-turn token).  Both paths are
timed here:

* ``prefix_tree`` (synclib's default): a row's candidates' proper prefixes are fed as one
  prefix tree with an explicit attention mask, one forward pass per batch of rows;
* ``per_prefix`` (the fallback for attention implementations without explicit masks): each
  distinct prefix is fed over its own copy of the row's key/value cache.

Workload: a short dialog cube simulated with the embedded SmolLM2 (``--episodes`` tasks x
``--utterances`` utterances).  ToM: every utterance's ToM-view prompt of both agents is
prefilled into its session first (as in the simulation, where the prompt was just
generated from), then the emotion distributions are timed (``tests/reference_engine.py``'s
``word_distributions``: the prompts' sessions, then the words' prefix tree over them), for
each embedded model.  Judge:
``synclib evaluate --mode constrained`` with the embedded SmolLM2 on the cube's first
``--judge-dialogs`` dialogs (14 questions each), a fresh answer cache per path.  Both paths
must give the same numbers up to float rounding (``max_abs_difference``).

Usage::

    python bench/bench_candidates.py [--episodes 4] [--utterances 8] [--judge-dialogs 2]

Writes ``bench/results/candidates_cpu.json`` (about 4.5 minutes on 2 idle cores).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))  # reference_engine: the word distributions the ToM read-out equals

PATHS = ("prefix_tree", "per_prefix")


@contextmanager
def _path(name):
    """Select the candidate-scoring path of :mod:`synclib.engine` for the ``with`` block."""
    from synclib.engine import candidates

    real = candidates.attention_windows
    if name == "per_prefix":
        candidates.attention_windows = lambda config: None
    try:
        yield
    finally:
        candidates.attention_windows = real


def tom_prompts(lm, cube, tasks):
    """The ToM-view prompt of the agent to speak before every utterance of every dialog."""
    import xarray as xr

    from synclib.tasks.prompts import render_prompt

    out = []
    with xr.open_dataset(cube) as ds:
        for e in range(ds.sizes["episode"]):
            task = tasks[int(ds.task_index[e])]
            a, b = (ds[v].isel(episode=e, sim_seed=0).values for v in ("text_a", "text_b"))
            texts = [str(t) for pair in zip(a, b) for t in pair]
            texts = texts[:int(ds.n_utterances.isel(episode=e, sim_seed=0))]
            for t in range(len(texts)):
                out.append((lm.chat_prompt(render_prompt(task, t % 2, texts[:t], "tom")), (e, t % 2)))
    return out


def time_tom(spec, cube, tasks):
    import numpy as np
    from reference_engine import word_distributions

    from synclib.engine import Engine
    from synclib.models import load_model
    from synclib.tasks.prompts import EMOTIONS

    lm = load_model(spec)
    rows = tom_prompts(lm, cube, tasks)
    prompts, sessions = [p for p, _ in rows], [s for _, s in rows]
    res, probs = {}, {}
    for name in PATHS:
        eng = Engine(lm, max_rows=8)
        eng.read_states(prompts, sessions=sessions)  # the sessions hold each prompt, as in simulate
        calls0 = eng.stats["forward_calls"]
        with _path(name):
            t0 = time.perf_counter()
            probs[name] = word_distributions(eng, prompts, EMOTIONS, sessions)
            secs = time.perf_counter() - t0
        res[name] = {"seconds": round(secs, 2), "forward_calls": eng.stats["forward_calls"] - calls0}
        print(f"ToM {spec:14s} {name:12s} {secs:7.2f}s", flush=True)
    lens = [len(lm.encode(p)) for p in prompts]
    return {"model": spec, "prompts": len(prompts), "mean_prompt_tokens": round(float(np.mean(lens)), 1),
            "paths": res, "speedup": round(res["per_prefix"]["seconds"] / res["prefix_tree"]["seconds"], 2),
            "max_abs_difference": float(np.nanmax(np.abs(probs["prefix_tree"] - probs["per_prefix"])))}


def time_judge(cube, dialogs, tmp):
    import numpy as np

    from synclib.judge.evaluate import evaluate_cube
    from synclib.judge.options import JudgeConnection, JudgeOptions

    res, tables = {}, {}
    for name in PATHS:
        with _path(name):
            t0 = time.perf_counter()
            options = JudgeOptions(JudgeConnection("smollm2-135m"), mode="constrained", sample=dialogs)
            tables[name] = evaluate_cube(cube, options,
                                         out=Path(tmp) / f"{name}.judge.csv", cache=Path(tmp) / f"{name}.jsonl",
                                         progress=False, log=lambda msg: None)
            secs = time.perf_counter() - t0
        res[name] = {"seconds": round(secs, 2)}
        print(f"judge {name:12s} {secs:7.2f}s", flush=True)
    a, b = tables["prefix_tree"], tables["per_prefix"]
    return {"judge": "smollm2-135m", "mode": "constrained", "dialogs": dialogs, "scores": len(a),
            "paths": res, "speedup": round(res["per_prefix"]["seconds"] / res["prefix_tree"]["seconds"], 2),
            "same_scores": bool((a.score.values == b.score.values).all()),
            "max_abs_difference_expected_score": float(np.abs(a.expected.values - b.expected.values).max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=4, help="dialogs simulated (default 4)")
    ap.add_argument("--utterances", type=int, default=8, help="utterances per dialog (default 8)")
    ap.add_argument("--judge-dialogs", type=int, default=2, help="dialogs judged per path (default 2)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "candidates_cpu.json"),
                    help="output JSON path")
    args = ap.parse_args(argv)
    for name in ("episodes", "utterances", "judge_dialogs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    import torch

    from synclib.tasks.scenarios import load_tasks
    from synclib.simulate import Passes, RunOptions, Sampling, simulate

    load_before = os.getloadavg()
    taskset = load_tasks("embedded")
    tasks = {t.index: t for t in taskset.tasks}
    with tempfile.TemporaryDirectory() as tmp:
        cube = Path(tmp) / "dialogs.nc"
        t0 = time.perf_counter()
        simulate("smollm2-135m", "smollm2-135m", list(taskset.tasks[:args.episodes]), [0], cube,
                 max_utterances=args.utterances, sampling=Sampling(max_new_tokens=12),
                 passes=Passes(taskset=taskset), options=RunOptions(progress=False))
        print(f"simulated {args.episodes} dialogs in {time.perf_counter() - t0:.1f}s", flush=True)
        tom = [time_tom(spec, cube, tasks) for spec in ("smollm2-135m", "gemma3-270m")]
        judge = time_judge(cube, args.judge_dialogs, tmp)
    out = {
        "benchmark": "candidates_cpu",
        "date": time.strftime("%Y-%m-%d"),
        "device": "cpu",
        "machine": {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__},
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "settings": {"episodes": args.episodes, "utterances_per_episode": args.utterances,
                     "max_new_tokens": 12, "engine_batch_size": 8},
        "tom_emotions": tom,
        "constrained_judge": judge,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
