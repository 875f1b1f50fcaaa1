"""Benchmark: the dialog loop turn by turn against continuous batching (issue 25, CPU part).

The same ``synclib.simulate`` call (passive reader and ToM dialogs included) twice, with
``scheduling="turns"`` (every dialog of a batch waits for the batch's longest reply) and
``scheduling="continuous"`` (:class:`synclib.engine.DecodeStream`: a dialog's next
utterance joins the running batch as soon as its reply ends).  Per mode: wall time,
utterances per second, decoding steps and rows per step (the batch's occupancy),
prefill tokens against the token positions computed (left padding included), prompt
tokens reused from session caches; and between the modes: the share of identical texts
and the largest state and ToM-distribution differences (they must agree up to float
rounding; for reference, the turn-by-turn loop at half the batch size against the
full one: in bfloat16, which rows share a batch already changes the rounding).  Written to ``bench/results/scheduling_cpu.json`` (``--device cuda``:
``scheduling_cuda.json``); the benchmarks page quotes it.

Models (``--presets``): ``smollm2`` (the embedded SmolLM2-135M-Instruct), ``gemma3``
(the embedded Gemma-3-270M), ``tiny`` (a random-init Mistral-shaped model built from a
config, 4 layers x 256, float32, its BPE tokenizer making a reply line end after about 8
tokens; see ``bench_simulate.py``), ``mistral7b`` (the same at the Mistral-7B shape, for a GPU).

Usage::

    python bench/bench_scheduling.py                          # smollm2 and tiny, 16 tasks
    python bench/bench_scheduling.py --presets smollm2 --tasks 32 --batch-size 32
    python bench/bench_scheduling.py --device cuda --presets mistral7b --tasks 32 --batch-size 64 \
        --max-new-tokens 300 --newline-every 64           # the GPU comparison (make bench-gpu)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (REPO, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_simulate import build_random_model, machine_info  # noqa: E402

from synclib.run.bench import loop_summary  # noqa: E402

MODES = ("turns", "continuous")


def _model(preset: str, device: str, dtype, newline_every: int):
    from synclib.models import load_model

    if preset in ("smollm2", "gemma3"):
        lm = load_model({"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}[preset], dtype=dtype, device=device)
        return lm, {"preset": preset, "n_layers": lm.n_layers, "d_model": lm.d_model, "dtype": str(lm.dtype)}
    if preset == "mistral7b":  # the GPU comparison: random weights of the Mistral-7B shape
        return build_random_model("mistral7b", device, dtype, newline_every=newline_every)
    # float32: a random model's next-token distribution is nearly flat over 32,000 tokens, so
    # bf16 rounding of its logits moves almost every sample; in float32 both modes agree
    return build_random_model("tiny", device, torch.float32, newline_every=newline_every)


def _agreement(a, b) -> dict:
    texts = [n for n in a.data_vars if n.startswith("text_")]
    same = sum(int((a[n].values == b[n].values).sum()) for n in texts)
    total = sum(a[n].size for n in texts)
    out = {"identical_text_share": round(same / total, 6)}
    for prefix in ("hidden_", "emotion_", "action_"):
        names = [n for n in a.data_vars if n.startswith(prefix)]
        diffs = [np.nanmax(np.abs(a[n].values.astype(np.float64) - b[n].values.astype(np.float64)))
                 for n in names if np.isfinite(a[n].values).any()]
        out[f"max_abs_diff_{prefix.rstrip('_')}"] = float(max(diffs)) if diffs else None
    return out


def run(preset: str, tasks: int, batch_size: int, device: str, dtype, tmp: Path, max_new_tokens: int = 24,
        newline_every: int = 8, half_batch: bool = True, modes=MODES, seeds=(0,), sync_timing=False,
        kv_tokens: int | None = None) -> dict:
    from synclib.cube import open_cube
    from synclib.tasks.scenarios import load_tasks
    from synclib.simulate import Batching, Passes, RunOptions, Sampling, simulate

    lm, info = _model(preset, device, dtype, newline_every)
    sel = list(load_tasks("embedded"))[:tasks]
    out = {"model": info, "modes": {}}
    cubes = {}
    for mode in modes:
        stats: dict = {}
        t0 = time.perf_counter()
        path = simulate(lm, lm, sel, list(seeds), tmp / f"{preset}-{mode}.nc", max_utterances=16,
                        sampling=Sampling(max_new_tokens=max_new_tokens, temperature=0.7),
                        passes=Passes(passive=True, tom=True),
                        batching=Batching(units_per_part=batch_size, scheduling=mode,
                                          kv_tokens=kv_tokens if mode == "continuous" else None),
                        options=RunOptions(progress=False, engine_stats=stats, sync_timing=sync_timing))
        wall = time.perf_counter() - t0
        cube = cubes[mode] = open_cube(path, chunks=None)
        utt = int(cube["n_utterances"].values.sum() + cube["n_utterances_tom"].values.clip(0).sum())
        out["modes"][mode] = loop_summary(stats, wall, utt)
        print(f"[bench] {preset} {mode}: {out['modes'][mode]}", file=sys.stderr, flush=True)
    if len(cubes) < 2:
        return out
    out["agreement"] = _agreement(cubes["turns"], cubes["continuous"])
    out["speedup"] = round(out["modes"]["turns"]["wall_s"] / out["modes"]["continuous"]["wall_s"], 3)
    if not half_batch:
        return out
    # the reference for that agreement: the same loop turn by turn at half the batch size
    # (other rows share each batch; in bf16 that alone changes the rounding, then the samples)
    half = simulate(lm, lm, sel, list(seeds), tmp / f"{preset}-half.nc", max_utterances=16,
                    sampling=Sampling(max_new_tokens=max_new_tokens, temperature=0.7),
                    passes=Passes(passive=True, tom=True),
                    batching=Batching(units_per_part=max(1, batch_size // 2)), options=RunOptions(progress=False))
    out["agreement_turns_half_batch"] = _agreement(cubes["turns"], open_cube(half, chunks=None))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="smollm2,tiny")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=1, help="simulation seeds per task (dialogs = tasks x seeds)")
    ap.add_argument("--sync-timing", action="store_true",
                    help="wait for the device at the end of each timed part (Engine.sync_timing)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--newline-every", type=int, default=8,
                    help="random models: a reply line ends after about this many tokens")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of turns, continuous")
    ap.add_argument("--no-half-batch", action="store_true",
                    help="skip the reference run turn by turn at half the batch size")
    ap.add_argument("--kv-tokens", type=int, default=None,
                    help="continuous: the streams' key/value token budget (simulate.kv_tokens; default none)")
    ap.add_argument("--dtype", default="auto", help="auto: bf16 where the CPU multiplies it natively")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from synclib.models import default_dtype

    dtype = getattr(torch, default_dtype(torch.device(args.device)) if args.dtype == "auto" else args.dtype)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            results[preset] = run(preset, args.tasks, args.batch_size, args.device, dtype, Path(tmp),
                                  args.max_new_tokens, args.newline_every, not args.no_half_batch,
                                  tuple(args.modes.split(",")), range(args.seeds), args.sync_timing,
                                  args.kv_tokens)
    record = {"benchmark": "scheduling", "settings": {"tasks": args.tasks, "seeds": list(range(args.seeds)),
                                                      "max_utterances": 16, "sync_timing": args.sync_timing,
                                                      "cudnn_sdpa_deprioritized": os.environ.get(
                                                          "TORCH_CUDNN_SDPA_DEPRIORITIZED", ""),
                                                      "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
                                                      "kv_tokens": args.kv_tokens,
                                                      "passive": True, "tom": True, "dtype": str(dtype)},
              "results": results, "machine": machine_info(args.device), "date": time.strftime("%Y-%m-%d")}
    out = Path(args.out or HERE / "results" / f"scheduling_{'cuda' if args.device.startswith('cuda') else 'cpu'}.json")
    out.write_text(json.dumps(record, indent=1) + "\n")
    for preset, r in results.items():
        if "speedup" not in r:
            print(f"{preset}: {r['modes']}")
            continue
        t, c = r["modes"]["turns"], r["modes"]["continuous"]
        print(f"{preset}: turns {t['wall_s']} s ({t['rows_per_step']} rows/step), continuous {c['wall_s']} s "
              f"({c['rows_per_step']} rows/step), speed-up {r['speedup']}x; {r['agreement']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
