"""Engine throughput on CPU with the embedded SmolLM2: one-at-a-time vs batched, with and
without key/value reuse, on the same dialogs.

A miniature dialog loop (the protocol's, with a small ``max_new_tokens``) plays
``--episodes`` tasks of the embedded scenario set for ``--utterances`` utterances, in
each of these modes:

* ``one_at_a_time``: batch size 1, no KV reuse (every prompt re-read from scratch; the
  paper's reference code does this through ``generate``);
* ``one_at_a_time_kv``: batch size 1, KV reuse;
* ``batched``: all episodes in one batch, no KV reuse;
* ``batched_kv``: all episodes in one batch, KV reuse (synclib's default).

Sampling is seeded per row (:func:`synclib.engine.row_seed`), so all modes play the
same dialogs up to float near-ties (checked: ``same_texts_as_first_mode`` and
``utterances_equal_to_first_mode``; a near-tie flip makes the rest of that dialog differ,
see :mod:`synclib.engine`).  Also measured: loading the model
from synclib's de-quantised cache in a fresh process (the first load, which builds the
cache, is not timed here).

Usage::

    python bench/bench_engine.py [--episodes 4] [--utterances 4] [--max-new-tokens 12] [--threads N]

Writes ``bench/results/engine_cpu.json``.  Default run: about 3 minutes on 2 idle CPU cores
(``load_average_before_after`` in the JSON tells whether the machine was busy).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOAD_SNIPPET = """
import time, sys
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
import torch, transformers
from synclib.models import load_model
t1 = time.perf_counter()
lm = load_model({model!r})
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def prompts_for(lm, tasks, histories, agent):
    from synclib.tasks.prompts import render_prompt

    return [lm.chat_prompt(render_prompt(task, agent, hist, "active")) for task, hist in zip(tasks, histories)]


def play(lm, tasks, utterances, max_new_tokens, batch_size, kv_reuse):
    """Run the dialog loop; return (texts per episode, seconds, engine stats)."""
    from synclib.engine import Engine, Request, row_seed
    from synclib.tasks.prompts import postprocess_reply

    eng = Engine(lm, max_rows=batch_size, kv_reuse=kv_reuse)
    histories = [[] for _ in tasks]
    t0 = time.perf_counter()
    for t in range(utterances):
        agent = t % 2
        prompts = prompts_for(lm, tasks, histories, agent)
        reqs = [Request(p, seed=row_seed(0, task.index, t), session=(task.index, agent))
                for p, task in zip(prompts, tasks)]
        for res, hist in zip(eng.generate(reqs, max_new_tokens=max_new_tokens, temperature=0.7), histories):
            hist.append(postprocess_reply(res.text))
    return histories, time.perf_counter() - t0, dict(eng.stats)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="model spec (default: embedded SmolLM2)")
    ap.add_argument("--episodes", type=int, default=4, help="tasks played at once (default 4)")
    ap.add_argument("--utterances", type=int, default=4, help="utterances per episode (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=12, help="new tokens per utterance (default 12)")
    ap.add_argument("--modes", default="one_at_a_time,one_at_a_time_kv,batched,batched_kv",
                    help="comma-separated modes to run")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's choice). On a busy machine 1 thread can be "
                         "much faster than 2: OpenMP workers spin while waiting for a core")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine_cpu.json"),
                    help="output JSON path")
    args = ap.parse_args(argv)

    import torch

    from synclib.models import load_model
    from synclib.tasks.scenarios import load_tasks

    if args.threads is not None:
        if args.threads < 1:
            ap.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    env = dict(os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))
    load = subprocess.run([sys.executable, "-c", LOAD_SNIPPET.format(root=str(ROOT), model=args.model)],
                          capture_output=True, text=True, env=env)
    if load.returncode != 0:
        print(load.stderr, file=sys.stderr)
        return 1
    import_s, load_s = map(float, load.stdout.split()[-2:])

    lm = load_model(args.model)
    tasks = list(load_tasks("embedded").tasks)[: args.episodes]
    modes = {"one_at_a_time": (1, False), "one_at_a_time_kv": (1, True),
             "batched": (args.episodes, False), "batched_kv": (args.episodes, True)}
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in chosen:
        if m not in modes:
            ap.error(f"--modes: unknown mode {m!r}; choose from {', '.join(modes)}")

    results, first_texts = {}, None
    n_utt = args.episodes * args.utterances
    for mode in chosen:
        bs, kv = modes[mode]
        texts, secs, stats = play(lm, tasks, args.utterances, args.max_new_tokens, bs, kv)
        first_texts = texts if first_texts is None else first_texts
        results[mode] = {
            "batch_size": bs, "kv_reuse": kv, "seconds": round(secs, 2),
            "utterances": n_utt, "utterances_per_s": round(n_utt / secs, 3),
            "prefill_tokens": stats.get("prefill_tokens", 0),
            "reused_prompt_tokens": stats.get("reused_tokens", 0),
            "generated_tokens": stats.get("generated_tokens", 0),
            "same_texts_as_first_mode": texts == first_texts,
            "utterances_equal_to_first_mode": sum(a == b for x, y in zip(texts, first_texts)
                                                  for a, b in zip(x, y)),
        }
        print(f"{mode:18s} {secs:7.1f}s  {n_utt / secs:6.3f} utt/s  prefill {results[mode]['prefill_tokens']}"
              f"  reused {results[mode]['reused_prompt_tokens']}", flush=True)

    base = results.get("one_at_a_time", {}).get("utterances_per_s")
    out = {
        "benchmark": "engine_cpu",
        "model": args.model,
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "settings": {"episodes": args.episodes, "utterances_per_episode": args.utterances,
                     "max_new_tokens": args.max_new_tokens, "temperature": 0.7,
                     "scenarios": "embedded", "mean_prompt_tokens": None},
        "load_from_cache_s": round(load_s, 2),
        "import_torch_transformers_s": round(import_s, 2),
        "modes": results,
        "speedup_vs_one_at_a_time": {m: round(r["utterances_per_s"] / base, 2) for m, r in results.items()}
        if base else {},
    }
    prompts = prompts_for(lm, tasks, [[] for _ in tasks], 0)
    out["settings"]["mean_prompt_tokens"] = round(sum(len(lm.encode(p)) for p in prompts) / len(prompts), 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
