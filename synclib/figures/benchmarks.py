"""The benchmarks page: every measured speed and memory figure, quoted from ``bench/results``.

:func:`benchmarks_markdown` writes ``book/_generated/benchmarks.md``.  Every number comes from a
JSON file that a script in ``bench/`` wrote (``bench/results/*.json``); a file that is missing
is said to be missing (e.g. GPU benchmarks not yet run), so the page never shows a number that
was not measured.  One helper per section: the batched ridge (CPU, and at the paper's scale on
a GPU), hooked generation, candidate scoring, continuous batching of dialogs, the 7B-shaped model
on a GPU, ``synclib run`` end to end, the main job on the CPU (:func:`main_job_lines`), cube
storage, the analysis streamed from disk and bf16 against float32 states.
"""
from __future__ import annotations

import re

__all__ = ["benchmarks_markdown", "main_job_lines"]


def _section(title: str, script: str) -> list[str]:
    """A section's heading (short: a long one wrapped, leaving its last word alone on a line)
    and the script that measures it."""
    return [f"## {title}", "", f"Measured by `{script}`.", ""]


#: sentences of a result file's notes that are for the developers, not the page's readers: the
#: tests that ran beside a benchmark, issue numbers, a failed first try's details
_INTERNAL = re.compile(r"tests?/|\btest_\w+|\bissue \d+|graph_fallbacks", re.I)


def _for_readers(note: str | None) -> str:
    """``note`` less its sentences that :data:`_INTERNAL` matches."""
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z(])", (note or "").strip())
    return " ".join(s for s in sentences if s and not _INTERNAL.search(s))


def _num(x, digits=3):
    return "n/a" if x is None else (f"{x:.{digits}g}" if isinstance(x, float) else str(x))


def _gpu_name(r) -> str:
    m = r.get("machine") or r.get("env") or {}
    return m.get("gpu", "a GPU")


def _gpu_ridge_lines(g) -> list[str]:
    out = ["**Paper scale on a GPU** (6,500 samples, 32 x 32 layers, 4096 wide, 3 split seeds, one direction, "
           "`python bench/bench_ridge.py --paper-scale`):", ""]
    if not g:
        return out + ["not measured yet.", ""]
    out += [f"{_gpu_name(g)}, torch {g['env'].get('torch', '?')}, measured {g.get('date', '?')}.", "",
            "| precision | 3 seeds, seconds | largest difference from the per-pair solve |",
            "| --- | --- | --- |"]
    for prec in ("float32", "tf32", "bf16"):
        if f"ours_{prec}_3_seeds_s" in g:
            out.append(f"| batched, {prec} | {_num(g[f'ours_{prec}_3_seeds_s'])} | "
                       f"{_num(g[f'max_abs_diff_{prec}_vs_baseline'])} |")
    key = next(k for k in g if k.startswith("baseline_3_seeds_s"))
    out += [f"| the paper's per-pair solve, float32{' (one seed run, times 3)' if 'extrap' in key else ''} | "
            f"{_num(g[key])} | — |", ""]
    return out


def _gpu_ridge_solve_lines(g) -> list[str]:
    """Where the paper-scale grid's time goes on a GPU, and what the smaller-side solve bought."""
    if not g:
        return []
    st, ms = g["stages_one_seed"], g["micro_ms"]
    out = [f"{_gpu_name(g)}, torch {g['env'].get('torch', '?')}, measured {g.get('date', '?')[:10]} "
           "(`bench/results/ridge_paper_cuda_h200.json`): the same grids after the hat matrices' triangular "
           "solves took the 1,300 test rows as right-hand sides instead of the 5,200 training rows "
           "(identical grids: the float64 difference vanishes in the float32 cast).", "",
           "| precision | 3 seeds, seconds | source side, one seed | scoring, one seed | "
           "largest difference from the float64 solve |", "| --- | --- | --- | --- | --- |"]
    for prec in ("float32", "tf32", "bf16"):
        if f"ours_{prec}_3_seeds_s" in g:
            out.append(f"| {prec} | {_num(g[f'ours_{prec}_3_seeds_s'])} | {_num(st[prec]['source_side_s'])} | "
                       f"{_num(st[prec]['scoring_s'])} | {_num(g[f'max_abs_diff_{prec}_vs_float64_reference'])} |")
    out += [f"| {g['old_hat_precision']}, the solves as before (same run) | {_num(g['old_hat_3_seeds_s'])} | | | |", "",
            f"The faster precisions now spend most of their time in the float64 source side: per source layer "
            f"{_num(ms['gram_XcT_Xc_float64'])} ms for `Xc'Xc`, {_num(ms['cholesky_float64'])} ms for the Cholesky "
            f"factorisation, {_num(ms['solve_rhs_n_test_float64'])} ms for the triangular solves and "
            f"{_num(ms['hat_gemm_float64'])} ms for the hat product. float32 does not make them cheaper on "
            f"this card ({_num(ms['gram_XcT_Xc_float32'])}, {_num(ms['cholesky_float32'])} and "
            f"{_num(ms['solve_rhs_n_test_float32'])} ms: its float64 tensor cores run at the float32 rate), so a "
            "float32 factorisation with a step of refinement would add its refinement's products to the same "
            f"cost; batching 8 factorisations took {_num(ms['cholesky_float64_batch_of_8'])} ms against "
            f"{_num(ms['cholesky_float64_8_one_at_a_time'])} ms one at a time, and two `solve_triangular` calls "
            f"{_num(ms['solve_rhs_n_test_float64_two_trsm'])} ms against {_num(ms['solve_rhs_n_test_float64'])} "
            "ms for `cholesky_solve`. Under 1 s for the three seeds is not reached; what is left to try: "
            "`X'X` of all 6,500 rows once per layer, each seed's training Gram matrix as that minus its test "
            "rows' (a quarter of the product), and the TF32 hat product.", ""]
    return out


def _stream_step_sentence(p) -> str:
    """What one slot step costs against the batch decoder's step (``bench/profile_stream.py``)."""
    if not p:
        return ""
    runs = p["runs"]
    per = ", ".join(f"{_num(r['stream']['step_ms'])} against {_num(r['generate']['step_ms'])} ms with {n} rows"
                    for n, r in runs.items())
    return (f"One slot step ({p['capacity']} slots, `bench/profile_stream.py`, {p['prompt_tokens']}-token prompts) "
            f"costs about what the batch decoder's step costs ({per}), so the time goes outside the decoding "
            "steps: the joins' small prefills, the copies into the slots, the ToM read-outs and host work. ")


def _gpu_scheduling_lines(c, p=None) -> list[str]:
    """The dialog loop turn by turn against continuous batching at the 7B shape on a GPU, and
    the profile of one slot step ``p``."""
    if not c:
        return []
    r, s = c["results"]["mistral7b"], c["settings"]
    t, k = r["modes"]["turns"], r["modes"]["continuous"]
    out = [f"**At the Mistral-7B shape on {_gpu_name(c)}** (random weights, bf16, {s['tasks']} embedded tasks x 1 "
           f"seed, {s['max_utterances']} utterances, replies up to {s['max_new_tokens']} tokens, batch "
           f"{s['batch_size']}, passive reader and ToM dialogs; CUDA-graph decoding, the default on CUDA; measured "
           f"{c['date']}, `bench/results/scheduling_cuda.json`):", "",
           "| scheduling | s | utterances/s | steps | rows / step | reused |", "| --- | --- | --- | --- | --- | --- |"]
    for mode, v in (("turns", t), ("continuous", k)):
        out.append(f"| {mode} | {_num(v['wall_s'])} | {_num(v['utterances_per_s'])} | {v['decode_steps']} | "
                   f"{_num(v['rows_per_step'])} | {100 * v['reused_share_of_prompt_tokens']:.1f} % |")
    out += ["", f"Continuous batching needed {100 * (1 - k['decode_steps'] / t['decode_steps']):.0f} % fewer "
            f"decoding steps but took only {100 * (1 - k['wall_s'] / t['wall_s']):.0f} % less time. "
            f"{_stream_step_sentence(p)}Far from the goal of 40 utterances/s. {_for_readers(c.get('note'))}", ""]
    return out


#: the parts of the dialog loop's wall time (Engine.seconds), in the order the table lists them
_LOOP_PARTS = (("join", "joins: prefill of the rows joining the stream (and of the passive reader's prompts where "
                         "the loop reads them there), their copy into its slots"),
               ("decode", "decoding steps (CUDA-graph replays, sampling, one host read each)"),
               ("cube", "the cube: the loop's time writing its parts (or waiting for the background writer), "
                        "then the compressed file"),
               ("passive", "passive reader (prefill only, between the steps)"), ("tom", "ToM read-outs"),
               ("probe", "ToM read-outs scored inside the stream (probes over the rows' own keys/values)"),
               ("other", "host work between the timed parts"))


def _gpu_loop_lines(loop, library=None) -> list[str]:
    """Where the dialog loop's time goes at the 7B shape (``loop_cuda_mistral7b.json``), and
    synclib's stream against transformers' continuous batching (``library_cuda.json``)."""
    if not loop:
        return []
    s = loop["settings"]
    m = loop["results"]["mistral7b"]["modes"]["continuous"]
    sec, c = m["seconds"], m["counters"]
    out = [f"**Where the dialog loop's time goes** ({_gpu_name(loop)}, {loop['date']}, "
           f"`bench/results/loop_cuda_mistral7b.json`: a Mistral-7B-shaped model with random weights, bf16, "
           f"{s['tasks']} tasks x {len(s['seeds'])} seeds, continuous scheduling with the genuine and ToM dialogs "
           f"in one stream, batch {s['batch_size']}, replies up to {s['max_new_tokens']} tokens, passive reader "
           f"and ToM on; each part ends with a device sync): {m['utterances']:,} utterances in "
           f"{_num(m['wall_s'])} s, **{_num(m['utterances_per_s'])} utterances/s** (the goal is 40).", "",
           "| part | s | share |", "| --- | --- | --- |"]
    for key, what in _LOOP_PARTS:
        if key in sec:
            out.append(f"| {what} | {_num(sec[key])} | {100 * sec[key] / m['wall_s']:.0f} % |")
    out += ["", f"{m['stream_joins']} joins ({1000 * sec['join'] / max(m['stream_joins'], 1):.0f} ms each, "
            f"{c.get('prefill_splits', 0)} of them split into prefill groups), {m['decode_steps']:,} decoding steps "
            f"({1000 * sec['decode'] / max(m['decode_steps'], 1):.0f} ms each, {_num(m['rows_per_step'])} rows a step, "
            f"{m['host_reads_per_step']:g} host read a step), {c.get('recomputed_tokens', 0):,} prompt tokens "
            f"prefilled again because {c.get('cache_skips', 0)} sessions did not fit the cache budget, "
            f"{m['graph_fallbacks']} failed captures. The joins take the largest share, then the decoding steps. "
            f"{_for_readers(loop.get('note'))}", ""]
    if library and "synclib" in library.get("results", {}):
        r = library["results"]
        ours, lib, st = r["synclib"], r.get("library", {}), library["settings"]
        out += [f"**Against transformers' continuous batching** (same card and call, `library_cuda.json`: "
                f"{st['prompts']} opening prompts of {st['prompt_tokens_mean']:.0f} tokens, replies to their "
                f"first line or {st['max_new_tokens']} tokens, generated once each):", "",
                "| | s | tokens | tokens/s |", "| --- | --- | --- | --- |",
                f"| synclib's stream (states of every layer recorded) | {_num(ours['wall_s'])} | {ours['tokens']:,} | "
                f"{_num(ours['tokens_per_s'])} |"]
        if "tokens" in lib:
            out += [f"| transformers `generate_batch` (text only) | {_num(lib['wall_s'])} | {lib['tokens']:,} | "
                    f"{_num(lib['tokens_per_s'])} |", "",
                    f"Reading the states for the library's replies would add {_num(lib['states_s'])} s "
                    f"(`Engine.read_states`). synclib's stream is {ours['tokens_per_s'] / lib['tokens_per_s']:.1f}x "
                    f"the library's tokens/s here, so it stays. {_for_readers(library.get('note'))}", ""]
        else:
            out += ["", f"The library path failed: {lib.get('error', 'no result')}.", ""]
    return out


def _gpu_engine_lines(s, loop, modes=None, dialog=None) -> list[str]:
    out = ["**A Mistral-7B-shaped model on a GPU** (random weights built from the config, "
           "`python bench/bench_simulate.py --device cuda`):", ""]
    if not s:
        return out + ["not measured yet.", ""]
    rows = []
    for dt, runs in s["engine"].items():
        for r in runs:
            rows.append((dt, "synclib engine" + (f", {r['decode']} decoding" if "decode" in r else ""), r))
    for dt, runs in s.get("hf_generate", {}).items():
        for r in runs:
            rows.append((dt, "transformers generate + hooks", r))
    first = next(iter(s["engine"].values()))[0]
    out += [f"{_gpu_name(s)}; prompts of {first['prompt_tokens']} tokens, {first['new_tokens']} new tokens, "
            f"no KV reuse (measured {s.get('date', s['machine'].get('date', 'in the first GPU session'))}).", "",
            "| dtype | method | batch | utterances/s | decoding step (ms) |", "| --- | --- | --- | --- | --- |"]
    for dt, what, r in rows:
        out.append(f"| {dt} | {what} | {r['batch_size']} | {_num(r.get('utterances_per_s'))} | "
                   f"{_num(r.get('decode_step_ms'))} |")
    out.append("")
    if loop:
        steps = ", ".join(f"{_num(r.get('decode_step_ms'))} ms at batch {r['batch_size']}" for r in loop["engine"]["bfloat16"])
        out += [f"After the decoding loop moved sampling and stop checks onto the device: {steps} "
                "(`engine_cuda_decode_loop.json`): no gain; the step was host-bound for another reason "
                "(see `bench/gpu_notes.md`).", ""]
    if modes:
        out += ["The decoding step as CUDA graphs over a preallocated cache (`Engine(decode=\"graph\")`, "
                "the default on CUDA), against the growing cache, same run (`engine_cuda_decode_modes.json`):", "",
                "| batch | decoding | utterances/s | decoding step (ms) | prefill tokens/s |",
                "| --- | --- | --- | --- | --- |"]
        for r in next(iter(modes["engine"].values())):
            out.append(f"| {r['batch_size']} | {r['decode']} | {_num(r['utterances_per_s'])} | "
                       f"{_num(r['decode_step_ms'])} | {_num(r['prefill_tokens_per_s'])} |")
        out.append("")
    d = s.get("simulate")
    if d and not dialog:
        out += [f"The dialog loop ({d['episodes']} tasks x {len(d['seeds'])} seeds, batch {d['batch_size']}, "
                f"{d['max_utterances']} utterances, replies ending at their first line break, at most "
                f"{d['new_tokens']} tokens): **{_num(d['utterances_per_s'])} utterances/s** in {d.get('dtype', 'bf16')} "
                "(the goal is 40).", ""]
    if dialog:
        d0 = dialog["steps"][0]["simulate"]
        out += [f"The dialog loop ({d0['episodes']} tasks x {len(d0['seeds'])} seeds, batch {d0['batch_size']}, "
                f"{d0['max_utterances']} utterances, replies ending at their first line break, at most "
                f"{d0['new_tokens']} tokens; `dialog_loop_cuda_mistral7b.json`), one engine change per row; "
                f"the first GPU session's dynamic decoding gave {_num(d['utterances_per_s']) if d else '?'} "
                "utterances/s:", "",
                "| engine | utterances/s | prompt tokens reused | decoding steps |", "| --- | --- | --- | --- |"]
        for st in dialog["steps"]:
            m = st["simulate"]
            out.append(f"| {st['label']} | {_num(m['utterances_per_s'])} | {st['prefix_reuse']:.0%} | "
                       f"{m['engine_stats'].get('graph_steps', '?')} |")
        out += ["", "The goal is 40 utterances/s. What bounds the loop now is the turn: every row of a batch "
                "decodes until the batch's longest reply ends (about 275 steps a turn against replies of "
                "about 64 tokens), which continuous batching of dialogs removes.", ""]
    diff = s.get("state_difference_vs_first_dtype", {}).get("bfloat16")
    if diff:
        out += [f"bf16 against float32 on the same random weights: mean relative L2 difference of the hidden "
                f"states {_num(diff['relative_l2_mean'])} (largest layer {_num(diff['relative_l2_max_layer'])}), "
                f"lowest cosine {_num(diff['cosine_min'])}, over {diff['rows']} prompts. Random networks amplify "
                "rounding layer by layer; this says nothing about trained models.", ""]
    return out


def _gpu_e2e_lines(e) -> list[str]:
    out = ["**`synclib run` end to end on a GPU** (`python bench/bench_e2e.py --device cuda --book`):", ""]
    if not e:
        return out + ["not measured yet.", ""]
    st = e["settings"]
    out += [f"{_gpu_name(e)}: two random Mistral-7B-shaped models, {st['tasks']} tasks, both orders, "
            f"{st['max_utterances']} utterances, {st['max_new_tokens']} new tokens, passive and ToM passes."]
    if e.get("status"):
        out += [f"*{_for_readers(e['status'])}.*"]
    if e.get("engine_note"):
        out += [f"*Engine: {e['engine_note']}.*"]
    jobs = e.get("jobs_finished") or e.get("jobs") or {}
    out += ["", "| job | seconds | peak GPU memory (GiB) | prompt tokens reused |", "| --- | --- | --- | --- |"]
    for k, v in jobs.items():
        reuse = f"{v['prefix_reuse']:.0%}" if "prefix_reuse" in v else "—"
        out.append(f"| {k} | {_num(v.get('seconds'))} | {_num(v.get('peak_gpu_gib'))} | {reuse} |")
    if e.get("followup", {}).get("notebooks_and_book_s"):
        out.append(f"| notebooks and book (re-run) | {_num(e['followup']['notebooks_and_book_s'])} | — | — |")
    p = e.get("projection_from_finished_order") or e.get("projection") or {}
    if p:
        out += ["", f"Projected simulation time of the paper's grid ({p['paper_grid_episodes']:,} episodes) at this "
                f"run's rate, every model at its 7B shape and dtype: **{_num(p['paper_grid_simulate_gpu_hours'])} "
                "GPU-hours** (the goal is 24). The dry run of `config/paper.yaml` prices the grid from the newest "
                "dialog-loop benchmark instead, scaled to each pair's models and to float32 (the *How to reproduce* "
                "page quotes it)."]
    return out + [""]


def main_job_lines(m: dict | None) -> list[str]:
    """The benchmarks page's section on the measured main job (``bench/bench_main_job.py``):
    each job kind's seconds and peak resident memory, the rates the dry run scales."""
    out = _section("The main job on the CPU", "bench/bench_main_job.py")
    if not m:
        return out + ["*No result yet: run `make book`, then `python bench/bench_main_job.py`.*", ""]
    mc, j = m["machine"], m["jobs"]
    out += [f"`make book` with `config/default.yaml` on {mc['cpu_count']} cores of {mc['cpu']} "
            f"({m['dtype_used']}, torch {mc['torch']}, measured {m['date']}): the pipeline's jobs took "
            f"{_num(m['pipeline_seconds'] / 60)} minutes"
            + (f", the whole `make book` {_num(m['make_book_wall_s'] / 60)} minutes" if m.get("make_book_wall_s") else "")
            + (f" with a peak resident memory of {_num(m['make_book_peak_rss_gib'])} GiB"
               if m.get("make_book_peak_rss_gib") else "")
            + ". `synclib run --dry-run` scales these rates to another configuration.", "",
            "| job | seconds | peak resident memory (GiB) | rate |", "| --- | --- | --- | --- |"]
    for name, v in j["simulate"].items():
        out.append(f"| simulate {name} | {_num(v['seconds'])} | {_num(v['peak_rss_gib'])} | "
                   f"{_num(1 / v['seconds_per_utterance'])} utterances/s of {v['planned_utterances']:,} planned |")
    for name, v in j["judge"].items():
        out.append(f"| judge {name} | {_num(v['seconds'])} | {_num(v['peak_rss_gib'])} | "
                   f"{_num(v['seconds_per_dialog'])} s per dialog |")
    for name, v in j["analyze"].items():
        out.append(f"| analyse {name} | {_num(v['seconds'])} | {_num(v['peak_rss_gib'])} | "
                   f"{v['dialogs']} dialogs, {v['split_seeds']} split seeds |")
    nb = j.get("notebooks", {})
    if nb:
        k = m.get("notebooks_at_once", 1)
        out.append(f"| {len(nb)} notebooks{f', {k} at a time' if k > 1 else ''} | "
                   f"{_num(sum(v['seconds'] for v in nb.values()) / k)} | | |")
    for k in ("pages", "book"):
        if k in j:
            out.append(f"| {k} | {_num(j[k]['seconds'])} | | |")
    d = m.get("dtypes")
    if d:
        out += ["", f"The same simulation ({d['pair']}, {d['tasks']} tasks, with the passive reader) took "
                f"{_num(d['seconds']['bfloat16'])} s in bfloat16 and {_num(d['seconds']['float32'])} s in "
                f"float32 on this machine: float32 is {_num(d['float32_factor'])}x slower, the factor the dry "
                "run applies to the simulation and judging on a CPU without native bfloat16."]
    return out + [""]


def benchmarks_markdown(bench_dir) -> str:
    """Markdown for ``book/_generated/benchmarks.md``, quoting ``bench/results/*.json``.

    Every number comes from a JSON file written by a script in ``bench/``; files that
    are missing are said to be missing (e.g. GPU benchmarks not yet run).
    """
    import json
    from pathlib import Path

    bench_dir = Path(bench_dir)

    def load(name):
        f = bench_dir / name
        return json.loads(f.read_text()) if f.is_file() else None

    out = []
    r = load("ridge_embedded_cpu.json")
    out += _section("Batched ridge", "bench/bench_ridge.py")
    if r:
        env = r.get("env", {})
        out += [
            f"CPU ({env.get('cpu_count', '?')} cores, torch {env.get('torch', '?')}, measured "
            f"{r.get('date', '?')}), embedded scale: {r['n_samples']} samples, {r['layers']} layers x "
            f"{r['width']} wide, λ = {r['alpha']}.", "",
            "| | seconds |", "| --- | --- |",
            f"| batched grid (ours), one grid | {_num(r['ours_per_grid_s'])} |",
            f"| the paper's method (one solve per layer pair), one grid | {_num(r['baseline_per_grid_s'])} |",
            f"| ours, both directions x {len(r['split_seeds'])} split seeds | {_num(r['ours_full_two_direction_3_seeds_s'])} |",
            "",
            f"Speed-up {_num(r['speedup_per_grid'])}x; largest difference from the per-pair baseline "
            f"{_num(r['max_abs_diff_vs_baseline'])} in R² (float32).", ""]
    else:
        out += ["*No result yet: run `python bench/bench_ridge.py`.*", ""]
    out += _gpu_ridge_lines(load("ridge_paper_cuda.json"))
    out += _gpu_ridge_solve_lines(load("ridge_paper_cuda_h200.json"))
    e = load("engine_cpu.json")
    out += _section("Hooked generation", "bench/bench_engine.py")
    if e:
        s = e["settings"]
        out += [f"CPU, {e['model']}, {s['episodes']} tasks x {s['utterances_per_episode']} utterances, "
                f"{s['max_new_tokens']} new tokens, prompts of {s['mean_prompt_tokens']:.0f} tokens on average, "
                f"{e['torch_threads']} torch thread(s).", "",
                "| mode | batch | KV reuse | utterances/s | prompt tokens prefilled |",
                "| --- | --- | --- | --- | --- |"]
        for name, m in e["modes"].items():
            out.append(f"| {name} | {m['batch_size']} | {'yes' if m['kv_reuse'] else 'no'} | "
                       f"{_num(m['utterances_per_s'])} | {m['prefill_tokens']} |")
        out += ["", f"Loading SmolLM2 from synclib's de-quantised cache: {_num(e.get('load_from_cache_s'))} s "
                f"(plus {_num(e.get('import_torch_transformers_s'))} s to import torch and transformers).", ""]
    else:
        out += ["*No result yet: run `python bench/bench_engine.py`.*", ""]
    out += _candidate_lines(load("candidates_cpu.json"))
    out += _scheduling_lines(load("scheduling_cpu.json"))
    out += _gpu_scheduling_lines(load("scheduling_cuda.json"), load("profile_stream_cuda.json"))
    out += _gpu_loop_lines(load("loop_cuda_mistral7b.json"), load("library_cuda.json"))
    out += _gpu_engine_lines(load("simulate_cuda_mistral7b.json"), load("engine_cuda_decode_loop.json"),
                             load("engine_cuda_decode_modes.json"), load("dialog_loop_cuda_mistral7b.json"))
    out += _gpu_e2e_lines(load("e2e_cuda_mistral7b.json"))
    out += main_job_lines(load("main_job_cpu.json"))
    c = load("cube_storage_smollm2.json")
    out += _section("Cube storage", "bench/bench_simulate.py")
    if c:
        out += [f"{c['values']:,} real SmolLM2 hidden-state values ({c['n_tasks']} tasks), zlib-compressed netCDF4:", "",
                "| store dtype | bytes per value | max relative error | mean relative error |",
                "| --- | --- | --- | --- |"]
        for k, v in c["store"].items():
            out.append(f"| {k} | {_num(v['bytes_per_value'])} | {_num(v['max_relative_error'])} | "
                       f"{_num(v['mean_relative_error'])} |")
        out.append("")
    a = load("analysis_stream_cpu.json")
    out += _section("Analysis streamed from disk", "bench/bench_analysis.py")
    if a:
        sh, m = a["shape"], a["analysis"]
        out += [
            f"A cube of the paper's shape ({sh['episodes']} tasks x {sh['seeds']} seeds x {sh['rounds']} rounds, "
            f"two agents of {sh['layers']} layers x {sh['dim']}, float32, synthetic states) written through "
            f"`CubeWriter` in {_num(a['write_parts_s'])} s of parts plus {_num(a['finalize_s'])} s to finalise; "
            f"{_num(a['cube_file_gib'])} GiB on disk, {_num(a['hidden_variable_gib_in_memory'])} GiB per "
            "hidden-state variable in memory.", "",
            f"Then, in a fresh process on {a['machine']['cpu_count']} CPU cores: {a['what']}. The "
            f"finiteness mask took {_num(m['mask_seconds'])} s (one streamed pass over a variable) and the fit "
            f"{_num(m['analyze_seconds'])} s ({m['n_train']:,} training and {m['n_test']:,} test samples). The "
            f"rows of the split, {_num(a['samples_read_per_fit_gib'])} GiB for both sides, are the only hidden "
            "states held; the rest is the ridge's workspace (the per-source-layer Gram matrices of the "
            f"training rows alone are {_num(4 * sh['layers'] * m['n_train'] ** 2 / 2**30)} GiB). "
            f"**Peak resident memory: {_num(m['peak_rss_gib'])} GiB**; loaded whole, the two variables "
            f"alone would take {_num(2 * a['hidden_variable_gib_in_memory'])} GiB.", ""]
    else:
        out += ["*No result yet: run `python bench/bench_analysis.py`.*", ""]
    out += _dtype_lines(load("simulate_cpu_dtypes.json"))
    return "\n".join(out) + "\n"


def _candidate_lines(c) -> list[str]:
    """Candidate scoring, prefix tree against per-prefix cache copies (``bench/bench_candidates.py``)."""
    out = _section("Scoring candidate words", "bench/bench_candidates.py")
    if not c:
        return out + ["*No result yet: run `python bench/bench_candidates.py`.*", ""]
    m, j = c["machine"], c["constrained_judge"]
    out += [f"CPU ({m['cpu_count']} cores, torch {m['torch']}, measured {c['date']}). The ToM read-out and the "
            "constrained judge score given token sequences after a prompt. synclib feeds each row's candidates "
            "as one prefix tree in one forward pass per batch of rows; the fallback (for attention "
            "implementations that take no explicit mask) feeds each distinct prefix over its own copy of the "
            "row's key/value cache. Same prompts, same run:", "",
            "| workload | prefix tree, s | per prefix, s | speed-up | largest difference |",
            "| --- | --- | --- | --- | --- |"]
    for t in c["tom_emotions"]:
        out.append(f"| ToM emotion words, {t['model']}, {t['prompts']} prompts of {t['mean_prompt_tokens']:.0f} "
                   f"tokens | {_num(t['paths']['prefix_tree']['seconds'])} | {_num(t['paths']['per_prefix']['seconds'])} "
                   f"| {_num(t['speedup'])}x | {_num(t['max_abs_difference'])} (probability) |")
    out += [f"| constrained judge, {j['judge']}, {j['dialogs']} dialogs ({j['scores']} scores) | "
            f"{_num(j['paths']['prefix_tree']['seconds'])} | {_num(j['paths']['per_prefix']['seconds'])} | "
            f"{_num(j['speedup'])}x | {_num(j['max_abs_difference_expected_score'])} (expected score; "
            f"{'same' if j['same_scores'] else 'different'} scores) |", ""]
    return out


def _scheduling_lines(c) -> list[str]:
    """The dialog loop turn by turn against continuous batching (``bench/bench_scheduling.py``)."""
    out = _section("Continuous batching", "bench/bench_scheduling.py")
    if not c:
        return out + ["*No result yet: run `python bench/bench_scheduling.py`.*", ""]
    s, m = c["settings"], c["machine"]
    out += [f"CPU ({m.get('cpu_count', '?')} cores, torch {m.get('torch', '?')}, measured {c['date']}). The same "
            f"simulation ({s['tasks']} embedded tasks x 1 seed, {s['max_utterances']} utterances, "
            f"{s['max_new_tokens']} new tokens, batch {s['batch_size']}, passive reader and ToM dialogs) with "
            "`scheduling: turns` (each utterance index is one generate call: every dialog waits for the "
            "batch's longest reply) and `scheduling: continuous` (a dialog's next utterance joins the running "
            "batch as soon as its reply ends). Steps are decoding steps; rows / step is the decoding batch's "
            "occupancy; useful prefill is prefilled tokens over the token positions computed with left "
            "padding; reused is the share of prompt tokens taken from session caches.", "",
            "| model, scheduling | s | steps | rows / step | useful prefill | reused |",
            "| --- | --- | --- | --- | --- | --- |"]
    for preset, r in c["results"].items():
        label = f"{preset} ({r['model'].get('dtype', '?').replace('torch.', '')})"
        for mode, v in r["modes"].items():
            out.append(f"| {label}, {mode} | {_num(v['wall_s'])} | {v['decode_steps']} | "
                       f"{_num(v['rows_per_step'])} | {100 * v['prefill_useful_share']:.1f} % | "
                       f"{100 * v['reused_share_of_prompt_tokens']:.1f} % |")
    out.append("")
    for preset, r in c["results"].items():
        a, h = r["agreement"], r.get("agreement_turns_half_batch")
        t, k = r["modes"]["turns"], r["modes"]["continuous"]
        def more_or_less(ratio):
            return f"{abs(100 * (ratio - 1)):.0f} % {'more' if ratio > 1 else 'less'}"

        line = (f"- **{preset}**: continuous batching took {more_or_less(1 / r['speedup'])} time with "
                f"{abs(100 * (k['decode_steps'] / t['decode_steps'] - 1)):.0f} % "
                f"{'more' if k['decode_steps'] > t['decode_steps'] else 'fewer'} decoding steps; identical texts "
                f"{100 * a['identical_text_share']:.1f} %, largest state difference {_num(a['max_abs_diff_hidden'])}")
        if h:
            line += (f". For reference, turn by turn at half the batch size against the full batch: identical "
                     f"texts {100 * h['identical_text_share']:.1f} %, largest state difference "
                     f"{_num(h['max_abs_diff_hidden'])}")
        out.append(line + ".")
        for mode, v in r["modes"].items():  # where the time went, where the JSON says (seconds per part)
            if v.get("seconds"):
                parts = ", ".join(f"{label} {_num(v['seconds'][key])}" for key, label in
                                  (("generate", "generate calls"), ("join", "joins"), ("decode", "decoding steps"),
                                   ("passive", "passive reader"), ("read", "passive reads"),
                                   ("tom", "ToM read-outs"),
                                   ("probe", "ToM read-outs inside the stream"), ("cube", "cube"),
                                   ("other", "other")) if key in v["seconds"])
                counters = v.get("counters", {})
                notes = [f"{counters['stream_reads']} passive prompts read in the joins"] if counters.get(
                    "stream_reads") else []
                if counters.get("shared_tokens"):
                    notes.append(f"{counters['shared_tokens']:,} prompt tokens taken from blocks that other "
                                 "sessions stored")
                out.append(f"  - {mode}, seconds by part: {parts}" + (f" ({'; '.join(notes)})" if notes else "") + ".")
    reference = any(r.get("agreement_turns_half_batch") for r in c["results"].values())
    out += ["", "On the CPU a decoding step costs about as much per row whatever the batch, so fewer steps "
            "with more rows in each save little, and each join's prefill and cache merge cost something: "
            "`scheduling: turns` stays the default. On a GPU a step costs about the same for 1 or 128 rows, "
            "which is where fewer steps count (the GPU measurement is below). Where texts differ, a sampled token moved at float "
            "rounding and the dialog went its own way from there: in bfloat16 the rows that share a batch "
            f"already change the rounding{' (the reference line above)' if reference else ''}, and where the "
            "next-token distribution is nearly flat the smallest difference picks another token. In float32 "
            "the two schedulings' cubes agree to float rounding.", ""]
    return out


def _dtype_lines(d) -> list[str]:
    """bf16 against float32 hidden states on the CPU (``bench/bench_simulate.py --dtype float32,bfloat16``)."""
    out = _section("bf16 against float32 states", "bench/bench_simulate.py")
    diff = (d or {}).get("state_difference_vs_first_dtype", {}).get("bfloat16")
    if not diff:
        return out + ["*No result yet: run `python bench/bench_simulate.py --device cpu --preset tiny "
                      "--dtype float32,bfloat16`.*", ""]
    m, mach = d.get("model", {}), d.get("machine", {})
    return out + [
        f"A config-built Llama ({m.get('n_layers', '?')} layers x {m.get('d_model', '?')}, random weights) "
        f"on {mach.get('cpu_count', '?')} CPU cores, torch {mach.get('torch', '?')}: the last-prompt-token "
        f"states of {diff['rows']} prompts in bfloat16 differ from float32 by a mean relative L2 of "
        f"**{_num(diff['relative_l2_mean'])}** (largest layer {_num(diff['relative_l2_max_layer'])}; cosine "
        f"at least {_num(diff['cosine_min'], 6)}). The paper's code ran float32 (`config/paper.yaml`); bf16 "
        "is the faster option. The 7B-shaped figure measured on a GPU is in this page's GPU section.", ""]
