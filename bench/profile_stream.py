"""Profile: one decoding step of a refilled stream's slots against a batch's that is not refilled.

At the Mistral-7B shape on a GPU the continuous stream took 46 % fewer decoding steps than
the turn-by-turn batches but only 4 % less time (``scheduling_cuda.json``).  This script
times, on random prompts of one length and a fixed number of new tokens (no line stop, so
every row decodes every step):

* ``generate``: :meth:`synclib.engine.Engine.generate` of ``rows`` requests (one batch of a
  stream that is not refilled, its slots, ``engine.fixed.FixedSlots``, grown to the ``rows``
  rows; one CUDA-graph replay a step on CUDA);
* ``stream``: the same requests submitted to :meth:`Engine.stream` at once and stepped to the end
  (``FixedSlots`` of capacity ``--capacity``, so free slots run too);
* ``prefill``: the same requests read (:meth:`Engine.read_states`: the prefill alone).

Per mode and row count: wall seconds, decoding steps, and the step time
``(wall - prefill) / steps`` in ms.  Writes ``bench/results/profile_stream_<device>.json``.

    python bench/profile_stream.py --device cuda --preset mistral7b     # a GPU
    python bench/profile_stream.py                                      # CPU check, tiny model
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (HERE.parent, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402

from bench_simulate import build_random_model, machine_info  # noqa: E402


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default=None, help="mistral7b (default on CUDA) or tiny")
    ap.add_argument("--rows", default="16,64", help="comma list of row counts")
    ap.add_argument("--capacity", type=int, default=64, help="the stream's slots")
    ap.add_argument("--prompt-tokens", type=int, default=900)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from synclib.engine import Engine, Request

    preset = args.preset or ("mistral7b" if args.device.startswith("cuda") else "tiny")
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    lm, info = build_random_model(preset, args.device, dtype)
    g = torch.Generator().manual_seed(0)
    rows_list = [int(r) for r in args.rows.split(",")]
    prompts = [torch.randint(3, 30000, (args.prompt_tokens,), generator=g).tolist() for _ in range(max(rows_list))]
    kw = dict(max_new_tokens=args.new_tokens, temperature=0.7, first_line_only=False)

    def timed(fn):
        _sync(args.device)
        t = time.perf_counter()
        out = fn()
        _sync(args.device)
        return out, time.perf_counter() - t

    def run_generate(n, new):
        eng = Engine(lm, max_rows=max(rows_list), kv_reuse=False)
        _, wall = timed(lambda: eng.generate([Request(p, seed=i) for i, p in enumerate(prompts[:n])],
                                             **{**kw, "max_new_tokens": new}))
        return wall, dict(eng.stats)

    def run_prefill(n):
        eng = Engine(lm, max_rows=max(rows_list), kv_reuse=False)
        _, wall = timed(lambda: eng.read_states(prompts[:n]))
        return wall

    def run_stream(n):
        eng = Engine(lm, max_rows=args.capacity, kv_reuse=False)

        def go():
            st = eng.stream(capacity=args.capacity, join_min=1, **kw)
            for i, p in enumerate(prompts[:n]):
                st.submit(i, Request(p, seed=i))
            done = 0
            while len(st):
                done += len(st.step())
            return done

        _, wall = timed(go)
        return wall, dict(eng.stats)

    run_generate(2, 4)  # warm-up: kernels, allocator, a first capture
    res = {"preset": preset, "model": info, "capacity": args.capacity, "prompt_tokens": args.prompt_tokens,
           "new_tokens": args.new_tokens, "runs": {}}
    for n in rows_list:
        pre = run_prefill(n)
        r = {"prefill_s": round(pre, 3)}
        for mode in ("generate", "stream"):
            wall, st = run_generate(n, args.new_tokens) if mode == "generate" else run_stream(n)
            steps = st.get("decode_steps", 0)
            r[mode] = {"wall_s": round(wall, 3), "decode_steps": steps, "graph_steps": st.get("graph_steps", 0),
                       "graph_fallbacks": st.get("graph_fallbacks", 0), "forward_calls": st.get("forward_calls", 0),
                       "step_ms": round(1000 * (wall - pre) / max(steps, 1), 2)}
        res["runs"][str(n)] = r
        print(f"[profile] rows {n}: {r}", flush=True)
    res["machine"] = machine_info(args.device)
    res["date"] = time.strftime("%Y-%m-%d")
    out = Path(args.out or HERE / "results" / f"profile_stream_{'cuda' if args.device.startswith('cuda') else 'cpu'}.json")
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
