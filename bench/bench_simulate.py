"""Benchmark: hooked, batched simulation throughput (utterances per second).

Two measurements, written as JSON to ``bench/results/``:

1. ``engine``: :meth:`synclib.engine.Engine.generate` on prompts of a fixed
   length (default ~900 tokens, distinct per row), a fixed number of new tokens
   (default 64, stop tokens disabled so every row generates exactly that many),
   last-prompt-token states of every layer captured; one row at a time and at
   growing batch sizes.  This is the issue's reference measurement (plain HF
   ``generate`` on an H100: 0.36 utterances/s one at a time, 7.9/s at batch 64).
2. ``simulate``: the real dialog loop of :mod:`synclib.simulate` (alternating
   agents, per-session KV reuse, post-processing, termination) over embedded
   Sotopia tasks, ``max_utterances`` 16, with a cube written when netCDF4 is
   installed (otherwise the loop alone; the result says which).  From its rate
   we estimate the paper's workload for one model pair: 450 tasks x 3 seeds x
   16 utterances = 21,600 utterances.

Models (``--preset``):

``mistral7b``
    A random-init Mistral-7B-shaped model (MistralConfig defaults: 32 layers,
    4096 wide, MLP 14336, 32 heads, 8 KV heads, vocabulary 32000; no sliding
    window), bfloat16, built on the device: nothing is downloaded.  Its
    tokenizer is a byte-level BPE trained in-process on the embedded scenario
    texts (no files needed) with a Mistral-style ``[INST] ... [/INST]`` chat
    template, its vocabulary filled up to 32000 with filler tokens so that
    every sampled id decodes to text (dialog histories grow as real ones do).
``tiny``
    The same construction at 4 layers x 256 (checks the script on a CPU).
``smollm2``
    The embedded SmolLM2-135M-Instruct (the CPU comparison of the issue).

Usage::

    python bench/bench_simulate.py --device cuda                  # H100/H200, mistral7b
    python bench/bench_simulate.py --device cpu --preset smollm2 --batch-sizes 1,8 \\
        --prompt-tokens 600 --new-tokens 32 --sim-episodes 4 --sim-seeds 1 --sim-batch 4
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

PAPER_UTTERANCES = 450 * 3 * 16
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")


# ----------------------------------------------------------------------------- models

def scenario_corpus() -> list[str]:
    """Every string in the embedded scenario files (to train the BPE)."""
    out: list[str] = []

    def walk(x):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for f in sorted((REPO / "data" / "scenarios").glob("*.json")):
        walk(json.loads(f.read_text()))
    from synclib.tasks.prompts import LEAVE_INSTRUCTION, TOM_INSTRUCTION

    out += [LEAVE_INSTRUCTION, TOM_INSTRUCTION]
    return out


def build_bpe_tokenizer(vocab_size: int = 32000, newline_every: int = 0):
    """A byte-level BPE trained on the scenario texts, as a transformers tokenizer.

    With ``newline_every`` > 0, one filler token in that many ends with a line break, so
    that a random model's first reply line ends after about that many tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(scenario_corpus() * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="</s>")
    fast.chat_template = MISTRAL_CHAT_TEMPLATE
    # fill the vocabulary with visible filler tokens so that every id the random model
    # samples decodes to text and re-encodes to one token (dialog histories then grow
    # like real ones instead of decoding to nothing)
    fast.add_tokens([f"\u27e8{i}\u27e9" + ("\n" if newline_every and i % newline_every == 0 else "")
                     for i in range(len(fast), vocab_size)])
    return fast


def build_random_model(preset: str, device: str, dtype, seed: int = 0, newline_every: int = 0):
    """A LoadedModel with random weights (``mistral7b`` or ``tiny``), initialised from ``seed``."""
    from transformers import MistralConfig, MistralForCausalLM

    from synclib.models import LoadedModel, find_decoder_layers

    tok = build_bpe_tokenizer(newline_every=newline_every)
    kw = dict(sliding_window=None, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
              pad_token_id=tok.pad_token_id, max_position_embeddings=8192)
    if preset == "tiny":
        kw.update(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2)
    cfg = MistralConfig(**kw)  # defaults: the Mistral-7B shape
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = MistralForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model.eval()
    layers = find_decoder_layers(model)
    lm = LoadedModel(name=f"random-{preset}", model=model, tokenizer=tok, n_layers=len(layers),
                     d_model=cfg.hidden_size, device=torch.device(device), dtype=dtype,
                     decoder_layers=layers, stop_token_ids=frozenset(), pad_token_id=int(tok.pad_token_id),
                     source=f"random-init MistralConfig({preset})", model_type="mistral")
    n_params = sum(p.numel() for p in model.parameters())
    return lm, {"preset": preset, "seed": seed, "newline_every": newline_every, "n_params": n_params, "n_layers": len(layers), "d_model": cfg.hidden_size,
                "vocab_size": cfg.vocab_size, "tokenizer_vocab": len(tok), "dtype": str(dtype)}


def load(preset: str, device: str, dtype, newline_every: int = 0):
    if preset == "smollm2":
        from synclib.models import load_model

        lm = load_model("smollm2-135m", dtype=dtype, device=device)
        return lm, {"preset": preset, "n_params": sum(p.numel() for p in lm.model.parameters()),
                    "n_layers": lm.n_layers, "d_model": lm.d_model, "dtype": str(dtype)}
    return build_random_model(preset, device, dtype, newline_every=newline_every)


# ----------------------------------------------------------------------------- helpers

def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def fixed_length_prompts(lm, n: int, length: int) -> list[list[int]]:
    """``n`` distinct token-id prompts of exactly ``length`` tokens, from real scenario prompts."""
    from synclib.tasks.prompts import render_prompt
    from synclib.tasks.scenarios import load_tasks

    tasks = load_tasks("embedded")
    out = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        ids = lm.encode(lm.chat_prompt(render_prompt(task, 0, [])))
        k = 0
        while len(ids) < length:  # extend with other tasks' prompts
            k += 1
            ids = ids + lm.encode(render_prompt(tasks[(i + k) % len(tasks)], 0, []))
        out.append(ids[-length:])
    return out


def machine_info(device) -> dict:
    """The machine, the versions and the commit (:func:`synclib.run.bench.machine_info`, the one home)."""
    from synclib.run.bench import machine_info as info

    return info(device)


# ----------------------------------------------------------------------------- benchmarks

def bench_engine(lm, batch_sizes, prompt_tokens, new_tokens, one_at_a_time_rows, device,
                 decode: str = "auto") -> list[dict]:
    """Utterances/s of Engine.generate at each batch size (fresh engine, no reuse, decoding
    mode ``decode``)."""
    from synclib.engine import Engine, Request

    results = []
    warm = Engine(lm, max_rows=2, kv_reuse=False, decode=decode)
    warm.generate([Request(p, seed=i) for i, p in enumerate(fixed_length_prompts(lm, 2, prompt_tokens))],
                  max_new_tokens=4)
    for bs in batch_sizes:
        rows = one_at_a_time_rows if bs == 1 else bs
        prompts = fixed_length_prompts(lm, rows, prompt_tokens)
        eng = Engine(lm, max_rows=bs, kv_reuse=False, decode=decode)
        reqs = [Request(p, seed=i) for i, p in enumerate(prompts)]
        # the prefill alone, on the same rows: (seconds - prefill) / new_tokens is a decoding step
        sync(device)
        tp = time.perf_counter()
        try:
            eng.read_states(prompts)
            prefill_s = time.perf_counter() - tp
        except Exception:  # noqa: BLE001 - an OOM shows again below and is recorded there
            prefill_s = None
        sync(device)
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        sync(device)
        t0 = time.perf_counter()
        try:
            res = eng.generate(reqs, max_new_tokens=new_tokens, temperature=0.7)
            err = None
        except Exception as exc:  # noqa: BLE001 - record OOM etc. in the JSON
            res, err = None, f"{type(exc).__name__}: {str(exc)[:200]}"
        sync(device)
        dt = time.perf_counter() - t0
        r = {"decode": eng.decode, "graph_fallbacks": int(eng.stats["graph_fallbacks"]),
             "batch_size": bs, "rows": rows, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
             "seconds": round(dt, 3), "error": err, "oom_retries": int(eng.stats["oom_retries"]),
             "final_batch_size": eng.max_rows}
        if res is not None:
            gen = sum(len(x.token_ids) for x in res)
            assert all(x.states.shape == (lm.n_layers, lm.d_model) and np.isfinite(x.states).all() for x in res)
            r.update(utterances_per_s=round(rows / dt, 3), new_tokens_per_s=round(gen / dt, 1),
                     prefill_tokens_per_s=round(rows * prompt_tokens / dt, 1))
            if prefill_s is not None:
                r.update(prefill_only_s=round(prefill_s, 3),
                         decode_step_ms=round(1000 * (dt - prefill_s) / new_tokens / math.ceil(rows / bs), 2))
        if str(device).startswith("cuda"):
            r["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
        print(json.dumps(r), flush=True)
        results.append(r)
        del eng
    return results


def bench_hf_generate(lm, batch_sizes, prompt_tokens, new_tokens, one_at_a_time_rows, device) -> list[dict]:
    """The reference code's way: plain ``transformers`` ``generate`` with forward hooks.

    Forward hooks on every decoder layer keep the last prompt token's output of the
    prefill (the first forward of ``generate``); sampling as ``generate`` does it
    (``do_sample=True``, temperature 0.7, its default top-k 50).  Every row generates
    exactly ``new_tokens`` (``min_new_tokens``), on the same prompts as the engine
    benchmark.  An out-of-memory error is recorded, not raised.
    """
    model = lm.model
    results = []
    for bs in batch_sizes:
        rows = one_at_a_time_rows if bs == 1 else bs
        prompts = fixed_length_prompts(lm, rows, prompt_tokens)
        sink: list = []

        def hook(_m, _a, out):
            h = out[0] if isinstance(out, (tuple, list)) else out
            if h.shape[1] > 1:  # the prefill, not a decoding step
                sink.append(h[:, -1].float().cpu())

        handles = [layer.register_forward_hook(hook) for layer in lm.decoder_layers]
        if str(device).startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        err, n_states = None, 0
        sync(device)
        t0 = time.perf_counter()
        try:
            for s in range(0, rows, bs):
                ids = torch.tensor(prompts[s:s + bs], device=device)
                torch.manual_seed(s)
                with torch.inference_mode():
                    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                         temperature=0.7, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                         pad_token_id=lm.pad_token_id)
                assert out.shape == (ids.shape[0], prompt_tokens + new_tokens), out.shape
                n_states += ids.shape[0]
        except Exception as exc:  # noqa: BLE001 - record OOM in the JSON
            err = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            for h in handles:
                h.remove()
        sync(device)
        dt = time.perf_counter() - t0
        r = {"batch_size": bs, "rows": rows, "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
             "seconds": round(dt, 3), "error": err}
        if err is None:
            assert len(sink) == lm.n_layers * math.ceil(rows / bs) and n_states == rows
            r.update(utterances_per_s=round(rows / dt, 3), new_tokens_per_s=round(rows * new_tokens / dt, 1))
        if str(device).startswith("cuda"):
            r["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
        print("hf_generate", json.dumps(r), flush=True)
        results.append(r)
        sink.clear()
    return results


def state_probe(lm, rows: int, prompt_tokens: int) -> np.ndarray:
    """Last-prompt-token states ``(rows, layers, d_model)`` of fixed prompts (for dtype comparisons)."""
    from synclib.engine import Engine

    prompts = fixed_length_prompts(lm, rows, prompt_tokens)
    return Engine(lm, max_rows=min(rows, 16), kv_reuse=False).read_states(prompts)


def state_difference(ref: np.ndarray, other: np.ndarray) -> dict:
    """Relative difference of hidden states, per layer and overall (``ref`` is float32)."""
    num = np.linalg.norm((other - ref).reshape(ref.shape[0], ref.shape[1], -1), axis=-1)
    den = np.linalg.norm(ref.reshape(ref.shape[0], ref.shape[1], -1), axis=-1)
    per_layer = (num / den).mean(0)
    a, b = ref.reshape(-1, ref.shape[-1]), other.reshape(-1, ref.shape[-1])
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return {"relative_l2_mean": float(per_layer.mean()), "relative_l2_max_layer": float(per_layer.max()),
            "relative_l2_per_layer": [round(float(x), 6) for x in per_layer],
            "cosine_min": float(cos.min()), "cosine_mean": float(cos.mean()), "rows": int(ref.shape[0])}


def bench_simulate(lm, episodes, seeds, batch_size, max_utterances, new_tokens, device, write_cube,
                   decode: str = "auto") -> dict:
    """The real dialog loop (and cube) over embedded tasks; utterances/s and estimate.

    ``decode`` other than ``"auto"`` runs the loop without a cube, its engine set to that
    decoding mode (the comparison of modes)."""
    from synclib import simulate as S
    from synclib.cube import CubeSpec
    from synclib.simulate.runner import _Runner  # the loop without its cube (the package keeps it private)
    from synclib.tasks.scenarios import load_tasks

    tasks = load_tasks("embedded")
    if episodes > len(tasks):
        raise SystemExit(f"--sim-episodes {episodes} > {len(tasks)} embedded tasks")
    sel = [tasks[i] for i in range(episodes)]
    try:
        import netCDF4  # noqa: F401

        have_nc = True
    except ImportError:
        have_nc = False
    write_cube = write_cube and have_nc and decode == "auto"
    sync(device)
    t0 = time.perf_counter()
    if write_cube:
        with tempfile.TemporaryDirectory() as d:
            path = S.simulate(lm, lm, sel, seeds, Path(d) / "bench.nc", max_utterances=max_utterances,
                              sampling=S.Sampling(max_new_tokens=new_tokens),
                              batching=S.Batching(units_per_part=batch_size), options=S.RunOptions(progress=True))
            import netCDF4

            with netCDF4.Dataset(path) as nc:
                n_utt = int(np.asarray(nc["n_utterances"][:]).sum())
                plen = np.asarray(nc["prompt_len_a"][:])
            cube_bytes = path.stat().st_size
        engine_stats = {}
    else:
        spec = CubeSpec(episodes=[S.episode_coords(t) for t in sel], seeds=seeds,
                          n_rounds=math.ceil(max_utterances / 2), n_layers_a=lm.n_layers, d_model_a=lm.d_model,
                          n_layers_b=lm.n_layers, d_model_b=lm.d_model)
        sampling = S.Sampling(temperature=0.7, max_new_tokens=new_tokens).for_model(lm)
        runner = _Runner((lm, lm), spec, {t.index: t for t in sel}, max_utterances=max_utterances,
                         sampling=(sampling, sampling), batching=S.Batching(units_per_part=batch_size,
                                                                            max_rows=batch_size))
        if decode != "auto":
            for eng in set(runner.engines):
                eng.decode = decode
        decode = runner.engines[0].decode
        units = spec.units()
        n_utt, lens = 0, []
        for i in range(0, len(units), batch_size):
            done = runner.play_part(units[i:i + batch_size])
            n_utt += sum(int(u.values["n_utterances"]) for u in done)
            lens += [u.values["prompt_len_a"] for u in done]
        plen = np.array(lens)
        cube_bytes = None
        engine_stats = {k: int(v) for k, v in runner.engines[0].stats.items()}
    sync(device)
    dt = time.perf_counter() - t0
    rate = n_utt / dt
    reached = plen[plen >= 0]
    out = {"decode": decode, "episodes": episodes, "seeds": list(seeds), "batch_size": batch_size, "max_utterances": max_utterances,
           "new_tokens": new_tokens, "cube_written": write_cube, "netcdf4_available": have_nc,
           "utterances": n_utt, "seconds": round(dt, 2), "utterances_per_s": round(rate, 3),
           "prompt_tokens_agent1": {"min": int(reached.min()), "mean": round(float(reached.mean()), 1),
                                    "max": int(reached.max())},
           "engine_stats": engine_stats, "cube_bytes": cube_bytes,
           "paper_workload_utterances": PAPER_UTTERANCES,
           "paper_workload_minutes_estimate": round(PAPER_UTTERANCES / rate / 60, 1)}
    print(json.dumps(out), flush=True)
    return out


def bench_storage(lm, n_tasks: int, out_dir: Path) -> dict:
    """Stored bytes per value and reconstruction error of each store_dtype on real states.

    States: every decoder layer at the last prompt token of the active, passive and
    ToM prompts of both agents of ``n_tasks`` embedded tasks (agent 1 before the
    first utterance, agent 2 before the second).
    """
    from synclib.cube import STORE_DTYPES, CubeSpec, CubeWriter, Unit, open_cube
    from synclib.engine import Engine
    from synclib.tasks.prompts import render_prompt
    from synclib.tasks.scenarios import load_tasks
    from synclib.simulate import episode_coords

    tasks = list(load_tasks("embedded"))[:n_tasks]
    views = ("active", "passive", "tom")
    first = ["Hi, nice to meet you. How have you been?"]  # agent 2 speaks after one utterance
    prompts = [lm.chat_prompt(render_prompt(t, a, first[:a], v)) for t in tasks for v in views for a in (0, 1)]
    states = Engine(lm, max_rows=8, kv_reuse=False).read_states(prompts)
    states = states.reshape(len(tasks), len(views), 2, lm.n_layers, lm.d_model)
    out = {"model_name": lm.name, "values": int(states.size), "n_tasks": len(tasks),
           "abs_max": float(np.abs(states).max()), "store": {}}
    for name in STORE_DTYPES:
        spec = CubeSpec(episodes=[episode_coords(t) for t in tasks], seeds=[0], n_rounds=len(views),
                        n_layers_a=lm.n_layers, d_model_a=lm.d_model, n_layers_b=lm.n_layers,
                        d_model_b=lm.d_model, store_dtype=name)
        path = out_dir / f"storage-{name}.nc"
        w = CubeWriter(path, spec, overwrite=True)
        units = []
        for i, t in enumerate(tasks):
            u = Unit.empty(spec, t.index, 0)
            u.values["hidden_a"][:] = states[i, :, 0]
            u.values["hidden_b"][:] = states[i, :, 1]
            units.append(u)
        w.write_part(0, units)
        w.finalize()
        ds = open_cube(path, chunks=None)
        got = np.stack([ds.hidden_a.values[:, 0], ds.hidden_b.values[:, 0]], axis=2)
        ref = states
        nz = ref != 0
        rel = np.abs(got - ref)[nz] / np.abs(ref)[nz]
        rel_fro = float(np.linalg.norm((got - ref).ravel()) / np.linalg.norm(ref.ravel()))
        out["store"][name] = {"file_bytes": path.stat().st_size,
                              "bytes_per_value": round(path.stat().st_size / states.size, 3),
                              "max_relative_error": float(rel.max()), "mean_relative_error": float(rel.mean()),
                              "relative_frobenius_error": rel_fro}
        print(name, json.dumps(out["store"][name]), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    ap.add_argument("--preset", choices=("mistral7b", "tiny", "smollm2"), default=None,
                    help="model (default: mistral7b on CUDA, tiny on CPU)")
    ap.add_argument("--dtype", default=None,
                    help="model dtype, or a comma list measured in turn on the same weights, the first as "
                         "the reference of the hidden-state difference (e.g. float32,bfloat16; the first "
                         "gets batch 1 and the second batch size only); default: bfloat16 on CUDA, "
                         "float32 on CPU")
    ap.add_argument("--hf-batch-sizes", default="1,64,128",
                    help="batch sizes of the plain transformers generate baseline (empty: skip)")
    ap.add_argument("--probe-rows", type=int, default=16, help="prompts whose states compare the dtypes")
    ap.add_argument("--batch-sizes", default="1,16,64,128", help="engine batch sizes (comma list)")
    ap.add_argument("--one-at-a-time-rows", type=int, default=4, help="rows timed at batch size 1")
    ap.add_argument("--prompt-tokens", type=int, default=900, help="engine benchmark prompt length")
    ap.add_argument("--new-tokens", type=int, default=64, help="new tokens per utterance")
    ap.add_argument("--sim-episodes", type=int, default=32, help="tasks in the dialog-loop benchmark (0: skip)")
    ap.add_argument("--sim-seeds", default="0,1", help="seeds in the dialog-loop benchmark")
    ap.add_argument("--sim-batch", type=int, default=64, help="batch size of the dialog-loop benchmark")
    ap.add_argument("--max-utterances", type=int, default=16)
    ap.add_argument("--sim-new-tokens", type=int, default=300,
                    help="dialog-loop benchmark: the new-token limit (the paper's 300); replies end earlier "
                         "at their first line break (see --newline-every)")
    ap.add_argument("--newline-every", type=int, default=64,
                    help="random models: one filler token in N ends a line, so that a dialog reply (whose "
                         "first line is kept) runs about N tokens; 0: never")
    ap.add_argument("--no-cube", action="store_true", help="run the loop without writing a cube")
    ap.add_argument("--decode-modes", default="auto",
                    help="engine decoding modes to compare (comma list of auto, graph, static, dynamic)")
    ap.add_argument("--storage", type=int, default=0, metavar="N_TASKS",
                    help="instead: measure bytes/value and error of each --store-dtype on N tasks' real states "
                         "(use with --preset smollm2)")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/simulate_<device>_<preset>.json)")
    args = ap.parse_args(argv)

    dev = args.device
    cuda = dev.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available")
    preset = args.preset or ("mistral7b" if cuda else "tiny")
    names = args.dtype.split(",") if args.dtype else (["bfloat16"] if cuda else ["float32"])
    dtypes = [getattr(torch, n.strip()) for n in names]
    dtype = dtypes[0]
    modes = [m.strip() for m in args.decode_modes.split(",")]
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.perf_counter()
    lm, model_info = load(preset, dev, dtype, args.newline_every)
    model_info["build_seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(model_info), flush=True)

    if args.storage:
        with tempfile.TemporaryDirectory() as d:
            res = {"benchmark": "cube_storage", "machine": machine_info(dev), "model": model_info,
                   **bench_storage(lm, args.storage, Path(d))}
        out = Path(args.out) if args.out else HERE / "results" / f"cube_storage_{preset}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {out}")
        return 0

    result = {"benchmark": "bench_simulate", "machine": machine_info(dev), "model": model_info,
              "reference": {"plain_hf_generate_h100_one_at_a_time_utt_s": 0.36,
                            "plain_hf_generate_h100_batch64_utt_s": 7.9,
                            "kv_reuse_bandwidth_and_flop_limit_utt_s": 60, "target_utt_s": 40},
              "engine": {}, "hf_generate": {}, "state_difference_vs_first_dtype": {}}
    batch_sizes = [int(x) for x in args.batch_sizes.split(",")]
    hf_sizes = [int(x) for x in args.hf_batch_sizes.split(",") if x.strip()]
    ref_states = None
    for i, dt in enumerate(dtypes):
        name = str(dt).replace("torch.", "")
        if i > 0:  # the same weights, cast: the state difference is the precision's alone
            lm.model.to(dt)
            lm.dtype = dt
            if cuda:
                torch.cuda.empty_cache()
        states = state_probe(lm, args.probe_rows, args.prompt_tokens)
        if ref_states is None:
            ref_states, result["reference_dtype"] = states, name
        else:
            result["state_difference_vs_first_dtype"][name] = state_difference(ref_states, states)
            print("state difference", name, json.dumps(result["state_difference_vs_first_dtype"][name])[:300],
                  flush=True)
        last = i == len(dtypes) - 1
        # the first (reference) precision: batch 1 and the first larger size only
        sizes = batch_sizes if last else batch_sizes[:2]
        result["engine"][name] = [row for mode in modes for row in bench_engine(
            lm, sizes, args.prompt_tokens, args.new_tokens, args.one_at_a_time_rows, dev, decode=mode)]
        if hf_sizes:
            result["hf_generate"][name] = bench_hf_generate(lm, hf_sizes if last else hf_sizes[:1],
                                                            args.prompt_tokens, args.new_tokens,
                                                            args.one_at_a_time_rows, dev)
    if args.sim_episodes > 0:
        seeds = [int(s) for s in args.sim_seeds.split(",")]
        result["simulate_by_decode"] = {}
        for mode in modes:
            sim = bench_simulate(lm, args.sim_episodes, seeds, args.sim_batch, args.max_utterances,
                                 args.sim_new_tokens, dev, not args.no_cube, decode=mode)
            sim["dtype"] = str(lm.dtype).replace("torch.", "")
            result["simulate_by_decode"][sim["decode"]] = sim
        result["simulate"] = sim  # the last mode's (list the default last)
    out = Path(args.out) if args.out else HERE / "results" / f"simulate_{dev.split(':')[0]}_{preset}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
