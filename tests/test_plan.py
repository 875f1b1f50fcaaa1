"""The dry run's price of a GPU run (issue 51, part 4: :mod:`synclib.run.price`).

Every number is held to the measurement it names (the benchmark JSON, read here) or to its
formula on a config-built tiny shape; the scheduler check runs against a real LocalCluster.
"""
from __future__ import annotations

import json
import math
import re
import socket

import pytest
import yaml

from conftest import REPO
from synclib.config import load_config
from synclib.paths import BENCH_RESULTS
from synclib import shapes
from synclib.run import pipeline, price
from synclib.run.plan import format_plan, hours_text, plan, simulate_work

GiB = 2 ** 30


def _config(tmp_path, models: dict, pairs, **simulate) -> dict:
    """A CUDA config on the embedded tasks (nothing here needs a GPU: the plan runs nothing)."""
    dtype = simulate.pop("dtype", "bfloat16")
    sim = {"episodes": 6, "seeds": [0, 1], "passive_seeds": [0], "max_utterances": 16, "max_new_tokens": 300,
           "tom": True, "passive": True, **simulate}
    cfg = {"name": "priced", "results_dir": str(tmp_path / "r"), "scenarios": "embedded", "device": "cuda",
           "dtype": dtype, "models": {k: {"spec": v, "family": k} for k, v in models.items()}, "pairs": pairs,
           "orders": "first", "simulate": sim,
           "judge": {"model": "openai/gpt-oss-120b", "url": "http://127.0.0.1:9/v1"},
           "analysis": {"n_samples": 200, "split_seeds": [0, 1, 2], "sample_sizes": None}}
    f = tmp_path / "priced.yaml"
    f.write_text(yaml.safe_dump(cfg))
    return load_config(f)


def _rows(cfg, steps=("simulate", "judge", "analyze")):
    return {r.key: r for r in plan(pipeline.build_jobs(cfg, steps), cfg)}


# --------------------------------------------------------------------------- shapes
def test_the_known_shapes_give_the_published_parameter_counts():
    """The table of the paper's six models (their hub config.json) and the parameter formula:
    the counts published for them, and the measured random Mistral-7B shape's own count."""
    want = {"mistralai/Mistral-7B-Instruct-v0.1": 7_241_732_096, "mistralai/Mistral-7B-Instruct-v0.2": 7_241_732_096,
            "mistralai/Mistral-7B-Instruct-v0.3": 7_248_023_552, "meta-llama/Llama-2-7b-chat-hf": 6_738_415_616,
            "meta-llama/Meta-Llama-3-8B-Instruct": 8_030_261_248, "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824}
    for spec, n in want.items():
        assert shapes.model_shape(spec).n_params == n, spec
    ref = price.loop_reference()
    assert ref is not None and ref.params == want["mistralai/Mistral-7B-Instruct-v0.1"]
    smol = json.loads((BENCH_RESULTS / "cube_storage_smollm2.json").read_text())["model"]["n_params"]
    assert shapes.model_shape("smollm2-135m").n_params == smol
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    assert {m["spec"] for m in paper["models"].values()} <= set(shapes.KNOWN_SHAPES)
    assert price.card_name("NVIDIA H100 80GB HBM3") == "H100" and price.card_name("NVIDIA H200") == "H200"


# --------------------------------------------------------------------------- GPU-hours
def _reference_json(note: str) -> tuple[str, dict]:
    name = re.search(r"of (\S+\.json)$", note).group(1)
    return name, json.loads((BENCH_RESULTS / name).read_text())


def test_a_simulations_gpu_hours_are_the_named_benchmarks_rate_times_the_work(tmp_path):
    """Same shape, dtype and scheduling as the measurement: the job's GPU-hours are the named
    benchmark's seconds per generated utterance (its parts without the passive reader and the
    cube) x the utterances generated, + its passive reader's seconds per read x the reads, + its
    cube's seconds per byte x the cube's bytes; the printed line says the same number."""
    ref = price.loop_reference()
    cfg = _config(tmp_path, {"M": "mistralai/Mistral-7B-Instruct-v0.2"}, ["M-M"], scheduling=ref.mode,
                  dtype=ref.dtype)
    row = _rows(cfg, ("simulate",))["simulate:M-M"]
    name, d = _reference_json(row.note)
    assert name == ref.file
    st = d["settings"]
    (res,) = d["results"].values()
    m = res["modes"][cfg["simulate"]["scheduling"]]
    parts = m["seconds"]
    gen_ref = m["utterances"]
    reads_ref = st["tasks"] * len(st["seeds"]) * st["max_utterances"]
    stored_ref = st["tasks"] * len(st["seeds"]) * 3 * 8 * 2 * res["model"]["n_layers"] * res["model"]["d_model"] * 4

    w = simulate_work(cfg)
    gen = 16 * (w["dialogs"] + w["tom_dialogs"])
    reads = 16 * w["passive_reads"]
    disk = (w["dialogs"] + w["passive_reads"] + w["tom_dialogs"]) * 8 * 2 * 32 * 4096 * 4
    expect = ((parts["join"] + parts["decode"] + parts["tom"] + parts["other"]) / gen_ref * gen
              + parts["passive"] / reads_ref * reads + parts["cube"] / stored_ref * disk)
    assert row.seconds == pytest.approx(expect, rel=1e-9)
    assert row.disk_bytes == disk
    # no factor when nothing differs from the measurement
    assert "x1.00 decoding, x1.00 prefill" in row.note
    text = format_plan(list(_rows(cfg, ("simulate",)).values()), cfg)
    assert f"~{expect / 3600:.2f} GPU-hours on {ref.card}" in text
    assert f"1 simulations: ~{hours_text(expect / 3600)} GPU-hours on {ref.card} (from {ref.file}, {ref.date}" in text
    assert f"rate {gen_ref / m['wall_s']:.2f} utterances/s" in text


def test_float32_and_a_smaller_model_scale_the_measured_parts(tmp_path):
    """float32: decoding x the bytes per parameter (2), the prefills x the measured float32 /
    bfloat16 prefill ratio (simulate_cuda_mistral7b.json); a 3B model: x its parameters; a pair
    of two models under turn-by-turn scheduling: the mean of the two."""
    ref = price.loop_reference()
    base = _config(tmp_path, {"M": "mistralai/Mistral-7B-Instruct-v0.2"}, ["M-M"], scheduling=ref.mode,
                   dtype="bfloat16")
    f32 = _config(tmp_path, {"M": "mistralai/Mistral-7B-Instruct-v0.2"}, ["M-M"], scheduling=ref.mode,
                  dtype="float32")
    small = _config(tmp_path, {"S": "meta-llama/Llama-3.2-3B-Instruct"}, ["S-S"], scheduling=ref.mode,
                    dtype="bfloat16")
    d = json.loads((BENCH_RESULTS / "simulate_cuda_mistral7b.json").read_text())["engine"]
    b = max(set(r["batch_size"] for r in d["float32"]) & set(r["batch_size"] for r in d["bfloat16"]))
    ratio = (next(r for r in d["float32"] if r["batch_size"] == b)["prefill_only_s"]
             / next(r for r in d["bfloat16"] if r["batch_size"] == b)["prefill_only_s"])
    assert price.prefill_dtype_ratio()[0] == pytest.approx(ratio)

    parts = ref.parts
    w = simulate_work(base)
    gen, reads = 16 * (w["dialogs"] + w["tom_dialogs"]), 16 * w["passive_reads"]

    def expect(f_dec, f_pre, disk, f_rows=1.0):
        return (parts["decode"] / ref.generated * gen * f_dec * f_rows
                + (parts["join"] + parts["tom"]) / ref.generated * gen * f_pre
                + parts["other"] / ref.generated * gen + parts["passive"] / ref.reads * reads * f_pre
                + parts["cube"] * disk / (ref.stored_values * 4))

    r32 = _rows(f32, ("simulate",))["simulate:M-M"]
    # float32 keys/values of the stream's 128 rows (64 units x genuine + ToM) do not fit beside the
    # weights in 90 % of the card: halved once, still more rows than the measured loop held a step
    assert (r32.sim.rows_configured, r32.sim.rows) == (128, 64) and r32.sim.rows > ref.rows_per_step
    assert r32.seconds == pytest.approx(expect(2.0, ratio, r32.disk_bytes), rel=1e-9)
    p3 = 3_212_749_824 / ref.params
    r3 = _rows(small, ("simulate",))["simulate:S-S"]
    assert r3.seconds == pytest.approx(expect(p3, p3, r3.disk_bytes), rel=1e-9)
    text = format_plan(list(_rows(f32, ("simulate",)).values()), f32)
    assert "bfloat16 -> float32: decoding x2" in text and f"prefill x{ratio:.2f} (measured: simulate_cuda_mistral7b.json" in text

    turns = _config(tmp_path, {"M": "mistralai/Mistral-7B-Instruct-v0.2", "S": "meta-llama/Llama-3.2-3B-Instruct"},
                    ["M-S"], scheduling="turns", dtype="bfloat16")
    rm = _rows(turns, ("simulate",))["simulate:M-S"]
    mean = (1 + p3) / 2
    sched = price.scheduling_ratio(ref.mode, "turns")
    f = sched[0] if sched else 1.0
    assert rm.seconds == pytest.approx(expect(mean, mean, rm.disk_bytes) * f, rel=1e-9)


# --------------------------------------------------------------------------- memory and disk
def test_gpu_memory_and_disk_follow_their_formulas_for_a_tiny_shape(tmp_path):
    """A config-built tiny model (its config.json only): GPU memory = parameters x bytes per
    parameter + rows x (longest measured prompt + max_new_tokens) x layers x 2 x kv heads x head
    dim x bytes; disk = (dialogs + passive reads + ToM dialogs) x rounds x (layers x width) of
    both agents x 4 bytes; the analysis' host memory = its rows + the resident variables."""
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1000, "tie_word_embeddings": False}))
    cfg = _config(tmp_path, {"T": str(d)}, ["T-T"], dtype="float32", units_per_part=8, max_new_tokens=50,
                  scheduling="turns")
    rows = _rows(cfg)
    sim, ana = rows["simulate:T-T"], rows["analyze:T-T"]
    params = 1000 * 64 * 2 + 4 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64
    assert shapes.model_shape(str(d)).n_params == params
    prompt, _ = price.kv_prompt_tokens()
    kv = 8 * (prompt + 50) * 4 * 2 * 2 * 16 * 4
    assert sim.gpu_gib * GiB == pytest.approx(params * 4 + kv)
    w = simulate_work(cfg)
    assert (w["dialogs"], w["passive_reads"], w["tom_dialogs"]) == (12, 6, 12)
    assert sim.disk_bytes == (12 + 6 + 12) * 8 * (4 * 64 * 2) * 4
    var = 12 * 8 * 4 * 64 * 4  # one hidden variable: dialogs x rounds x layers x width, float32
    assert ana.host_gib * GiB == pytest.approx(200 * (4 * 64 * 2) * 4 + 2 * var)
    text = format_plan(list(rows.values()), cfg)
    assert f"GPU memory per simulation job: up to {sim.gpu_gib:.1f} GiB" in text
    assert "disk: ~0.0 GiB per run" in text and "OPENAI_API_KEY" in text


def test_a_token_budget_sets_the_rows_the_memory_line_prices(tmp_path):
    """Continuous scheduling with ``simulate.kv_tokens``: the key/value memory is priced for
    the rows the budget admits (kv_tokens // (prompt + max_new_tokens)), not for a count, and
    the memory line names the setting; without it, one part's dialogs."""
    prompt, _ = price.kv_prompt_tokens()
    cols = prompt + 300
    budget = 5 * cols + 7  # room for five rows
    cfg = _config(tmp_path, {"M": "mistralai/Mistral-7B-Instruct-v0.3"}, ["M-M"], scheduling="continuous",
                  units_per_part=16, kv_tokens=budget)
    assert price._rows(cfg, (), cols) == (5, f"simulate.kv_tokens {budget:,}")
    rows = _rows(cfg, ("simulate",))
    assert f"5 rows (simulate.kv_tokens {budget:,})" in format_plan(list(rows.values()), cfg)
    wide = _config(tmp_path, {"M": "mistralai/Mistral-7B-Instruct-v0.3"}, ["M-M"], scheduling="continuous",
                   units_per_part=16, kv_tokens=1000 * cols)
    assert price._rows(wide, (), cols) == (64, "2 parts x 16 units x 2 (genuine + ToM) in one stream")
    free = _config(tmp_path, {"M": "mistralai/Mistral-7B-Instruct-v0.3"}, ["M-M"], scheduling="continuous",
                   units_per_part=16)
    assert price._rows(free, (), cols) == (32, "16 units x 2 (genuine + ToM) in one stream")
    shape = shapes.model_shape("mistralai/Mistral-7B-Instruct-v0.3")
    kv = {c["simulate"]["kv_tokens"]: _rows(c, ("simulate",))["simulate:M-M"].gpu_gib for c in (cfg, free)}
    assert (kv[None] - kv[budget]) * GiB == pytest.approx((32 - 5) * cols * shape.kv_bytes_per_token(2))


def test_the_analysis_counts_the_grids_it_fits(tmp_path):
    """The analysis' price counts its ridge grids as analyze's own progress bar does."""
    from synclib.analysis.settings import AnalysisSettings

    for over in ([], ["analysis.alpha=cv", "analysis.sample_sizes=[100,200]"]):
        cfg = load_config(REPO / "config" / "default.yaml", over)
        st = AnalysisSettings.from_config(cfg)
        conds = st.all_conditions()
        lags = sum(c.startswith("lag") for c in conds)  # a lag's contrast also fits genuine at its size
        want = len(st.directions) * len(st.split_seeds) * (
            len(conds) + 2 * (len(conds) - 1) + lags + (not st.penalty.is_paper()) + bool(st.persona_disjoint)
            + len(st.sample_sizes or ()))
        assert price.analysis_grids(cfg) == want, over


# --------------------------------------------------------------------------- the scheduler
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.long  # a Dask LocalCluster (about 17 s): the cluster path, which CI runs
def test_the_dry_run_asks_the_scheduler_for_its_gpu_workers(tmp_path, capsys):
    """A LocalCluster on 127.0.0.1 with two GPU workers (resources GPU=1): the dry run counts
    them and divides the GPU-hours by them; a closed port: one line says so, the plan prints."""
    distributed = pytest.importorskip("distributed")
    from synclib import cli

    cfg = _config(tmp_path, {"M": "mistralai/Mistral-7B-Instruct-v0.2"}, ["M-M"], dtype="bfloat16")
    conf = tmp_path / "priced.yaml"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
                                  host="127.0.0.1", dashboard_address=None, resources={"GPU": 1},
                                  silence_logs=40) as cluster:
        info = price.check_scheduler(cluster.scheduler_address, timeout=5)
        assert info == {"ok": True, "workers": 2, "gpu_workers": 2, "threads": 2}
        assert cli.main(["run", "--config", str(conf), "--dry-run", "--scheduler", cluster.scheduler_address]) == 0
    text = capsys.readouterr().out
    rows = _rows(cfg)
    gpu_h = sum(r.seconds for k, r in rows.items() if k.split(":")[0] in ("simulate", "analyze")) / 3600
    longest = max(r.seconds for k, r in rows.items() if k.split(":")[0] in ("simulate", "analyze")) / 3600
    assert f"scheduler {cluster.scheduler_address} answers: 2 worker(s), 2 with resource GPU" in text
    assert f"wall time ~{hours_text(max(gpu_h / 2, longest))} h with 2 GPU worker(s)" in text

    port = _closed_port()
    info = price.check_scheduler(f"tcp://127.0.0.1:{port}", timeout=2)
    assert info["ok"] is False and info["error"]
    assert cli.main(["run", "--config", str(conf), "--dry-run", "--scheduler", f"tcp://127.0.0.1:{port}"]) == 0
    text = capsys.readouterr().out
    assert f"scheduler tcp://127.0.0.1:{port} does not answer" in text
    assert "RUN  simulate:M-M" in text and "GPU-hours" in text


# --------------------------------------------------------------------------- the paper's grid
def test_the_papers_dry_run_prices_the_grid(tmp_path, monkeypatch, capsys, sotopia_dir):
    """config/paper.yaml: GPU-hours per simulation and in total on the measured card, the
    analyses' GPU-hours, the judge's requests, GPU memory, disk per run and in all, logins."""
    from synclib import cli
    from synclib.tasks import datasets

    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert cli.main(["fetch", "sotopia", "--from", str(sotopia_dir)]) == 0
    capsys.readouterr()
    args = ["run", "--config", str(REPO / "config" / "paper.yaml"), "--dry-run", "--set", f"results_dir={tmp_path / 'r'}"]
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    ref = price.loop_reference()
    assert text.count("RUN  simulate:") == 36 and text.count(f" GPU-hours on {ref.card}, GPU memory ~") >= 36
    assert "36 simulations: ~" in text and f"GPU-hours on {ref.card} (from {ref.file}" in text
    assert "36 analyses: ~" in text and "36 judge jobs: 81,000 requests" in text
    assert re.search(r"GPU memory per simulation job: up to \d+\.\d GiB", text)
    assert re.search(r"disk: ~\d+\.\d(-\d+\.\d)? GiB per run, ~\d+\.\d TiB in all for 36 runs", text)
    assert "Llama models are gated" in text and "hf auth login" in text
    assert "$OPENAI_API_KEY: not set" in text
    assert "without an estimate (36 judge job(s): 81,000 requests, their time depends on the endpoint)" in text
    assert re.search(r"total: ~[\d,]+ GPU-hours on " + ref.card, text)
    # the per-run disk of a Mistral-7B pair: (2250 dialogs + 1350 passive reads + 2250 ToM dialogs) x 8 rounds
    # x 2 x 32 x 4096 float32 values
    assert f"~{(2250 + 1350 + 2250) * 8 * 2 * 32 * 4096 * 4 / GiB:.1f} GiB" in text
    assert math.isfinite(ref.rate)


def test_pricing_a_gpu_run_imports_no_torch(tmp_path):
    """The price reads JSON and config.json files only: planning a CUDA config in a fresh
    interpreter leaves torch and transformers unimported (the training-sample check of
    :mod:`synclib.analysis.sizing` is not part of this)."""
    import subprocess
    import sys

    code = ("import sys; from synclib.config import load_config; from synclib.run import pipeline; "
            "from synclib.run.plan import plan, format_plan; "
            f"cfg = load_config(None, ['device=cuda', 'results_dir={tmp_path / 'r'}']); "
            "text = format_plan(plan(pipeline.build_jobs(cfg, pipeline.STEPS), cfg), cfg); "
            "print('GPU-hours' in text, [m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "True []"


def test_the_pages_quote_the_papers_price_as_the_dry_run_computes_it():
    """The reproduce page shows the price its notebook computes with the dry run's code
    (pipeline.paper_price_markdown); the README quotes its total, which must be that number: a price
    that differs between two pages is a bug."""
    from pages import run_page

    text = pipeline.paper_price_markdown()
    total = re.search(r"^36 simulations: ~([\d,]+) GPU-hours on (\w+)", text, flags=re.M)
    assert total, text
    assert f"~{total[1]} {total[2]}-hours for the 36 simulations in float32" in (REPO / "README.md").read_text()
    assert not (REPO / "book" / "reproduce.md").exists()
    assert "paper_price_markdown()" in (REPO / "notebooks" / "reproduce.md").read_text()
    assert text in run_page("reproduce").text
    flat = " ".join(text.split())  # the page wraps its lines
    assert "every simulation job fits the H100 as configured" in flat and "assumptions of the" in flat
    assert max(len(line) for line in text.splitlines()) <= pipeline.PAGE_TEXT_WIDTH
    assert "login:" not in text  # the builder's own credentials are not the reader's


def test_the_rows_priced_are_those_that_fit_the_card(tmp_path):
    """The engine halves a batch that runs out of memory: the price takes the configured rows,
    halved until the weights and the rows' keys/values fit 90 % of the measured card; fewer rows
    per step than the measured loop held take proportionally more decoding steps."""
    assert price.fitting_rows(64, 50 * GiB, 2 * GiB, 80 * GiB) == 8    # room 22 GiB: 64 -> 32 -> 16 -> 8
    assert price.fitting_rows(64, 75 * GiB, 1 * GiB, 80 * GiB) == 0    # not even one row
    assert price.fitting_rows(64, 1.0, 1.0, None) == 64                 # no card: as configured
    cfg = load_config(REPO / "config" / "paper.yaml", [f"results_dir={tmp_path}"])
    ref = price.reference(cfg)
    rows = _rows(cfg, ("simulate",))
    for key, r in rows.items():
        assert r.sim.fits and (r.sim.weights + r.sim.rows * r.sim.kv_row) <= price.CARD_SHARE * ref.gpu_gib * GiB, key
        assert r.sim.rows == r.sim.rows_configured or (r.sim.rows * 2 * r.sim.kv_row
                                                        > price.CARD_SHARE * ref.gpu_gib * GiB - r.sim.weights), key
    l2 = rows["simulate:L2-L3"].sim
    assert (l2.rows_configured, l2.rows) == (64, 4)  # float32 Llama-2: 1 MiB of keys/values a token
    assert f"x{ref.rows_per_step / 4:.2f} for 4 rows" in rows["simulate:L2-L3"].note
    m = rows["simulate:M1-M1"].sim
    assert m.rows >= ref.rows_per_step and "rows (measured" not in rows["simulate:M1-M1"].note
