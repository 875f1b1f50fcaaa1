"""Where a decoding step's time goes: synclib's engine against plain loops, per SDPA backend.

The 2026-11-22 H100 session (``bench/gpu_notes.md``) measured synclib's decoding step of a
Mistral-7B-shaped model at 80-90 ms for every batch size from 16 to 256, a bare model-forward
loop on the same cache at 30-36 ms, and ``transformers`` ``generate`` at about 26 ms (batch
64), with the GPU 8-15 % busy: host-bound, and not by the forward alone.  This script times,
for batch sizes ``--batch-sizes`` and each scaled-dot-product-attention backend choice:

``engine``   :meth:`synclib.engine.Engine.generate` (prefill subtracted: two lengths), once per
           decoding mode of ``--decode-modes`` (``dynamic``: the growing cache; ``graph``:
           preallocated cache, each step one CUDA-graph replay; ``engine_step_ms_<mode>``)
``forward``  the model's forward on the prefilled cache, mask and positions as the engine passes them
``generate`` ``transformers`` ``generate`` on the same prompts

Backends: ``default`` (PyTorch's choice), ``no-cudnn`` (flash, memory-efficient, math) and
``efficient`` (memory-efficient only).  With ``--torch-profile`` it also prints the top
operators of eight engine steps.  Results as JSON (default
``bench/results/profile_decode_<device>.json``).

    python bench/profile_decode.py --device cuda
    python bench/profile_decode.py --device cpu --preset tiny --batch-sizes 1,4 --prompt-tokens 64
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (str(HERE.parent), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402

from bench_simulate import build_random_model, fixed_length_prompts, machine_info  # noqa: E402


def backends(name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "default":
        return contextlib.nullcontext()
    if name == "no-cudnn":
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    if name == "efficient":
        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    raise ValueError(name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", choices=("mistral7b", "tiny"), default=None)
    ap.add_argument("--batch-sizes", default="1,16,64,128")
    ap.add_argument("--prompt-tokens", type=int, default=900)
    ap.add_argument("--steps", type=int, default=32, help="decoding steps timed")
    ap.add_argument("--backends", default="default,no-cudnn,efficient")
    ap.add_argument("--decode-modes", default="dynamic,graph")
    ap.add_argument("--torch-profile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from synclib.engine import Engine, Request
    from synclib.engine.forward import forward

    dev = args.device
    cuda = dev.startswith("cuda")
    preset = args.preset or ("mistral7b" if cuda else "tiny")
    lm, info = build_random_model(preset, dev, torch.bfloat16 if cuda else torch.float32)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(fn):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t

    rows = []
    for backend in args.backends.split(","):
        for B in (int(b) for b in args.batch_sizes.split(",")):
            prompts = fixed_length_prompts(lm, B, args.prompt_tokens)
            ids = torch.tensor(prompts, device=dev)
            reqs = [Request(p, seed=i) for i, p in enumerate(prompts)]
            r = {"backend": backend, "batch": B}
            with backends(backend):
                # transformers generate first: it samples with the CUDA generator, which a
                # failed graph capture (reported in graph_error) would leave unusable
                def hf(n):
                    with torch.inference_mode():
                        lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                          temperature=0.7, max_new_tokens=n, min_new_tokens=n,
                                          pad_token_id=lm.pad_token_id)

                try:
                    hf(2)
                    r["generate_step_ms"] = round(1000 * (timed(lambda: hf(2 + args.steps))
                                                          - timed(lambda: hf(2))) / args.steps, 2)
                except RuntimeError as exc:
                    r["generate_error"] = f"{type(exc).__name__}: {exc}"
                for mode in args.decode_modes.split(","):
                    if mode == "graph" and not cuda:
                        continue
                    eng = Engine(lm, max_rows=B, kv_reuse=False, decode=mode)
                    eng.generate(reqs, max_new_tokens=4)  # warm-up
                    short = timed(lambda: eng.generate(reqs, max_new_tokens=2))
                    long = timed(lambda: eng.generate(reqs, max_new_tokens=2 + args.steps))
                    r[f"engine_step_ms_{mode}"] = round(1000 * (long - short) / args.steps, 2)
                    if mode == "graph":
                        r["graph_fallbacks"] = int(eng.stats["graph_fallbacks"])
                        r["graph_error"] = eng.graph_error
                    eng = None
                eng = Engine(lm, max_rows=B, kv_reuse=False, decode="dynamic")
                pre = eng._prefill([(p, None) for p in prompts])
                state = {"cache": pre.cache, "mask": pre.mask, "pos": pre.next_pos}
                tok = torch.zeros(B, dtype=torch.long, device=dev)

                def loop():
                    for _ in range(args.steps):
                        state["mask"] = torch.cat([state["mask"], state["mask"].new_ones((B, 1))], 1)
                        with torch.inference_mode():
                            _, state["cache"] = forward(lm.model, tok[:, None], state["mask"], state["pos"][:, None],
                                                        state["cache"], last_only=True)
                        state["pos"] = state["pos"] + 1

                r["forward_step_ms"] = round(1000 * timed(loop) / args.steps, 2)
                pre = state = None  # free the cache before the next backend

            print(json.dumps(r), flush=True)
            rows.append(r)
            if cuda:
                torch.cuda.empty_cache()
    prof_text = None
    if args.torch_profile:
        from torch.profiler import ProfilerActivity, profile

        B = int(args.batch_sizes.split(",")[-1])
        prompts = fixed_length_prompts(lm, B, args.prompt_tokens)
        eng = Engine(lm, max_rows=B, kv_reuse=False, decode="dynamic")
        pre = eng._prefill([(p, None) for p in prompts])  # noqa: F841 - warm
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            eng.generate([Request(p, seed=i) for i, p in enumerate(prompts)], max_new_tokens=8)
        prof_text = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        print(prof_text)
    res = {"benchmark": "profile_decode", "machine": machine_info(dev), "model": info,
           "prompt_tokens": args.prompt_tokens, "steps": args.steps, "rows": rows, "torch_profile": prof_text,
           "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(args.out) if args.out else HERE / "results" / f"profile_decode_{dev.split(':')[0]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
