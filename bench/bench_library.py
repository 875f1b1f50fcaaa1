"""Benchmark: synclib's continuous stream against transformers' continuous batching (issue 52, item 4).

The same first-utterance prompts (every embedded task's first speaker, in the active and the ToM views: distinct
prompts of about 500 tokens with the random models' BPE tokenizer) generated once each, replies
ending at their first line break or at ``--max-new-tokens``, sampled at temperature 0.7 with no
top-k/top-p:

* ``synclib``: :meth:`synclib.engine.Engine.stream` with every prompt submitted at once
  (capacity = the prompts; fixed slots and one CUDA-graph replay a step on CUDA), which also
  records each prompt's last-token states from every layer;
* ``library``: ``model.generate_batch`` (transformers' continuous batching: paged cache,
  block sharing, its own CUDA graphs; every token holding a line break is an end token, where
  ours ends at a line break only after some text), text only; then the states the dialog loop
  needs, read by :meth:`Engine.read_states` on the same prompts (``states_s``), so that
  ``wall_s + states_s`` is the library path's cost.

Each side is warmed up first on four prompts.  Per side: wall seconds, replies, tokens
generated, tokens/s and replies/s.  The two sides sample differently, so their replies
differ in length: compare tokens/s.  Writes ``bench/results/library_<device>.json``.

    python bench/bench_library.py --device cuda        # the 7B shape, 128 prompts (a GPU)
    python bench/bench_library.py                      # CPU check: tiny model, 16 prompts
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

from bench_simulate import build_random_model, machine_info, sync  # noqa: E402


def first_prompts(lm, n: int) -> list[list[int]]:
    """Token ids of the first ``n`` distinct opening prompts: each embedded task's agent 1 in the
    active view, then in the ToM view."""
    from synclib.tasks.prompts import render_prompt
    from synclib.tasks.scenarios import load_tasks

    tasks = list(load_tasks("embedded"))
    prompts = [lm.encode(lm.chat_prompt(render_prompt(t, 0, [], view))) for view in ("active", "tom") for t in tasks]
    if n > len(prompts):
        raise ValueError(f"--prompts {n}: the embedded tasks give {len(prompts)} distinct prompts")
    return prompts[:n]


def run_synclib(lm, prompts, max_new_tokens: int, device: str) -> dict:
    from synclib.engine import Engine, Request

    def once(ps):
        eng = Engine(lm, max_rows=len(ps), kv_reuse=False)
        st = eng.stream(max_new_tokens=max_new_tokens, temperature=0.7, first_line_only=True, capacity=len(ps),
                        join_min=len(ps))
        for i, p in enumerate(ps):
            st.submit(i, Request(p, seed=i))
        sync(device)
        t0 = time.perf_counter()
        res = st.run()
        sync(device)
        return time.perf_counter() - t0, [r for _, r in res], eng

    once(prompts[:4])
    wall, res, eng = once(prompts)
    tokens = sum(len(r.token_ids) for r in res)
    return {"wall_s": round(wall, 3), "replies": len(res), "tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
            "replies_per_s": round(len(res) / wall, 2), "decode": eng.decode,
            "decode_steps": eng.stats["decode_steps"], "graph_fallbacks": eng.stats["graph_fallbacks"],
            "seconds": {k: round(v, 3) for k, v in eng.seconds.items()}}


def run_library(lm, prompts, max_new_tokens: int, device: str) -> dict:
    from transformers import GenerationConfig

    from synclib.engine import Engine

    eng = Engine(lm, max_rows=len(prompts), kv_reuse=False)
    ends = [int(i) for i in torch.nonzero(eng._line_flags(len(lm.tokenizer))[0]).flatten().tolist()]
    ends = sorted(set(ends) | set(lm.stop_token_ids) | {int(lm.tokenizer.eos_token_id)})
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=0.7, top_k=0, top_p=1.0,
                           eos_token_id=ends, pad_token_id=lm.pad_token_id)

    def once(ps):
        sync(device)
        t0 = time.perf_counter()
        out = lm.model.generate_batch(inputs=ps, generation_config=cfg, progress_bar=False)
        sync(device)
        return time.perf_counter() - t0, out

    once(prompts[:4])
    wall, out = once(prompts)
    tokens = sum(len(o.generated_tokens) for o in out.values())
    failed = sum(o.error is not None for o in out.values())
    sync(device)
    t0 = time.perf_counter()
    states = eng.read_states(prompts)
    sync(device)
    read = time.perf_counter() - t0
    return {"wall_s": round(wall, 3), "replies": len(out), "failed": failed, "tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1), "replies_per_s": round(len(out) / wall, 2),
            "attn_implementation": getattr(lm.model.config, "_attn_implementation", None),
            "states_s": round(read, 3), "states_shape": list(states.shape),
            "with_states_replies_per_s": round(len(out) / (wall + read), 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default=None, help="mistral7b (default on CUDA) or tiny")
    ap.add_argument("--prompts", type=int, default=None, help="default: 128 on CUDA, 16 on the CPU")
    ap.add_argument("--max-new-tokens", type=int, default=300)
    ap.add_argument("--newline-every", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    preset = args.preset or ("mistral7b" if cuda else "tiny")
    dtype = torch.bfloat16 if cuda else torch.float32
    lm, info = build_random_model(preset, args.device, dtype, newline_every=args.newline_every)
    prompts = first_prompts(lm, args.prompts or (128 if cuda else 16))
    results = {"synclib": run_synclib(lm, prompts, args.max_new_tokens, args.device)}
    print(f"[bench] synclib: {results['synclib']}", file=sys.stderr, flush=True)
    try:
        results["library"] = run_library(lm, prompts, args.max_new_tokens, args.device)
    except Exception as exc:  # noqa: BLE001 - record why the library path did not run
        results["library"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    print(f"[bench] library: {results['library']}", file=sys.stderr, flush=True)
    record = {"benchmark": "library", "model": info,
              "settings": {"prompts": len(prompts), "prompt_tokens_mean": round(sum(map(len, prompts)) / len(prompts), 1),
                           "max_new_tokens": args.max_new_tokens, "temperature": 0.7},
              "results": results, "machine": machine_info(args.device), "date": time.strftime("%Y-%m-%d")}
    out = Path(args.out or HERE / "results" / f"library_{'cuda' if cuda else 'cpu'}.json")
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
