"""The dialogs page: what is collected from the cubes and judge tables (synclib.analysis.dialogs), and
the page that shows it (notebooks/dialogs.md: the offline HTML widget, its sentences and the prompts of
one turn), executed with papermill as the main job does.

Data: a synthetic results directory (two ordered runs, minimal analysis), a real cube
simulated by two tiny random Llamas on embedded tasks (gibberish texts, so escaping is
exercised) wrapped in a results directory with a crafted judge table, and cubes crafted in
memory, in results directories of their own (tests/book_fixtures.py: ``crafted_results``), for the
end-of-dialog rules, the ToM read-out and the prompts of one turn.  The dialogs page reads the cubes and
judge tables only (no analysis, no claims).
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from book_fixtures import ROOT, crafted_cube, crafted_results, execute_notebook, html_outputs, page_text
from synthetic import SYNTHETIC_PAIRS, build_synthetic_results
from synclib.analysis import dialogs
from synclib.judge import DIMENSIONS, TABLE_COLUMNS, save_table
from synclib.tasks.prompts import is_leave, render_text
from synclib.tasks.scenarios import load_tasks

CHROMIUM = "/usr/bin/chromium"
PAGE = ROOT / "notebooks" / "dialogs.md"


class Page:
    """The dialogs page executed on a results directory: ``text`` (its words as a reader sees them),
    ``widget`` (the dialogs' HTML) and ``prompts`` (what the models read, HTML)."""

    def __init__(self, root: Path, out: Path, **params):
        proc = execute_notebook(PAGE, out, {"results_dir": root, **params})
        assert proc.returncode == 0, proc.stderr[-3000:]
        nb = nbformat.read(out, 4)
        outs = html_outputs(nb)
        self.text = page_text(nb)
        self.widget = next(h for h in outs if 'class="sdlg"' in h)
        self.prompts = next(h for h in outs if 'class="spv"' in h)


def _plain(page: str) -> str:
    """``page`` with the code-point marks of characters a font may not draw unwrapped (``visible_html``)."""
    return re.sub(r'<(span|ins) class="[^"]*synclib-cp" data-cp="[^"]*" title="[^"]*">(.*?)</\1>', r"\2", page,
                  flags=re.S)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    """Both orders of the cross pair, analysis kept minimal (the dialogs need none of it)."""
    pairs = [p for p in SYNTHETIC_PAIRS if p[1] == "S-G"]
    return build_synthetic_results(
        tmp_path_factory.mktemp("dlg-synth"), pairs=pairs, n_episodes=8,
        analyze_kwargs=dict(persona_disjoint=False, relationship=False, sample_sizes=None,
                            nonlinear=False, tom=False, split_seeds=(0,), lags=(1,)))


@pytest.fixture(scope="module")
def synthetic_html(synthetic_dir, tmp_path_factory):
    """Every dialog of the synthetic results (``max_dialogs_per_run = None``), as collected and as the page shows
    them."""
    found = dialogs.collect_dialogs(synthetic_dir, max_dialogs_per_run=None)
    return found, Page(synthetic_dir, tmp_path_factory.mktemp("dlg-page") / "all.ipynb", max_dialogs_per_run=None)


@pytest.fixture(scope="module")
def synthetic_capped(synthetic_dir, tmp_path_factory):
    """At most 3 dialogs per run, as collected and as the page shows them."""
    found = dialogs.collect_dialogs(synthetic_dir, max_dialogs_per_run=3)
    return found, Page(synthetic_dir, tmp_path_factory.mktemp("dlg-page") / "capped.ipynb", max_dialogs_per_run=3)


REASONING = 'Agent 1 <b>kept</b> the "deal" & said: it\'s fine'


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir, tmp_path_factory):
    """A results directory around a real cube of the tiny random model (two embedded tasks,
    one seed, passive and ToM runs) and a judge table for the first dialog."""
    from synclib.cube import open_cube
    from synclib.simulate import Passes, RunOptions, Sampling, simulate

    root = tmp_path_factory.mktemp("dlg-tiny")
    for sub in ("cubes", "judge"):
        (root / sub).mkdir()
    tasks = load_tasks("embedded")
    cube_path = simulate(tiny_model_dir, tiny_model_dir, [tasks[0], tasks[3]], [0], root / "cubes" / "T-T.nc",
                         max_utterances=4, sampling=Sampling(max_new_tokens=6),
                         passes=Passes(passive=True, tom=True, taskset=tasks), options=RunOptions(progress=False))
    cube = open_cube(cube_path, chunks=None)
    ti = int(cube["task_index"].values[0])
    rows = [{"episode": ti, "task_index": ti, "sim_seed": 0, "agent": a, "agent_name": tasks[ti].names[a - 1],
             "dimension": d, "score": 3 if d != "secret" else -2, "expected": np.nan,
             "reasoning": f"{REASONING} ({d}, agent {a})" if d == "goal" else "", "judge": "handmade",
             "mode": "json", "error": "", "raw": ""} for a in (1, 2) for d in DIMENSIONS]
    save_table(pd.DataFrame(rows, columns=TABLE_COLUMNS), root / "judge" / "T-T.judge.csv")
    manifest = {"name": "tiny", "embedded": False, "config": {"scenarios": "embedded",
                                                              "judge": {"sample": 1}},
                "pairs": [{"name": "T-T", "pair": "T-T", "order": 1, "model_a": "tiny", "model_b": "tiny",
                           "family": "Tiny", "cube": "cubes/T-T.nc", "analysis": "analysis/T-T.nc",
                           "judge": "judge/T-T.judge.csv"}]}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root, cube, tasks


@pytest.fixture(scope="module")
def tiny_page(tiny_run, tmp_path_factory):
    """The page on the tiny model's run, every dialog shown."""
    return Page(tiny_run[0], tmp_path_factory.mktemp("dlg-tiny-page") / "page.ipynb", max_dialogs_per_run=None)


def _stored_utterances(cube, suffix=""):
    """Every stored utterance of a cube: ``(episode, seed, t, text)``."""
    out = []
    n = cube[f"n_utterances{suffix}"].transpose("episode", "sim_seed").values
    ta = cube[f"text_a{suffix}"].transpose("episode", "sim_seed", "round").values
    tb = cube[f"text_b{suffix}"].transpose("episode", "sim_seed", "round").values
    for e, ep in enumerate(cube["episode"].values):
        for s, seed in enumerate(cube["sim_seed"].values):
            for t in range(int(n[e, s])):
                out.append((int(ep), int(seed), t, str((ta if t % 2 == 0 else tb)[e, s, t // 2])))
    return out


# --------------------------------------------------------------------------- the rules
ENDS = [
    ["Hello there.", "I have to go now, I left."],           # LEAVE at utterance 1
    ["a", "b", "c", "d", "e", "f"],                         # the limit (6)
    ['<i>"Hi" & bye</i>', "Leave it to me, I will explain the whole plan to you right now", "Fine."],  # neither
    ["x", "y", "z", "w", "v", "Bye, I will leave"],         # LEAVE at the limit: LEAVE
]
TOM = [["Joy. Assertive. Hello.", "Fear. Directive. Go away, I left."]]


def _tom_cube():
    """One dialog with its ToM dialog: agent 1's first emotion distribution peaked on Trust, agent 2's first
    action read-out missing (no '.' in time), agent 1's first reply in the format."""
    cube = crafted_cube(TOM, tom=True, tom_texts=TOM)
    emo = cube["emotion_a"].values.copy()
    emo[0, 0, 0] = [0.05, 0.7, 0.05, 0.05, 0.05, 0.04, 0.03, 0.03]
    cube["emotion_a"] = (cube["emotion_a"].dims, emo)
    act = cube["action_b"].values.copy()
    act[0, 0, 0] = np.nan  # no '.' generated in time: no action read-out
    cube["action_b"] = (cube["action_b"].dims, act)
    cube["tom_format_a"] = (("episode", "sim_seed", "round"), np.array([[[1, -1, -1]]], dtype=np.int32))
    return cube.drop_vars([v for v in ("tom_format_b",) if v in cube])


@pytest.fixture(scope="module")
def crafted_page(tmp_path_factory):
    """The page on a run of the four end-of-dialog cases (X-Y) and one of the ToM read-out (T-M), without
    a scenario set (names from the cubes, no goals)."""
    root = crafted_results(tmp_path_factory.mktemp("dlg-crafted") / "results",
                           {"X-Y": crafted_cube(ENDS), "T-M": _tom_cube()}, scenarios=None)
    return root, Page(root, root.parent / "page.ipynb")


# --------------------------------------------------------------------------- the rules
def test_end_reason_leave_limit_other(crafted_page):
    long_reply = ENDS[2][1]
    assert not is_leave(long_reply)  # LEAVE only counts within the line's last 10 characters
    cube = crafted_cube(ENDS)
    found = dialogs.dialogs_from_cube(cube, run="X-Y")
    assert [d.genuine.end for d in found] == ["leave", "limit", "other", "leave"]
    assert [d.genuine.n_utterances for d in found] == [2, 6, 3, 6]
    assert found[0].genuine.turns[1].speaker == str(cube["agent2_name"].values[0])
    # the page: each dialog's end, where and why, the utterances escaped
    _, page = crafted_page
    ends = re.findall(r'<details class="sdlg-dialog" data-run="X-Y"[^>]*>.*?<p class="sdlg-end" data-end="(\w+)">'
                      r"<b>How it ended.</b> ([^<]*)</p>", page.widget, re.S)
    assert [e for e, _ in ends] == ["leave", "limit", "other", "leave"]
    assert "utterance 1 has" in ends[0][1] and "also the last allowed utterance (6)" in html.unescape(ends[3][1])
    assert "At the utterance limit: 6 of 6 utterances" in ends[1][1] and "do not explain the end" in ends[2][1]
    assert html.escape('<i>"Hi" & bye</i>') in page.widget and "<i>" not in page.widget
    assert "The results manifest names no scenario set" in html.unescape(page.widget)
    # with the task, the rule is is_leave(utterance, task, turn) on the complete dialog line
    task = load_tasks("embedded")[0]
    assert dialogs.end_reason(["Hi", "ok, I leave"], 16, task=task) == "leave"
    assert dialogs.end_reason(["Hi", "ok"], 2, task=task) == "limit"
    assert dialogs.end_reason([], 16) == "other"


def test_tom_readout_is_the_argmax_of_the_stored_distributions(crafted_page):
    (d,) = dialogs.dialogs_from_cube(_tom_cube(), run="X-Y")
    first, second = d.tom.turns
    assert (first.emotion, round(first.emotion_p, 2), first.tom_format) == ("Trust", 0.7, 1)
    assert second.action is None and second.emotion is not None and second.tom_format is None
    assert d.tom.end == "leave"
    page = crafted_page[1].widget
    assert "emotion Trust 0.70" in page
    assert "action – · format ✓" not in page and "emotion Trust 0.70 · action " in page
    assert f"emotion {second.emotion} {second.emotion_p:.2f} · action –</div>" in page
    assert html.escape("Joy. Assertive. Hello.") in page


# --------------------------------------------------------------------------- synthetic results
def test_synthetic_every_utterance_verbatim_and_runs_listed(synthetic_dir, synthetic_html):
    from synclib.analysis.results import load_results

    found, shown = synthetic_html
    page = _plain(shown.widget)
    res = load_results(synthetic_dir)
    for r in res.runs:
        assert f'<option value="run:{html.escape(r.name)}">' in page
        import xarray as xr

        with xr.open_dataset(r.cube) as cube:
            for suffix in ("", "_tom"):
                for ep, seed, t, text in _stored_utterances(cube, suffix):
                    assert f'<span class="sd-x">{html.escape(text)}</span>' in page, (r.name, ep, seed, t)
            n = cube.sizes["episode"] * cube.sizes["sim_seed"]
        assert page.count(f'data-run="{r.name}"') == n
    assert '<option value="pair:S-G">' in page
    assert found.counts["dialogs"] == len(found.dialogs) == sum(r.total for r in found.runs)
    assert sum(found.counts[k] for k in dialogs.END_REASONS) == found.counts["dialogs"]


def test_synthetic_judge_reasoning_scores_and_no_network(synthetic_dir, synthetic_html):
    from synclib.analysis.results import load_results

    found, shown = synthetic_html
    page = shown.widget
    assert "synthetic test data" in page  # the judge's reasoning column
    res = load_results(synthetic_dir)
    table = res.judge(res.run_names[0])
    row = table.iloc[0]
    d = next(x for x in found.dialogs if x.run == res.run_names[0] and x.task_index == row["task_index"]
             and x.sim_seed == row["sim_seed"])
    score = next(s for s in d.scores if s.agent == row["agent"] and s.dimension == row["dimension"])
    assert score.score == int(row["score"]) and score.reasoning == row["reasoning"]
    assert len(d.scores) == 2 * len(DIMENSIONS)
    assert not re.search(r"https?://", page)
    assert not re.search(r"\b(src|href)\s*=", page, re.I)
    assert "<script>" in page and "max-width:100%" in page
    widths = re.findall(r"width:\s*([^;}\"]+)", page)
    assert widths and all(w.endswith("%") or w == "0" for w in widths), widths  # no fixed widths


def test_cap_states_what_was_left_out(synthetic_dir, synthetic_capped):
    found, shown = synthetic_capped
    page = shown.widget
    assert len(found.dialogs) == 3 * len(found.runs)
    assert page.count('<details class="sdlg-dialog"') == len(found.dialogs)
    assert all(r.shown == 3 and len(r.left_out) == r.total - 3 for r in found.runs)
    assert "at most 3 dialogs per run" in page
    for r in found.runs:  # the left-out dialogs, named by episode and seed
        seeds = sorted({s for _, s in r.left_out})
        assert f"{r.name}: episodes " in page and all(f"of seed {s}" in page for s in seeds)
    sentence = shown.text
    assert f"hold {found.counts['dialogs']} dialogs" in sentence and "left out" in sentence
    assert f"{found.counts['leave']} ended with LEAVE" in sentence
    assert dialogs.collect_dialogs(synthetic_dir, max_dialogs_per_run="None").max_dialogs_per_run is None
    assert dialogs.collect_dialogs(synthetic_dir, max_dialogs_per_run="2").max_dialogs_per_run == 2
    with pytest.raises(ValueError):
        dialogs.collect_dialogs(synthetic_dir, max_dialogs_per_run=-1)
    assert "These are not dialogs" in sentence  # whose dialogs these are: synthetic test data


# --------------------------------------------------------------------------- a real cube
def test_real_cube_texts_goals_judge_and_tom(tiny_run, tiny_page):
    root, cube, tasks = tiny_run
    found = dialogs.collect_dialogs(root, max_dialogs_per_run=None)
    page = _plain(tiny_page.widget)
    assert len(found.dialogs) == 2 and found.tasks is not None and not found.tasks_missing
    (run,) = found.runs  # nothing the page must say it lacks
    assert run.has_cube and run.has_judge_table and run.max_utterances == 4
    assert not run.mismatched_tasks and not run.missing_tasks
    assert '<p class="sdlg-note">Run T-T:' not in page
    for suffix in ("", "_tom"):
        stored = _stored_utterances(cube, suffix)
        assert stored
        for ep, seed, t, text in stored:
            assert f'<span class="sd-x">{html.escape(text)}</span>' in page or text == "", (suffix, ep, t)
    for d in found.dialogs:
        task = tasks[d.task_index]
        assert d.names == task.names
        for a in (0, 1):
            goal = render_text(task.env.agent_goals[a])
            assert d.goals[a] == goal and "<" not in goal
            assert html.escape(goal) in page
        assert html.escape(render_text(task.env.scenario)) in page
        utts = [tr.text for tr in d.genuine.turns]
        left = is_leave(utts[-1], task, len(utts) - 1)
        assert d.genuine.end == ("leave" if left else "limit" if len(utts) == 4 else "other")
        assert d.genuine.end != "other"  # a real simulation ends by LEAVE or the limit
        assert d.tom is not None and len(d.tom.turns) == int(cube["n_utterances_tom"].sel(
            episode=d.episode, sim_seed=d.sim_seed))
        assert all(t.emotion is not None and 0 < t.emotion_p <= 1 for t in d.tom.turns)
        assert d.passive_reader  # the persona drawn for the passive reader, by name
    judged, unjudged = found.dialogs
    assert html.escape(f"{REASONING} (goal, agent 2)") in page
    assert [s.score for s in judged.scores if s.dimension == "secret"] == [-2, -2]
    assert not unjudged.scores and "judges a random sample of 1 dialog per run" in page
    assert found.counts["judged"] == 1


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no headless chromium at /usr/bin/chromium")
def test_widget_script_runs_in_chromium(synthetic_capped, tmp_path):
    found, shown = synthetic_capped
    widget = shown.widget
    n = len(found.dialogs)
    harness = """<script>
(function(){
var out=document.body, root=document.querySelector(".sdlg");
function visible(){return Array.prototype.filter.call(root.querySelectorAll("details.sdlg-dialog"),
  function(d){return d.style.display!=="none";});}
try{
out.setAttribute("data-ready", root.getAttribute("data-sdlg-ready"));
out.setAttribute("data-error", root.getAttribute("data-sdlg-error")||"");
var v=visible(); out.setAttribute("data-first", v.length+":"+(v[0]&&v[0].open));
out.setAttribute("data-controls", root.querySelector(".sdlg-controls").hidden?"hidden":"shown");
root.querySelector("button[data-step='1']").click();
v=visible(); out.setAttribute("data-next", v.length+":"+v[0].getAttribute("data-run")+"/"+
  v[0].getAttribute("data-episode")+"/"+v[0].getAttribute("data-seed"));
["run","episode","seed"].forEach(function(k){var s=root.querySelector("select[data-f="+k+"]");s.value="";
  s.dispatchEvent(new Event("change"));});
out.setAttribute("data-all", String(visible().length));
var r=root.querySelector("select[data-f=run]"); r.value="pair:S-G"; r.dispatchEvent(new Event("change"));
out.setAttribute("data-pair", String(visible().length));
out.setAttribute("data-count", root.querySelector(".sdlg-count").textContent);
}catch(e){out.setAttribute("data-harness-error", String(e));}
})();
</script>"""
    page = tmp_path / "dialogs.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{widget}{harness}"
                    "</body></html>")
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert body, proc.stdout[:2000]
    attrs = dict(re.findall(r'(data-[\w-]+)="([^"]*)"', body.group(1)))
    assert "data-harness-error" not in attrs, attrs
    assert attrs["data-ready"] == "1" and attrs["data-error"] == "", attrs
    assert attrs["data-controls"] == "shown"
    assert attrs["data-first"] == "1:true"  # one dialog shown, opened
    first = found.dialogs[1]
    assert attrs["data-next"] == f"1:{first.run}/{first.episode}/{first.sim_seed}"
    assert attrs["data-all"] == str(n) and attrs["data-pair"] == str(n)  # both runs are the pair S-G
    assert attrs["data-count"] == f"{n} of {n} dialogs"
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)


# --------------------------------------------------------------------------- what the models read
def _prompt_of(view_html: str) -> str:
    """The text of one rendered prompt box with the marks removed: cuts dropped, stand-ins unwrapped."""
    box = re.search(r'<div class="spv-text">(.*?)</div>', view_html, re.S).group(1)
    box = re.sub(r'<del class="spv-cut"[^>]*>.*?</del>', "", box, flags=re.S)
    box = re.sub(r"</?ins[^>]*>", "", box)
    assert "<" not in box  # every other character of the prompt is escaped
    return html.unescape(box)


def _boxes(page: str) -> dict:
    return dict(re.findall(r'<details class="spv-view" data-view="(\w+)"(.*?)</details>', page, re.S))


def test_dialog_prompts_show_each_prompt_exactly_masked_parts_marked_and_escaped(tmp_path):
    """The prompts of one turn: each box is the prompt exactly (the marks dropped), the other agent's secret
    and goal marked where the masking hid them, and the dialog's text escaped.  The run: one dialog of
    embedded task 5 with simulation seed 3, its passive reader the drawn one, and a ToM dialog; shown at
    turn 2."""
    from synclib.tasks.prompts import passive_persona, render_prompt

    tasks = load_tasks("embedded")
    task = tasks[5]
    other = task.agents[1]
    history = ['Hi </div><script>alert("x")</script> & "you"', " <del>I'm fine</del> & <ins>you?</ins>"]
    tom = ["Joy. Assertive. <b>Hello</b>", "Fear. Directive. </details> ok"]
    tp = dialogs.turn_prompts(task, 0, history, 3, tasks, tom_history=tom)
    reader = passive_persona(tasks, task.index, 3)
    assert tp.reader == reader == tp.drawn and tp.turn == 2 and tp.dialog is None
    expected = {"active": render_prompt(task, 0, history, "active"),
                "passive": render_prompt(task, 0, history, "passive", reader),
                "tom": render_prompt(task, 0, tom, "tom")}
    for view, text in expected.items():
        assert tp.view(view).text == text
    # the page on a run of that dialog (a third utterance, so that turn 2 is the latest of its turns)
    cube = crafted_cube([history + ["Fine."]], tom=True, tom_texts=[tom + ["Calm. Assertive. Fine."]],
                        tasks=[task], sim_seed=3, readers=[reader.pk])
    shown = Page(crafted_results(tmp_path / "results", {"C-C": cube}), tmp_path / "page.ipynb")
    page = shown.prompts
    assert f"episode 0 ({task.codename}), seed 3, turn 2" in shown.text
    boxes = _boxes(page)
    assert set(boxes) == {"active", "passive", "tom"}
    for view, text in expected.items():
        assert _prompt_of(boxes[view]) == text
        # the marks: the other agent's goal stands as Unknown, its secret is cut, both shown only in <del>
        cuts = " ".join(re.findall(r'<del class="spv-cut"[^>]*>(.*?)</del>', boxes[view], re.S))
        assert html.escape(other.secret, quote=True) in cuts and other.secret not in text
        goal = render_text(task.env.agent_goals[1])
        assert html.escape(goal.split("\n")[0], quote=True) in cuts and goal not in text
        assert re.search(r'<ins class="spv-rep" data-what="goal"[^>]*>Unknown</ins>', boxes[view])
    assert "Imagine you are " + reader.name in expected["passive"]
    assert "<script" not in page and "http" not in page and "<b>Hello" not in page and "<del>I" not in page
    assert "&lt;script&gt;" in page and "&lt;b&gt;Hello" in page and "Legend" in page
    # the recorded reader is the drawn one, and the dialog was re-read: nothing to warn about
    assert "is not the one drawn" not in page and "was not re-read" not in page
    assert f"passive reader: {html.escape(reader.name)} ({reader.pk})" in page


def test_dialog_prompts_of_a_real_dialog(tiny_run, tiny_page, synthetic_html):
    from synclib.tasks.prompts import passive_persona, render_prompt

    root, cube, tasks = tiny_run
    # from the fixture's open cube: opening its file again in this process can crash netCDF4
    found = dialogs.DialogSet(dialogs=dialogs.dialogs_from_cube(cube, run="T-T", tasks=tasks), runs=[], counts={})
    tp = dialogs.dialog_turn_prompts(found, tasks)
    d = tp.dialog
    assert d in found.dialogs
    task = tasks[d.task_index]
    t = tp.turn
    assert 0 <= t < d.genuine.n_utterances and t < d.tom.n_utterances and tp.agent == t % 2
    assert d.passive_reader_id and tp.reader.pk == d.passive_reader_id
    assert tp.reader == passive_persona(tasks, d.task_index, d.sim_seed) == tp.drawn  # as the run drew it
    genuine = [x.text for x in d.genuine.turns[:t]]
    assert tp.view("active").text == render_prompt(task, t % 2, genuine, "active")
    assert tp.view("passive").text == render_prompt(task, t % 2, genuine, "passive", tp.reader)
    assert tp.view("tom").text == render_prompt(task, t % 2, [x.text for x in d.tom.turns[:t]], "tom")
    # the page shows the same turn of the same dialog
    text, page = tiny_page.text, tiny_page.prompts
    assert f"episode {d.episode}" in text and f"seed {d.sim_seed}, turn {t}" in text and tp.reader.name in text
    boxes = _boxes(page)
    assert _prompt_of(boxes["passive"]) == tp.view("passive").text
    # synthetic data has no task texts: an illustration, labelled as such
    shown = synthetic_html[1]
    assert "illustration" in shown.text and "Synthetic test data" in shown.text
    assert set(_boxes(shown.prompts)) == {"active", "passive", "tom"}
