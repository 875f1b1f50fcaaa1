"""``synclib bench``: one ordered run measured on this machine, then the dry run prices from it
(issue 62, item 4).  On the CPU with the embedded SmolLM2 (the same code path as a GPU: only the
device differs)."""
from __future__ import annotations

import json

import pytest

from conftest import REPO
from synclib import cli
from synclib.config import load_config
from synclib.run import pipeline, price
from synclib.run.plan import plan, simulate_work


@pytest.mark.slow
@pytest.mark.long
def test_a_local_measurement_prices_the_runs_simulations(tmp_path, capsys):
    over = [f"results_dir={tmp_path / 'r'}", "pairs=[S-S]", "simulate.max_utterances=4", "simulate.episodes=6",
            "simulate.tom_episodes=2", "device=cpu"]
    args = sum((["--set", o] for o in over), [])
    assert cli.main(["bench", "--config", str(REPO / "config" / "default.yaml"), *args, "--tasks", "2"]) == 0
    out = capsys.readouterr().out
    (record_path,) = (tmp_path / "r" / price.LOCAL_DIR).glob("loop-cpu-*.json")
    assert f"kept in {record_path}" in out
    record = json.loads(record_path.read_text())
    assert record["source"] == "synclib bench" and record["benchmark"] == "scheduling"
    (res,) = record["results"].values()
    (mode, m), = res["modes"].items()
    assert mode == "turns" and res["model"]["specs"] == ["smollm2-135m", "smollm2-135m"]
    # 2 tasks x 1 seed x 4 utterances, genuine and ToM (both tasks within tom_episodes), and the
    # passive reader's reads of the genuine ones
    assert m["utterances"] <= 2 * 4 * 2 and m["reads"] <= 2 * 4 and m["utterances"] > 0
    assert m["wall_s"] > 0 and m["seconds"] and m["rows_per_step"] > 0
    assert record["machine"]["device"] == "cpu" and "commit" in record["machine"]
    assert res["model"]["n_params"] == res["model"]["n_params_each"][0] > 1e8

    # the dry run now prices the simulation from it, at its rate, for the run's own work
    cfg = load_config(REPO / "config" / "default.yaml", over)
    ref = price.reference(cfg)
    assert ref is not None and ref.local and ref.path == record_path
    assert ref.rate == pytest.approx(m["utterances"] / m["wall_s"])
    rows = {r.key: r for r in plan(pipeline.build_jobs(cfg, ("simulate",)), cfg)}
    row = rows["simulate:S-S"]
    w = simulate_work(cfg)
    parts, gen, reads = ref.parts, 4 * (w["dialogs"] + w["tom_dialogs"]), 4 * w["passive_reads"]
    f_rows = max(1.0, ref.rows_per_step / row.sim.rows)
    expect = ((parts.get("join", 0) + parts.get("tom", 0) + parts.get("other", 0)) / ref.generated * gen
              + parts.get("decode", 0) / ref.generated * gen * f_rows
              + parts.get("passive", 0) / ref.reads * reads + parts.get("cube", 0) * row.disk_bytes / (ref.stored_values * 4))
    assert row.seconds == pytest.approx(expect, rel=1e-9)
    assert record_path.name in row.note
    assert cli.main(["run", "--config", str(REPO / "config" / "default.yaml"), *args, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert f"time of the simulations: from this run's own measurement, {record_path.name}" in text
