"""The main job's config handling and job graph (fast; no models)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from synclib.config import ConfigError, load_config
from synclib.run import pipeline
from synclib.run.pipeline import Job, build_jobs, execute

REPO = Path(__file__).resolve().parent.parent


def _load_shipped(name):
    """A shipped config, as is: the paper's names ``scenarios: sotopia``, which validates
    whether or not the tasks are fetched (their episodes are checked once they are)."""
    return load_config(REPO / "config" / name)


@pytest.mark.parametrize("name", ["default.yaml", "overnight.yaml", "paper.yaml"])
def test_shipped_configs_validate(name):
    cfg = _load_shipped(name)
    jobs = build_jobs(cfg)
    assert sum(k.startswith("simulate:") for k in jobs) == len(pipeline.runs(cfg))
    assert "book" in jobs and "manifest" in jobs
    # every dependency names a job of the graph
    assert all(d in jobs for j in jobs.values() for d in j.deps)


def test_another_results_folder_re_runs_the_shared_notebooks_only(tmp_path):
    """book/executed/ is shared by every results folder: a run into another folder re-runs its
    notebooks (their pages name the folder and show its results), while each folder's own jobs are
    fingerprinted by their settings alone (a moved checkout keeps its stamps: the folder is recorded
    relative to the repository)."""
    a, b = (build_jobs(load_config(REPO / "config" / "default.yaml", [f"results_dir={tmp_path / n}"]))
            for n in ("a", "b"))
    assert all(a[k].fp == b[k].fp for k in a if k.split(":")[0] in ("simulate", "judge", "analyze"))
    shared = [k for k in a if k.startswith("notebook:")] + ["manifest", "claims", "book"]
    assert len(shared) > 4 and all(a[k].fp != b[k].fp for k in shared)
    inside = build_jobs(load_config(REPO / "config" / "default.yaml"))
    assert inside["manifest"].inputs["results_dir"] == "results/embedded"


def test_the_claims_job_judges_the_run_once_before_every_notebook(tmp_path):
    """The pages job is gone; the claims job (step notebooks) judges every claim after the manifest and
    before every notebook, which all read its claims.json: a notebook's inputs are the claims'
    fingerprint, its own text, its code and the data it may read, not the config's input files (those
    are the claims job's)."""
    from synclib.notebook import figure_notebooks

    cfg = load_config(None, [f"results_dir={tmp_path / 'r'}"])
    jobs = build_jobs(cfg)
    assert "pages" not in jobs
    claims = jobs["claims"]
    assert claims.deps == ("manifest",) and claims.output == tmp_path / "r" / "claims.json"
    assert claims.step == "notebooks" and list(jobs).index("claims") == list(jobs).index("manifest") + 1
    notebooks = [k for k in jobs if k.startswith("notebook:")]
    assert {k.split(":", 1)[1] for k in notebooks} == {nb.stem for nb in figure_notebooks()}
    for k in notebooks:
        assert jobs[k].deps == ("claims",) and jobs[k].inputs["claims"] == claims.fp
        assert set(jobs[k].inputs) == {"claims", "notebook", "code", "data"}
    assert set(jobs["book"].deps) == set(notebooks)
    # a login node's `--steps notebooks,book` judges the claims too
    steps = build_jobs(cfg, ("notebooks", "book"))
    assert not steps["claims"].check_only and all(steps[k].check_only for k in steps if k.startswith("analyze:"))
    # the files the claims read (table 1's abilities, table 4's ratings) re-run the claims, so every page
    assert cfg["notebooks"]["ability_scores"]  # the default's
    unscored = build_jobs(load_config(None, [f"results_dir={tmp_path / 'r'}", "notebooks.ability_scores=null"]))
    assert unscored["claims"].fp != claims.fp and all(unscored[k].fp != jobs[k].fp for k in notebooks)
    assert {k: j.fp for k, j in unscored.items() if k.split(":")[0] in ("simulate", "judge", "analyze")} == \
        {k: j.fp for k, j in jobs.items() if k.split(":")[0] in ("simulate", "judge", "analyze")}


def test_the_claims_step_writes_claims_json_with_the_configs_files(tmp_path):
    """The claims step judges the run with the files the config names (notebooks.*: table 1's abilities)."""
    from synclib.analysis import claims, results
    from synthetic import SYNTHETIC_PAIRS, build_synthetic_results

    root = build_synthetic_results(tmp_path / "r", pairs=SYNTHETIC_PAIRS[:1], n_episodes=8,
                                   analyze_kwargs={"nonlinear": False, "tom": False, "relationship": False,
                                                   "sample_sizes": None, "persona_disjoint": False})
    cfg = {"notebooks": {"ability_scores": "data/ability_scores.csv", "human_ratings": None,
                         "human_judge_scores": None}}
    pipeline.step_claims(cfg, root / "claims.json", str(root / "manifest.json"))
    res = results.load_results(root)
    assert [c["id"] for c in res.claims()] == [fn.__name__ for fn, *_ in claims.CLAIMS]
    assert res.claim_inputs() == {"ability_scores": "data/ability_scores.csv", "ratings": None, "judge_scores": None}
    assert len(res.tests("partial")) and len(res.tests("abilities"))


def test_pages_re_runs_the_named_notebooks_and_the_book_only(tmp_path, capsys):
    """`synclib run --pages fig07` (make page NAME=fig07): the graph holds that notebook and the book, the
    notebook's job the same as in the whole graph (nothing else of it re-runs), the book rebuilt from
    every page's last executed copy; the next whole run rebuilds the book again."""
    from synclib import cli
    from synclib.notebook import choose

    cfg = load_config(None, [f"results_dir={tmp_path / 'r'}"])
    every = build_jobs(cfg, ("notebooks", "book"))
    one = build_jobs(cfg, ("notebooks", "book"), pages=choose(["fig07"]))
    assert [k for k in one if k.startswith("notebook:")] == ["notebook:fig07_topk"]
    assert one["book"].deps == ("notebook:fig07_topk",) and one["book"].inputs["pages"] == ["fig07_topk"]
    assert one["notebook:fig07_topk"].fp == every["notebook:fig07_topk"].fp
    assert one["claims"].fp == every["claims"].fp and one["book"].fp != every["book"].fp
    two = build_jobs(cfg, ("notebooks", "book"), pages=choose(["fig07", "fig02_heatmaps"]))
    assert {k for k in two if k.startswith("notebook:")} == {"notebook:fig07_topk", "notebook:fig02_heatmaps"}
    base = ["run", "--set", f"results_dir={tmp_path / 'r'}"]
    assert cli.main(base + ["--pages", "nothing"]) == 2
    assert "--pages: notebook 'nothing' matches none" in capsys.readouterr().err
    assert cli.main(base + ["--pages", "fig07", "--runs", "S-S"]) == 2
    assert "without --runs" in capsys.readouterr().err
    make = (REPO / "Makefile").read_text()
    assert "synclib run --config $(CONFIG) --steps notebooks,book --pages $(NAME)" in make


def test_paper_grid_is_21_pairs_in_36_ordered_runs():
    cfg = _load_shipped("paper.yaml")
    assert len(cfg["pairs"]) == 21
    runs = pipeline.runs(cfg)
    assert len(runs) == 36 and len({r.name for r in runs}) == 36
    assert sum(r.a == r.b for r in runs) == 6 and all(r.order == 1 for r in runs if r.a == r.b)
    assert len(pipeline.runs({**cfg, "orders": "first"})) == 21
    rev = [r for r in runs if r.order == 2]
    assert all(r.name == "-".join(reversed(r.pair.split("-"))) for r in rev)
    fams = {pipeline.pair_family(cfg, p) for p in cfg["pairs"]}
    assert fams == {"Mistral", "Llama", "Cross"}


def test_overrides_are_typed():
    cfg = load_config(None, ["simulate.episodes=3", "simulate.seeds=[0, 2]", "device=cpu"])
    assert cfg["simulate"]["episodes"] == 3
    assert cfg["simulate"]["seeds"] == [0, 2]
    assert cfg["device"] == "cpu"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("results_dir: r\nscenarios: embedded\nmodels: {S: smollm2-135m}\npairs: [S-X]\njudge: {model: x}\n",
         "pairs entry 'S-X'"),
        ("scenarios: embedded\nmodels: {S: a}\npairs: [S-S]\n", "missing key 'results_dir'"),
        ("results_dir: r\nscenarios: embedded\nmodels: {S: a}\npairs: [S-S]\njudge: {model: x}\n"
         "simulate: {seeds: 3}\n", "simulate.seeds"),
        ("results_dir: r\nscenarios: embedded\nmodels: {S: a}\npairs: [S-S]\njudge: {model: x}\n"
         "analysis: {alpha: -1}\n", "analysis.alpha"),
        ("results_dir: r\nscenarios: embedded\nmodels: {S: a}\npairs: [S-S]\njudge: {model: x}\n"
         "analysis: {max_resident_gib: lots}\n", "analysis.max_resident_gib"),
        ("results_dir: r\nscenarios: embedded\nmodels: {S: {label: x}}\npairs: [S-S]\n", "models.S"),
        ("- just\n- a list\n", "top level"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert needle in str(err.value) and str(path) in str(err.value)


def test_memory_budget_does_not_change_the_analysis_fingerprint():
    a = build_jobs(load_config(None))
    b = build_jobs(load_config(None, ["analysis.max_resident_gib=8"]))
    c = build_jobs(load_config(None, ["analysis.n_samples=100"]))
    name = next(k for k in a if k.startswith("analyze:"))
    assert a[name].fp == b[name].fp != c[name].fp


def test_new_benchmark_results_rebuild_the_book(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "BENCH_RESULTS", tmp_path)
    before = build_jobs(load_config(None))["book"].fp
    (tmp_path / "ridge_paper_cuda.json").write_text("{}")
    assert build_jobs(load_config(None))["book"].fp != before


def test_bad_override():
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(None, ["simulate.episodes"])


def test_cli_reports_config_errors(tmp_path, capsys):
    from synclib.cli import main

    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_jobs_skip_when_up_to_date_and_rerun_when_inputs_change(tmp_path):
    calls = []

    def make(out: Path, tag: str):
        def func(*deps):
            calls.append(tag)
            out.write_text(json.dumps([tag, *deps]))
        return func

    a_out, b_out = tmp_path / "a.json", tmp_path / "b.json"
    jobs = {
        "a": Job("a", a_out, "fp-a", make(a_out, "a")),
        "b": Job("b", b_out, "fp-b", make(b_out, "b"), deps=("a",)),
    }
    out = execute(jobs)
    assert calls == ["a", "b"]
    assert json.loads(b_out.read_text()) == ["b", str(a_out)]
    assert out == {"a": str(a_out), "b": str(b_out)}
    execute(jobs)                      # nothing changed: nothing runs
    assert calls == ["a", "b"]
    jobs["b"] = Job("b", b_out, "fp-b2", make(b_out, "b"), deps=("a",))
    execute(jobs)                      # b's inputs changed: only b runs
    assert calls == ["a", "b", "b"]
    a_out.unlink()                     # a lost its output: a runs again
    execute(jobs)
    assert calls == ["a", "b", "b", "a"]


def test_a_local_run_executes_notebooks_at_once_after_the_other_jobs(tmp_path):
    """By default the notebooks run synclib.notebook.AT_ONCE at a time (here two of them meet
    at a barrier, which only jobs running together can pass), and only after every job they do
    not need has finished; with scheduler='sync' they run one after the other."""
    import threading

    from synclib.notebook import AT_ONCE

    if AT_ONCE < 2:
        pytest.skip("one core: notebooks run one at a time")
    events = []

    def jobs_with(barrier, run):  # run: the outputs' suffix, new for each graph (so none is up to date)
        def make(tag):
            def func(*deps):
                events.append(("start", tag))
                if tag.startswith("notebook:"):
                    barrier.wait()
                events.append(("end", tag))
                (tmp_path / f"{tag.replace(':', '_')}.{run}").write_text(tag)
            return func

        def job(key, deps=()):
            return Job(key, tmp_path / f"{key.replace(':', '_')}.{run}", f"fp-{key}", make(key), deps=deps)
        return {"simulate:x": job("simulate:x"), "analyze:x": job("analyze:x", ("simulate:x",)),
                "manifest": job("manifest", ("analyze:x",)),
                "notebook:a": job("notebook:a", ("manifest",)), "notebook:b": job("notebook:b", ("manifest",)),
                "book": job("book", ("notebook:a", "notebook:b"))}

    out = execute(jobs_with(threading.Barrier(2, timeout=30), "together"), isolate=False)  # heavy jobs in this process
    assert set(out) == {"simulate:x", "analyze:x", "manifest", "notebook:a", "notebook:b", "book"}
    assert events[:6] == [(e, k) for k in ("simulate:x", "analyze:x", "manifest") for e in ("start", "end")]
    assert {k for _, k in events[6:10]} == {"notebook:a", "notebook:b"} and events[10:] == [("start", "book"),
                                                                                           ("end", "book")]
    events.clear()
    with pytest.raises(pipeline.JobFailed, match="BrokenBarrierError"):  # one at a time: the first notebook waits alone
        execute(jobs_with(threading.Barrier(2, timeout=1), "sync"), scheduler="sync", isolate=False)


def test_failed_job_leaves_no_stamp(tmp_path):
    out = tmp_path / "x.json"

    def boom():
        out.write_text("half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        execute({"x": Job("x", out, "fp", boom)})
    assert not pipeline.up_to_date(out, "fp")


@pytest.mark.parametrize("scheduler", [None, "sync", "threads"])
def test_a_failed_job_is_one_line_and_the_log_keeps_its_traceback(tmp_path, scheduler):
    """Whatever runs the graph, a job that raises reaches the caller as one line (the job, the
    exception's first line, where the traceback is) and the run's log keeps the traceback."""
    log = tmp_path / "run-log.jsonl"

    def deep():
        raise ValueError("All-NaN slice encountered\nand more detail")

    def boom():
        deep()

    with pytest.raises(pipeline.JobFailed) as err:
        execute({"x": Job("x", tmp_path / "x.json", "fp", boom, log=log)}, scheduler=scheduler)
    line = str(err.value)
    assert "\n" not in line
    # the seconds are the job's own (0 or 1 here, as the machine is busy)
    assert re.fullmatch(r"x failed after \d+ s: ValueError: All-NaN slice encountered; the full traceback is in "
                        + re.escape(str(log)), line), line
    event = json.loads(log.read_text().splitlines()[-1])
    assert event["event"] == "failed" and event["error"] == "ValueError: All-NaN slice encountered"
    assert "Traceback (most recent call last)" in event["traceback"] and "in deep" in event["traceback"]


@pytest.mark.slow
def test_a_failed_notebook_names_its_cell_and_synclib_frame_and_is_kept(tmp_path, monkeypatch):
    """A notebook whose cell raises inside synclib: the job's line names the cell's own line and
    synclib's frame, the executed copy is kept under RESULTS/failed/, the log holds the traceback
    (the kernel printed it to the cell's stderr); a later success removes the kept copy."""
    from synclib.notebook import NotebookFailed
    from synthetic import SYNTHETIC_PAIRS, build_synthetic_results

    root = build_synthetic_results(tmp_path / "results", pairs=SYNTHETIC_PAIRS[:1], n_episodes=6,
                                   analyze_kwargs={"nonlinear": False, "tom": False})
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    head = ("---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
            "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n")
    params = "```{code-cell}\n:tags: [parameters]\n\nresults_dir = 'x'\n```\n\n"
    setup = "```{code-cell}\nfrom synclib import notebook\n\nres, published = notebook.setup(results_dir)\n```\n\n"
    nb = tmp_path / "nbs" / "a_figure.md"
    nb.parent.mkdir()
    nb.write_text(head + "# A figure\n\n" + params + setup + "```{code-cell}\nx = 1\nres.run('X-Y')\n```\n")
    out = tmp_path / "executed" / "a_figure.ipynb"
    out.parent.mkdir()
    log = tmp_path / "run-log.jsonl"
    job = Job("notebook:a_figure", out, "fp", lambda: pipeline.step_notebook({"notebooks": {}}, nb, out,
                                                                              str(root / "claims.json")), log=log)
    with pytest.raises(pipeline.JobFailed) as err:
        job()
    kept = root / "failed" / "a_figure.ipynb"
    line = str(err.value)
    assert "\n" not in line and line.startswith("notebook:a_figure failed after ")
    assert ("cell In [4] raised KeyError: \"run 'X-Y' not in" in line
            and "at `res.run('X-Y')` -> synclib/analysis/results.py:" in line and " in run; the executed notebook is " in line)
    assert line.endswith(f"{kept}; the full traceback is in {log}")
    assert kept.is_file() and not out.exists() and not list(out.parent.glob("*.tmp.ipynb"))
    event = json.loads(log.read_text().splitlines()[-1])
    assert "Traceback (most recent call last)" in event["traceback"] and "synclib/analysis/results.py" in event["traceback"]
    assert isinstance(err.value.__cause__, NotebookFailed)

    nb.write_text(head + "# A figure\n\n" + params + setup + "```{code-cell}\nres.run('S-S')\n```\n")
    job()
    assert out.is_file() and not kept.exists()


def _finish(jobs, keys):
    """Pretend ``keys`` ran: write their outputs and stamps as the pipeline does."""
    for k in keys:
        job = jobs[k]
        job.output.parent.mkdir(parents=True, exist_ok=True)
        job.output.write_text("x")
        pipeline.mark_done(job.output, job.fp, inputs=job.inputs, seconds=1.0)


@pytest.mark.long  # the whole grid's jobs fingerprinted and planned (about 25 s): CI runs it
def test_a_setting_reruns_exactly_its_step_and_dry_run_says_why(tmp_path):
    from synclib.run.plan import format_plan, plan

    over = [f"results_dir={tmp_path / 'r'}", "pairs=[S-G]", "orders=first"]
    cfg = load_config(None, over)
    jobs = build_jobs(cfg, ("simulate", "judge", "analyze"))
    _finish(jobs, jobs)
    assert all(p.status == "up to date" for p in plan(jobs, cfg))
    # a judge setting re-runs judging only; a speed setting nothing; a simulate setting all three
    for setting, expect in (("judge.sample=2", {"judge:S-G"}), ("judge.concurrency=3", set()),
                            ("analysis.max_resident_gib=9", set()), ("simulate.cache_gib=0.5", set()),
                            ("analysis.alpha=0.5", {"analyze:S-G"}),
                            ("simulate.temperature=0.9", {"simulate:S-G", "judge:S-G", "analyze:S-G"})):
        cfg2 = load_config(None, over + [setting])
        rows = plan(build_jobs(cfg2, ("simulate", "judge", "analyze")), cfg2)
        assert {r.key for r in rows if r.status == "will run"} == expect, setting
    rows = plan(build_jobs(cfg2, ("simulate", "judge", "analyze")), cfg2)
    text = format_plan(rows)
    assert "simulate.temperature: 0.7 -> 0.9" in text and "upstream job(s) simulate:S-G will run" in text
    assert "3 of 3 jobs would run" in text


def test_a_new_analysis_format_reruns_the_analyses_only(tmp_path, monkeypatch):
    """Code that writes other analysis files for the same settings (issue 74: the debiased CKA) raises
    ``synclib.analysis.ANALYSIS_FORMAT``: finished analyses re-run, and the dry run says why; cubes and judge
    tables stay."""
    from synclib.run.plan import format_plan, plan

    cfg = load_config(None, [f"results_dir={tmp_path / 'r'}", "pairs=[S-G]", "orders=first"])
    jobs = build_jobs(cfg, ("simulate", "judge", "analyze"))
    _finish(jobs, jobs)
    monkeypatch.setattr(pipeline, "ANALYSIS_FORMAT", pipeline.ANALYSIS_FORMAT + 1)
    rows = plan(build_jobs(cfg, ("simulate", "judge", "analyze")), cfg)
    assert {r.key for r in rows if r.status == "will run"} == {"analyze:S-G"}
    assert f"analysis_format: {pipeline.ANALYSIS_FORMAT - 1} -> {pipeline.ANALYSIS_FORMAT}" in format_plan(rows)


def test_dry_run_cli_starts_nothing(tmp_path, capsys):
    from synclib import cli

    out = tmp_path / "r"
    assert cli.main(["run", "--dry-run", "--set", f"results_dir={out}"]) == 0
    text = capsys.readouterr().out
    assert "simulate:S-S" in text and "simulate:G-G" in text and "because output missing" in text
    assert "training samples per dataset" in text and "WARNING" not in text
    assert not out.exists()


def test_planning_a_run_imports_no_torch(tmp_path):
    """The run's own process plans and schedules; its jobs load torch in their child processes.
    A dry run (the same planning, sizes included) in a fresh interpreter leaves torch unimported,
    so the run's process holds none of torch's ~150 MB beside its largest job."""
    code = ("import sys; from synclib.cli import main; "
            f"rc = main(['run', '--dry-run', '--set', 'results_dir={tmp_path / 'r'}']); "
            "print('rc', rc, 'torch', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "training samples per dataset" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "rc 0 torch False"


def test_paper_dry_run_prices_the_grid_before_its_tasks_are_fetched(tmp_path, monkeypatch, capsys, sotopia_dir):
    """Without the paper's tasks the dry run plans and prices the 36 runs from the task set's
    recorded size, says how to fetch them, and fetches nothing (no traceback); with the cache
    filled by `synclib fetch sotopia --from`, it plans the same jobs at the same price."""
    from synclib import cli
    from synclib.tasks import datasets

    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(datasets.SOTOPIA.url_env, "http://127.0.0.1:9/")  # nothing may be downloaded
    args = ["run", "--config", str(REPO / "config" / "paper.yaml"), "--dry-run",
            "--set", f"results_dir={tmp_path / 'r'}"]
    assert cli.main(args) == 0
    before = capsys.readouterr()
    assert "synclib fetch sotopia" in before.out and "--from" in before.out and "Traceback" not in before.err
    assert "counts its 450 tasks as recorded" in before.out
    assert not (tmp_path / "cache" / "sotopia").exists()
    assert cli.main(["fetch", "sotopia", "--from", str(sotopia_dir)]) == 0
    assert "ImpACT" in capsys.readouterr().out  # the licence is named on first use
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert text.count("RUN  simulate:") == 36 and "training samples per dataset" in text
    assert not (tmp_path / "r").exists()

    def priced(out):
        return [line for line in out.splitlines() if line.startswith(("RUN  simulate:", "36 simulations", "total:"))
                or "GPU-hours on" in line]
    assert priced(before.out) == priced(text) and len(priced(text)) > 36


def test_the_default_run_plans_enough_training_samples_per_dataset():
    """Issue 22: every ordered run of config/default.yaml, every condition, lag and direction,
    plans at least 150 training samples and a quarter more than where the measured curves say
    SyncR² leaves 0 (the dry run's plan, nothing run: an upper bound, as dialogs that end early
    give fewer; the book quotes the counts the analysis used).  Issue 22 asked for 250 within a
    30-minute job; the job now has 20 minutes and the simulation is prefill-bound, so the default
    plays 40 tasks.  A run cut to a few tasks is warned about, naming the settings to change."""
    from synclib.analysis.sizing import format_sizes, run_sizes

    cfg = load_config(None)
    sizes = run_sizes(cfg, pipeline.runs(cfg))
    assert {s.run for s in sizes} == {"S-S", "G-G"}
    for s in sizes:
        trains = [v["train"] for cond in s.samples.values() for v in cond.values()]
        assert min(trains) >= 150, (s.run, s.samples)
        assert s.needed is not None and min(trains) >= 1.25 * s.needed and not s.warning, (s.run, s.needed)
    small = load_config(None, ["simulate.episodes=6", "simulate.max_utterances=8"])
    text = format_sizes(run_sizes(small, pipeline.runs(small)))
    assert "WARNING: S-S: at most" in text and "simulate.episodes" in text


def test_changed_simulation_settings_replace_a_finished_cube(tmp_path, monkeypatch):
    """A simulate job that runs although it finished once (its settings changed) must not hand
    back the stale cube; one that finished without a stamp (killed in between) re-uses it."""
    cfg = load_config(None, ["simulate.episodes=2", f"results_dir={tmp_path}"])
    run = pipeline.runs(cfg)[0]
    out = tmp_path / "cubes" / f"{run.name}.nc"
    out.parent.mkdir(parents=True)
    seen = []
    monkeypatch.setattr(pipeline, "simulate", lambda *a, **k: seen.append(out.exists()))
    out.write_text("stale cube")
    pipeline.mark_done(out, "old-fingerprint")
    pipeline.step_simulate(cfg, run, out)
    assert seen == [False] and pipeline.read_stamp(out) is None
    out.write_text("finished cube, stamp lost to a kill")
    pipeline.step_simulate(cfg, run, out)
    assert seen == [False, True]


def _default_plan(tmp_path):
    import json

    from synclib.paths import BENCH_RESULTS
    from synclib.run.plan import CALIBRATION, plan

    cal = json.loads((BENCH_RESULTS / CALIBRATION).read_text())
    over = [f"results_dir={tmp_path / 'r'}", f"dtype={cal['dtype_used']}"]
    cfg = load_config(None, over)
    return cal, over, cfg, {r.key: r for r in plan(build_jobs(cfg, pipeline.STEPS), cfg)}


def test_dry_run_estimates_every_job_of_the_default_from_the_measured_run(tmp_path):
    """Each job of the default gets its time from the measured main job
    (bench/results/main_job_cpu.json): the default's own configuration gives back the measured
    seconds (per job kind, the mean over the measured runs); a run twice as long in tasks and
    in float32 scales the simulation by the utterances and the measured float32 factor.  (The
    claims job, new, has its own test below.)"""
    from synclib.run.plan import format_plan, plan, simulate_work

    cal, over, cfg, rows = _default_plan(tmp_path)
    assert all(r.seconds is not None for k, r in rows.items() if k != "claims"), \
        [k for k, r in rows.items() if r.seconds is None]
    sims = cal["jobs"]["simulate"]
    assert rows["simulate:S-S"].seconds == pytest.approx(sims["S-S"]["seconds"], rel=1e-3)
    assert rows["notebook:power"].seconds == cal["jobs"]["notebooks"]["power"]["seconds"]
    mean_analysis = np.mean([v["seconds"] for v in cal["jobs"]["analyze"].values()])
    assert rows["analyze:G-G"].seconds == pytest.approx(mean_analysis)
    assert rows["simulate:S-S"].peak_gib == sims["S-S"]["peak_rss_gib"]
    text = format_plan(list(rows.values()), cfg)
    assert f"computing in {cal['dtype_used']} (set in the configuration)" in text
    assert "the session caches may hold" in text and "peaked at" in text

    f32 = cal["dtypes"]["float32_factor"]
    cfg2 = load_config(None, over[:1] + ["dtype=float32", "simulate.seeds=[0,1,2,3]"])  # twice the default's
    rows2 = {r.key: r for r in plan(build_jobs(cfg2, ("simulate",)), cfg2)}
    ratio = simulate_work(cfg2)["planned"] / simulate_work(cfg)["planned"]
    assert ratio == 2
    if cal["dtype_used"] == "bfloat16":
        assert rows2["simulate:S-S"].seconds == pytest.approx(sims["S-S"]["seconds"] * ratio * f32, rel=1e-3)


def test_dry_run_scales_each_job_by_this_machines_timings_over_the_calibrations(tmp_path, monkeypatch):
    """Issue 75, item 3: on another machine each heavy job's estimate is the calibration's times this machine's
    timing over the calibration machine's: a simulation by its models', the judge by its model's, the analysis by
    the ridge grid's; the dry run says so.  Without timings (none in the calibration, or a model that cannot be
    timed here) the estimates stay the calibration machine's."""
    from synclib.run import speed
    from synclib.run.plan import format_plan, machine_ratios, plan

    cal, over, cfg, rows = _default_plan(tmp_path)
    ratios = {"smollm2-135m": 2.0, "gemma3-270m": 3.0, "judge": 2.5, "ridge": 1.5}
    scaled = {r.key: r for r in plan(build_jobs(cfg, pipeline.STEPS), cfg, ratios)}
    for key, factor in (("simulate:S-S", 2.0), ("simulate:G-G", 3.0), ("judge:S-S", 2.5), ("analyze:S-S", 1.5)):
        assert scaled[key].seconds == pytest.approx(rows[key].seconds * factor), key
    assert scaled["notebook:intro"].seconds == rows["notebook:intro"].seconds
    text = format_plan(list(scaled.values()), cfg, ratios=ratios)
    assert "scaled to this machine by its own timed forwards" in text and "gemma3-270m 3x" in text
    # the ratios: this machine's timings (cached per machine) over the calibration's: the pairs' models in the run's
    # dtype against the calibration's, the local judge in float32 on both, the ridge grid
    calls = []
    monkeypatch.setattr(speed, "_cache", lambda: tmp_path / "speed.json")
    monkeypatch.setattr(speed, "run_in_child", lambda f, args=(): f(*args))  # here, to see the calls
    monkeypatch.setattr(speed, "model_seconds", lambda s, d: calls.append(f"{s}@{d}") or
                        {"smollm2-135m@float32": 0.4}.get(f"{s}@{d}", 0.9))
    monkeypatch.setattr(speed, "ridge_seconds", lambda: calls.append("ridge") or 0.3)
    f32 = load_config(None, over[:1] + ["dtype=float32"])
    there = {"speed": {"format": speed.SPEED_FORMAT, "dtype": "bfloat16", "timings": {
        "smollm2-135m@bfloat16": 0.2, "gemma3-270m@bfloat16": 0.3, "smollm2-135m@float32": 1.0, "ridge": 0.3}}}
    assert machine_ratios(f32, there, log=lambda m: None) == pytest.approx(
        {"smollm2-135m": 2.0, "gemma3-270m": 3.0, "judge": 0.4, "ridge": 1.0})
    assert sorted(calls) == ["gemma3-270m@float32", "ridge", "smollm2-135m@float32"]  # the judge's model once
    assert machine_ratios(f32, there, log=lambda m: None) and len(calls) == 3  # the second time from the cache
    assert machine_ratios(f32, {"jobs": {}}) is None  # a calibration without timings
    assert machine_ratios(f32, {"speed": {**there["speed"], "format": 0}}) is None  # nor of this format
    said = []
    monkeypatch.setattr(speed, "timings", lambda *a, **k: (_ for _ in ()).throw(OSError("no such model")))
    assert machine_ratios(f32, there, log=said.append) is None and "could not time this machine" in said[0]


def test_speed_times_a_real_model_and_ridge_grid(tmp_path, monkeypatch):
    """The timings themselves, on the embedded SmolLM2 in a child process: positive seconds, kept under the
    machine's key."""
    from synclib.run import speed

    monkeypatch.setattr(speed, "_cache", lambda: tmp_path / "speed.json")
    got = speed.timings([("smollm2-135m", "float32")], log=lambda m: None)
    assert set(got) == {"smollm2-135m@float32", "ridge"} and all(v > 0 for v in got.values())
    assert json.loads((tmp_path / "speed.json").read_text()) == {speed.machine_key(): got}
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # held to fewer instructions: another machine's timings
    assert speed.machine_key().endswith(f"|ATEN_CPU_CAPABILITY=avx2|v{speed.SPEED_FORMAT}")


def test_the_claims_job_has_a_measured_time(tmp_path):
    _, _, _, rows = _default_plan(tmp_path)
    assert rows["claims"].seconds is not None


def test_run_clock_counts_steps_and_scales_what_is_left():
    from synclib.run.plan import JobPlan

    rows = [JobPlan("a", "a", "will run", "x", seconds=100), JobPlan("b", "b", "up to date", ""),
            JobPlan("c", "c", "will run", "x", seconds=300), JobPlan("d", "d", "will run", "x", seconds=60)]
    clock = pipeline._RunClock(rows)
    assert clock.start("a") == "step 1 of 3: " and clock.start("b") == ""
    assert clock.finish("a", 200) == "; 2 step(s) left, about 12 min"     # twice as slow: (300 + 60) x 2
    assert clock.start("c") == "step 2 of 3: "
    assert clock.finish("c", 300) == "; 1 step(s) left, about 75 s"      # 1.25 x 60 s: seconds under 90 s
    assert clock.finish("d", 50) == ""


def test_estimates_count_notebooks_running_at_once():
    """The plan, its summary and the run clock count the notebooks AT_ONCE at a time."""
    from synclib.notebook import AT_ONCE
    from synclib.run.plan import JobPlan, plan_summary, wall_seconds

    est = [("simulate:x", 600), ("notebook:a", 120 * AT_ONCE), ("notebook:b", 120 * AT_ONCE), ("book", 60)]
    assert wall_seconds(est) == 600 + 240 + 60
    rows = [JobPlan(k, k, "will run", "x", seconds=v) for k, v in est]
    assert plan_summary(rows).endswith("about 15 min")
    clock = pipeline._RunClock(rows)
    clock.start("simulate:x")
    assert clock.finish("simulate:x", 600) == "; 3 step(s) left, about 5 min"


def test_the_dry_runs_gpu_rate_is_the_latest_dialog_loop_benchmark(tmp_path):
    """The paper's dry run prices simulations from the most recent measured run of the dialog
    loop on a GPU (utterances/s), naming the file, the scheduling, the size and the card."""
    import json

    from synclib.run import price

    (tmp_path / "simulate_cuda_old.json").write_text(json.dumps({
        "benchmark": "bench_simulate", "date": "2026-11-20", "machine": {"gpu": "NVIDIA H200"},
        "simulate": {"utterances_per_s": 2.1, "seconds": 100.0, "utterances": 210}}))
    (tmp_path / "loop_cuda_new.json").write_text(json.dumps({
        "benchmark": "scheduling", "date": "2026-11-27", "machine": {"gpu": "NVIDIA H100 80GB HBM3"},
        "settings": {"tasks": 32, "seeds": [0, 1]},
        "results": {"mistral7b": {"modes": {"continuous": {"utterances_per_s": 6.729, "wall_s": 100.0,
                                                           "utterances": 673}}}}}))
    ref = price.loop_reference(tmp_path)
    assert ref.rate == 6.73 and ref.card == "H100"
    assert ref.describe().startswith("loop_cuda_new.json (2026-11-27, NVIDIA H100 80GB HBM3): continuous "
                                     "scheduling, 32 tasks x 2 seed(s), 6.73 utterances/s")
