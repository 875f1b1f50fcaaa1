"""Judging episode files and holding the judge against human ratings (table 4, figure 10).

Real parts: episodes and ratings files of our own text, the fake judge server on
127.0.0.1 (``tests/judge_server.py``, case ``shifted``: known scores that differ between
episodes), ``synclib evaluate`` through the CLI, and the page run by papermill on a copy of the
tiny synthetic results (tests/book_fixtures.py) whose claims are judged with the ratings
(``claims.write(..., ratings=, judge_scores=)``, the main job's claims step).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from synclib import judge as J
from synclib.judge import DIMENSIONS, JudgeError, SCORE_RANGES
from synclib.judge.human import agreement, differences, paired_scores, read_ratings, within_share

from judge_server import FakeJudgeServer, shifted_score

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "notebooks" / "table4_fig10_judge_human.md"


@pytest.fixture()
def run_dir(tmp_path_factory, tmp_path) -> Path:
    """A copy of the session's tiny synthetic results, its claims judged again by the test."""
    from book_fixtures import copy_results

    return copy_results(tmp_path_factory.getbasetemp(), tmp_path / "results")


def judge_claims(root: Path, **files) -> None:
    """The claims step on ``root`` with ``files`` (``ratings``, ``judge_scores``: table 4's inputs)."""
    from synclib.analysis import claims, results

    claims.write(results.load_results(root), results.load_published(), **files)


def run_page(nb: Path, root: Path, out: Path) -> str:
    """The page (``nb``) executed on ``root``: its words as a reader sees them and its HTML outputs."""
    import nbformat

    from book_fixtures import execute_notebook, html_outputs, page_text, vegalite_specs

    proc = execute_notebook(nb, out, {"results_dir": root})
    assert proc.returncode == 0, proc.stderr[-3000:]
    executed = nbformat.read(out, 4)
    charts = "application/vnd.vegalite" if vegalite_specs(executed) else ""
    return "\n".join([page_text(executed), *html_outputs(executed), charts])
SHIFTS = {"e-lunch": 0, "e-rent": 1, "e-bike": 3, "e-garden": 6}


def synclib_episode(eid: str, shift: int) -> dict:
    return {"episode_id": eid,
            "scenario": f"Two neighbours talk over the fence about {eid[2:]}. CASE=shifted SHIFT={shift}",
            "agents": [{"name": "Mara Quill", "background": "A retired cartographer.", "goal": "Keep the peace."},
                       {"name": "Tobin Reyes", "background": "", "goal": "Borrow a ladder."}],
            "utterances": ["Morning, Tobin.", "Morning! Could I ask a favour?", "Of course, what is it?"]}


def sotopia_episode(eid: str, shift: int) -> dict:
    """Sotopia's export format (sotopia.database.episodes_to_jsonl), our own text."""
    return {"episode_id": eid, "scenario": f"A chat in a community garden. CASE=shifted SHIFT={shift}",
            "codename": "garden_chat",
            "agents_background": {"Ida Fenn": "Ida Fenn is a 40-year-old gardener.",
                                  "Olek Brandt": "Olek Brandt is a 35-year-old baker."},
            "social_goals": {"Ida Fenn": "Share the harvest.", "Olek Brandt": "Ask for tomatoes."},
            "social_interactions": 'Turn #0: Ida Fenn said: "Look at these tomatoes!"\n\n'
                                   'Turn #1: Olek Brandt said: "Could I have a few?"',
            "reasoning": "", "rewards": [{"goal": 5.0}, {"goal": 6.0}]}


@pytest.fixture()
def episodes_file(tmp_path) -> Path:
    path = tmp_path / "rated.jsonl"
    lines = [synclib_episode(e, s) for e, s in SHIFTS.items() if e != "e-garden"]
    lines.append(sotopia_episode("e-garden", SHIFTS["e-garden"]))
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def human_score(eid: str, agent: int, dim: str, rater: int) -> float:
    """Our hand-made ratings: two raters, 1 point apart, following the episode order."""
    lo, hi = SCORE_RANGES[dim]
    base = lo + (list(SHIFTS).index(eid) * 2 + agent) % (hi - lo)
    return float(base + rater)  # rater 0 or 1: within range because base < hi


def write_ratings(path: Path, rows=None) -> Path:
    rows = rows if rows is not None else [
        (e, a, d, human_score(e, a, d, r), f"r{r}") for e in SHIFTS for a in (1, 2) for d in DIMENSIONS
        for r in (0, 1)]
    path.write_text("episode_id,agent,dimension,score,rater\n"
                    + "".join(f"{e},{a},{d},{s:g},{r}\n" for e, a, d, s, r in rows), encoding="utf-8")
    return path


def judge_file(episodes_file: Path, capsys=None) -> "tuple":
    from synclib.cli import main

    with FakeJudgeServer(default_case="valid") as server:
        rc = main(["evaluate", str(episodes_file), "--judge-url", server.url, "--judge-model", "fake-judge",
                   "--api-key-env", "SYNCLIB_UNSET_VAR", "--timeout", "5", "--no-progress"])
        assert rc == 0
        return J.read_table(episodes_file.with_suffix(".judge.csv")), server


# ------------------------------------------------------------------------------ episodes files
def test_evaluate_episodes_file_both_formats_and_resume(episodes_file):
    table, server = judge_file(episodes_file)
    assert server.total_requests == 4 and server.requests["shifted"] == 4
    assert list(table.columns[:2]) == ["episode", "episode_id"]
    assert len(table) == 4 * 14 and (table.error == "").all()
    for row in table.itertuples():
        assert row.score == shifted_score(row.agent, DIMENSIONS.index(row.dimension), SHIFTS[row.episode_id])
    first = table[table.agent == 1].groupby("episode_id").agent_name.first()
    assert first["e-garden"] == "Ida Fenn" and first["e-lunch"] == "Mara Quill"
    prompts = [b["messages"][1]["content"] for b in server.bodies]
    ours = next(p for p in prompts if "SHIFT=0" in p)
    assert ours.startswith("Here is the context of this interaction:\nScenario: Two neighbours")
    assert "Tobin Reyes's background: Unknown" in ours
    assert 'Turn #1: Tobin Reyes said: "Morning! Could I ask a favour?"' in ours
    sotopia = next(p for p in prompts if "SHIFT=6" in p)
    assert "Olek Brandt's goal: Ask for tomatoes." in sotopia
    assert 'Turn #1: Olek Brandt said: "Could I have a few?"' in sotopia  # shown as Sotopia rendered it
    # a second run asks nothing: every answer is in the cache
    again, server2 = judge_file(episodes_file)
    assert server2.total_requests == 0 and again.equals(table)


@pytest.mark.parametrize("line, message", [
    ("not json", "line 2: not JSON"),
    (json.dumps({"episode_id": "x", "scenario": "s"}), "line 2: neither episode format"),
    (json.dumps({**synclib_episode("e-lunch", 0)}), "line 2: episode_id 'e-lunch' repeats line 1"),
    (json.dumps({**synclib_episode("e-x", 0), "agents": [{"name": "A", "goal": "g"}]}),
     "line 2: field 'agents' must be a list of two"),
    (json.dumps({**synclib_episode("e-x", 0), "utterances": "hello"}), "line 2: field 'utterances'"),
    (json.dumps({**sotopia_episode("e-y", 0), "agents_background": {"Ida Fenn": "x"}}),
     "line 2: 'agents_background' has no entry for 'Olek Brandt'"),
])
def test_bad_episodes_file_is_refused_naming_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(synclib_episode("e-lunch", 0)) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(JudgeError, match=message.replace("(", r"\(").replace("?", r"\?")):
        J.read_episodes(path)
    from synclib.cli import main

    with pytest.raises(SystemExit, match="synclib evaluate: .*bad.jsonl, line 2"):
        main(["evaluate", str(path), "--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "x",
              "--no-progress"])


# ------------------------------------------------------------------------------ human ratings
def test_agreement_and_within_share_match_hand_computation(episodes_file, tmp_path):
    from scipy import stats as sps

    table, _ = judge_file(episodes_file)
    ratings = read_ratings(write_ratings(tmp_path / "ratings.csv"), set(table.episode_id))
    paired = paired_scores(table, ratings)
    assert len(paired) == 4 * 14 and (paired.n_raters == 2).all()
    agree = agreement(paired)
    diffs = differences(paired)
    shares = []
    for dim in DIMENSIONS:
        j, h = [], []
        for e, shift in SHIFTS.items():
            for a in (1, 2):
                j.append(shifted_score(a, DIMENSIONS.index(dim), shift))
                h.append((human_score(e, a, dim, 0) + human_score(e, a, dim, 1)) / 2)
        j, h = np.array(j, float), np.array(h, float)
        n = len(j)
        r = ((j - j.mean()) * (h - h.mean())).sum() / math.sqrt(((j - j.mean()) ** 2).sum() * ((h - h.mean()) ** 2).sum())
        t = r * math.sqrt((n - 2) / (1 - r * r))
        p = 2 * sps.t.sf(abs(t), n - 2)
        row = agree.set_index("dimension").loc[dim]
        assert row.n == n and row.r == pytest.approx(r, abs=1e-12) and row.p == pytest.approx(p, rel=1e-9)
        sd = h.std(ddof=1)
        shares += list(np.abs(j - h) <= sd)
        got = diffs[diffs.dimension == dim]
        assert np.allclose(got.human_sd, sd)
    assert within_share(diffs) == pytest.approx(np.mean(shares))
    assert 0 < within_share(diffs) < 1


@pytest.mark.parametrize("mutate, message", [
    (lambda rows: [r for r in rows if not (r[0] == "e-rent" and r[1] == 2 and r[2] == "goal")],
     r"line \d+: episode 'e-rent', agent 2 has no goal rating"),
    (lambda rows: rows[:5] + [("e-unknown", 1, "goal", 5.0, "r0")] + rows[5:],
     r"line 7: episode_id 'e-unknown' is not among the judged episodes"),
    (lambda rows: rows[:2] + [("e-lunch", 1, "secret", 3.0, "r0")] + rows[2:],
     r"line 4: score 3 of secret is outside its range -10 to 0"),
    (lambda rows: rows[:1] + [("e-lunch", 3, "goal", 3.0, "r0")] + rows[1:],
     r"line 3: agent must be 1 or 2"),
    (lambda rows: rows[:1] + [("e-lunch", 1, "charm", 3.0, "r0")] + rows[1:],
     r"line 3: unknown dimension 'charm'"),
])
def test_bad_ratings_are_refused_naming_the_line(tmp_path, mutate, message):
    rows = [(e, a, d, human_score(e, a, d, r), f"r{r}") for e in SHIFTS for a in (1, 2) for d in DIMENSIONS
            for r in (0, 1)]
    path = write_ratings(tmp_path / "ratings.csv", mutate(rows))
    with pytest.raises(JudgeError, match=message):
        read_ratings(path, set(SHIFTS))


def test_ratings_missing_column(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("episode_id,agent,score\ne-lunch,1,3\n", encoding="utf-8")
    with pytest.raises(JudgeError, match="missing column 'dimension'"):
        read_ratings(path)


def test_config_checks_the_ratings_before_any_work(episodes_file, tmp_path):
    from synclib.config import ConfigError, load_config

    table, _ = judge_file(episodes_file)
    judged = episodes_file.with_suffix(".judge.csv")
    good = write_ratings(tmp_path / "ratings.csv")
    cfg = load_config(None, [f"notebooks.human_ratings={good}", f"notebooks.human_judge_scores={judged}"])
    assert cfg["notebooks"]["human_ratings"] == str(good)
    bad = write_ratings(tmp_path / "bad.csv", [("e-lunch", 1, "goal", 99.0, "r0")])
    with pytest.raises(ConfigError, match=r"notebooks.human_ratings.*bad.csv, line 2: score 99 of goal"):
        load_config(None, [f"notebooks.human_ratings={bad}", f"notebooks.human_judge_scores={judged}"])
    with pytest.raises(ConfigError, match="notebooks.human_ratings needs notebooks.human_judge_scores"):
        load_config(None, [f"notebooks.human_ratings={good}"])


# ------------------------------------------------------------------------------ the page
@pytest.mark.slow
def test_page_renders_without_and_with_ratings(episodes_file, run_dir, tmp_path):
    """The page for a run without ratings (the paper's table and what it needs) and for the fixture's
    ratings given to the claims step (our table 4 and figure 10), executed by papermill as the main job does."""
    judge_claims(run_dir)
    text = run_page(PAGE, run_dir, tmp_path / "plain.ipynb")
    assert "No human ratings were given to this run" in text and "0.71" in text

    judge_file(episodes_file)
    judge_claims(run_dir, ratings=write_ratings(tmp_path / "ratings.csv"),
                 judge_scores=episodes_file.with_suffix(".judge.csv"))
    text = run_page(PAGE, run_dir, tmp_path / "full.ipynb")
    assert "No human ratings were given to this run" not in text
    assert "4 rated episodes, 112 ratings from 2 rater label(s); 56 agent" in text
    assert "fake-judge against the human raters' mean: believability r = " in text
    assert ("They rest on 4 of the 4 rated episodes. Which and why: those the judge's table scores. "
            "None left out.") in text
    assert "56 agent × dimension scores, of 4 episodes, have both" in text
    assert "within one standard deviation of the human ratings (paper, gpt-oss-120b: 75.8 %)" in text
    assert "application/vnd.vegalite" in text


# ------------------------------------------------------------------------------ published ratings
#: the toy study's GPT-4 episodes and the shift of their published GPT-4 scores (``ep2`` has no dialog)
GPT4_SHIFT = {"ep0": 2, "ep1": 3, "ep2": 4}
STUDY_NAMES = (("Wren Okafor", "Jules Marlow"), ("Pia Sandoval", "Dario Kent"), ("Lena Voss", "Omar Haddad"),
               ("Ansel Ruiz", "Mika Toivonen"))


def study_row(pk: str, names, rater: str, scores: dict, dialog=True, shift=0, model="toy") -> dict:
    """One row of Sotopia-π's rating files (their columns), our own text."""
    data = {"scenario": f"Two housemates split the chores. CASE=shifted SHIFT={shift}"}
    if dialog:
        data.update({
            "names": list(names),
            "personal_info": {n: {"name": n, "age": "31", "profession": "nurse", "pronouns": "They/them",
                                  "interests": f"{n} keeps bees", "personality": f"{n} is calm",
                                  "secrets": f"{n} once lost a hive"} for n in names},
            "social_goal": {names[0]: "Skip the dishes.", names[1]: "Share the dishes fairly."},
            "parsed_conversation": [
                {"speaker": names[0], "dialogue": '"Could you do the dishes tonight?"'},
                {"speaker": names[1], "dialogue": '"Only if you take them tomorrow."'},
                {"speaker": names[0], "dialogue": f"{names[0]} left the conversation"}]})
    row = {"ID": "1", "model": model, "pk": pk, "data": json.dumps(data), "prolific_id": rater}
    for a in (1, 2):
        for d in DIMENSIONS:
            row[f"{d}_{a}"] = str(scores[(a, d)])
            row[f"{d}_reasoning_{a}"] = "because,\nreasons"  # commas and newlines inside a field
    return row


def study_files(tmp_path: Path) -> dict:
    """The seven files of the sotopia-human dataset, in the study's layout, our own text:
    three GPT-4 episodes rated by two annotators in gpt4_final.csv (the third, ``ep2``,
    without its dialog), one more (``ep3``) in BC_final.csv, the other rating files empty but
    for their header; GPT-4's published scores of the three GPT-4 episodes (a published
    score needs no dialog, so ``ep2`` has one too)."""
    import csv
    import io

    from synclib.judge.sotopia_human import RATING_FILES, SCORES_FILE

    header = ["ID", "model", "pk", "data", "prolific_id"] + [
        f"{d}{s}_{a}" for a in (1, 2) for d in DIMENSIONS for s in ("", "_reasoning")]
    rows = {"gpt4_final.csv": [], "BC_final.csv": []}
    for e, names in enumerate(STUDY_NAMES):
        for r, rater in enumerate(("PROLIFIC-AAA", "PROLIFIC-BBB")):
            rows["gpt4_final.csv" if e < 3 else "BC_final.csv"].append(
                study_row(f"ep{e}", names, rater, {(a, d): human_score(list(SHIFTS)[e], a, d, r)
                                                    for a in (1, 2) for d in DIMENSIONS},
                          dialog=e != 2, shift=e, model="gpt-4" if e < 3 else "BC"))
    files = {}
    for name in RATING_FILES:
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=header, lineterminator="\r\n")
        w.writeheader()
        w.writerows(rows.get(name, []))
        files[name] = buf.getvalue().encode()
    gpt = {pk: {"env_pk": "x", **{f"agent{a}": {d: float(shifted_score(a, i, shift)) for i, d in enumerate(DIMENSIONS)}
                                   for a in (1, 2)}} for pk, shift in GPT4_SHIFT.items()}
    files[SCORES_FILE] = json.dumps(gpt).encode()
    return files


def hand_r(pairs: dict, dim_index: int):
    """Pearson r and p, by scipy, of judge scores ``pairs`` (episode -> shift of the toy
    score) against our hand-made raters' mean, over both agents of those episodes."""
    from scipy import stats as sps

    dim = DIMENSIONS[dim_index]
    j = [shifted_score(a, dim_index, shift) for e, shift in pairs.items() for a in (1, 2)]
    h = [(human_score(list(SHIFTS)[int(e[2])], a, dim, 0) + human_score(list(SHIFTS)[int(e[2])], a, dim, 1)) / 2
         for e in pairs for a in (1, 2)]
    if np.std(j) == 0 or np.std(h) == 0:
        return None, None
    return sps.pearsonr(j, h)


def test_published_ratings_fetched_prepared_and_held_against_a_judge(tmp_path):
    """``synclib fetch sotopia-human`` on a toy copy served on 127.0.0.1: files checked, the
    study written as episodes, ratings (annotators hashed) and GPT-4's judge table; judged
    by the fake server; table 4 from both judges equals the hand computation.  The episode
    without a dialog is in the ratings and GPT-4's table (published scores need no dialog)
    but not among the episodes a judge reads."""
    import hashlib

    from synclib.tasks import datasets
    from synclib.judge import JudgeConnection, JudgeOptions, evaluate_episodes, read_table
    from test_datasets import Server

    files = study_files(tmp_path)
    www = tmp_path / "www"
    www.mkdir()
    for n, b in files.items():
        (www / n).write_bytes(b)
    ds = datasets.Dataset(name="toy-human", base_url="http://127.0.0.1:9/",
                          files={n: (n, hashlib.sha256(b).hexdigest()) for n, b in files.items()},
                          url_env="SYNCLIB_TOY_HUMAN_URL", about="toy", kind="ratings",
                          prepare=datasets.SOTOPIA_HUMAN.prepare)
    notes = []
    with Server(www) as srv:
        root = datasets.path(ds, cache=tmp_path / "cache", url=srv.url, log=notes.append)
    assert any("1 rated episodes have no dialog" in n and "(ep2)" in n and "kept in ratings.csv" in n
               and "left out of episodes.jsonl" in n for n in notes)
    episodes = root / "episodes.jsonl"
    recs = [json.loads(x) for x in episodes.read_text().splitlines()]
    assert [r["episode_id"] for r in recs] == ["ep0", "ep1", "ep3"]
    assert recs[0]["social_interactions"].split("\n\n") == [
        'Turn #0: Wren Okafor said: "Could you do the dishes tonight?"',
        'Turn #1: Jules Marlow said: "Only if you take them tomorrow."',
        "Turn #2: Wren Okafor left the conversation"]
    assert list(recs[0]["social_goals"]) == ["Wren Okafor", "Jules Marlow"]
    assert recs[2]["condition"] == "BC" and recs[2]["source"] == "BC_final.csv"
    ratings_text = (root / "ratings.csv").read_text()
    assert "PROLIFIC" not in ratings_text
    gpt4 = read_table(root / "gpt-4.judge.csv")
    assert list(dict.fromkeys(gpt4["episode_id"])) == ["ep0", "ep1", "ep2", "ep3"]
    assert gpt4.loc[gpt4.episode_id == "ep2", "score"].notna().all()  # published, though ep2 has no dialog
    assert gpt4.loc[gpt4.episode_id == "ep3", "score"].isna().all()
    assert (gpt4.loc[gpt4.episode_id == "ep3", "error"].str.contains("no published GPT-4 score")).all()

    with FakeJudgeServer(default_case="valid") as server:
        ours = evaluate_episodes(episodes, JudgeOptions(JudgeConnection(
            "fake-judge", server.url, api_key_env="SYNCLIB_UNSET_VAR", timeout=5)), progress=False)
    assert set(ours["episode_id"]) == {"ep0", "ep1", "ep3"}
    # the ratings of ep2 are accepted beside the judge's table that lacks it: they say dialog = no
    ratings = read_ratings(root / "ratings.csv", set(ours["episode_id"]))
    assert len(ratings) == 4 * 2 * 2 * 7 and ratings["rater"].nunique() == 2
    assert set(ratings.loc[~ratings["dialog"], "episode_id"]) == {"ep2"}
    for table, shift_of in ((gpt4, GPT4_SHIFT), (ours, {"ep0": 0, "ep1": 1, "ep3": 3})):
        paired = paired_scores(table, ratings)
        assert set(paired["episode_id"]) == set(shift_of)
        agree = agreement(paired).set_index("dimension")
        for i, dim in enumerate(DIMENSIONS):
            r, p = hand_r(shift_of, i)
            if r is None:
                assert not np.isfinite(agree.loc[dim, "r"])
                continue
            assert agree.loc[dim, "r"] == pytest.approx(r, abs=1e-12) and agree.loc[dim, "p"] == pytest.approx(p, rel=1e-9)


def test_ratings_of_an_unjudged_episode_need_dialog_no(tmp_path):
    """A rating of an episode the judge did not score is refused unless its row says the
    episode has no dialog; a dialog value other than yes, no or empty is refused."""
    rows = [(e, a, d, human_score(e, a, d, r), f"r{r}") for e in SHIFTS for a in (1, 2) for d in DIMENSIONS
            for r in (0, 1)]

    def write(dialog_of):
        path = tmp_path / "ratings.csv"
        path.write_text("episode_id,agent,dimension,score,rater,dialog\n" + "".join(
            f"{e},{a},{d},{s:g},{r},{dialog_of(e)}\n" for e, a, d, s, r in rows), encoding="utf-8")
        return path

    judged = {"e-lunch", "e-rent", "e-bike"}
    got = read_ratings(write(lambda e: "no" if e == "e-garden" else ""), judged)
    assert set(got.loc[~got["dialog"], "episode_id"]) == {"e-garden"} and got["dialog"].sum() == 3 * 2 * 7 * 2
    with pytest.raises(JudgeError, match=r"line \d+: episode_id 'e-garden' is not among the judged episodes"):
        read_ratings(write(lambda e: "yes"), judged)
    with pytest.raises(JudgeError, match=r"line 2: dialog must be yes, no or empty, got 'maybe'"):
        read_ratings(write(lambda e: "maybe"), judged)


def load_bench():
    """bench/bench_judge_human.py as a module (the benchmark itself, not a copy)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_judge_human", ROOT / "bench" / "bench_judge_human.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_benchmark_uses_published_scores_on_every_episode_and_a_judge_on_those_with_a_dialog(run_dir, tmp_path):
    """The benchmark on the toy study (prepared by the real prepare): GPT-4's published
    scores on all three GPT-4 episodes, the one without a dialog included; a judge (the fake
    server) on the two GPT-4 episodes with a dialog; each judge's episode set (rule, count,
    left-out ids and reasons) in its record and in the page's sentence; r as by hand.  The page is a copy
    of the notebook that reads this record (``load_measured(FOLDER)``) instead of bench/results'."""
    from synclib.judge import JudgeConnection, JudgeOptions, evaluate_episodes
    from synclib.judge.human import NO_DIALOG
    from synclib.judge.sotopia_human import prepare

    root = tmp_path / "study"
    root.mkdir()
    for n, b in study_files(tmp_path).items():
        (root / n).write_bytes(b)
    prepare(root)
    bench = load_bench()
    with FakeJudgeServer(default_case="valid") as server:
        def judge(subset):
            return evaluate_episodes(subset, JudgeOptions(JudgeConnection(
                "fake-judge", server.url, api_key_env="SYNCLIB_UNSET_VAR", timeout=5)), progress=False)

        res, judged = bench.measure_all(root, judge, work=tmp_path / "work")
        assert server.total_requests == 2  # the two GPT-4 episodes with a dialog, nothing else
    gpt4, ours = res
    assert judged == {"fake-judge": 2}
    assert gpt4["episodes"] == 3 and gpt4["scores"] == 3 * 2 * 7
    assert gpt4["episode_set"] == {
        "rule": bench.PUBLISHED_RULE, "episodes": 3, "rated_episodes": 4, "without_dialog": ["ep2"],
        "left_out": [{"reason": "no published GPT-4 score (only the GPT-4 episodes have one)", "n": 1,
                      "episode_ids": ["ep3"]}]}
    assert ours["episodes"] == 2 and ours["scores"] == 2 * 2 * 7
    assert ours["episode_set"] == {
        "rule": bench.JUDGED_RULE, "episodes": 2, "rated_episodes": 4, "without_dialog": [],
        "left_out": [{"reason": NO_DIALOG, "n": 1, "episode_ids": ["ep2"]},
                     {"reason": bench.NOT_JUDGED, "n": 1, "episode_ids": ["ep3"]}]}
    for rec, shift_of in ((gpt4, GPT4_SHIFT), (ours, {"ep0": 0, "ep1": 1})):
        for i, d in enumerate(rec["dimensions"]):
            r, p = hand_r(shift_of, i)
            assert d["n"] == 2 * len(shift_of)
            assert (d["r"] is None) if r is None else d["r"] == pytest.approx(r, abs=1e-12)
    # only derived statistics: no rater id (hashed or not), no dialog text
    text = json.dumps(res)
    assert "PROLIFIC" not in text and "dishes" not in text and "Wren" not in text

    from synclib.judge.human import MEASURED_FILE

    measured = {"ratings": {"source": "a toy study"}, "date": "today", "judges": res}
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / MEASURED_FILE).write_text(json.dumps(measured))
    source = PAGE.read_text()
    assert source.count("load_measured()") == 1
    nb = tmp_path / PAGE.name
    nb.write_text(source.replace("load_measured()", f"load_measured({str(tmp_path / 'bench')!r})"))
    judge_claims(run_dir)
    sentence = run_page(nb, run_dir, tmp_path / "page.ipynb")
    assert (f"**GPT-4 (published scores)** on 3 of the 4 rated episodes (1 of them without a dialog: ep2). "
            f"Which and why: {bench.PUBLISHED_RULE}. Left out: 1, reason: no published GPT-4 score (only the "
            "GPT-4 episodes have one): ep3. Over these 3 episodes, 42 agent × dimension scores: r from") in sentence
    assert (f"**fake-judge** on 2 of the 4 rated episodes. Which and why: {bench.JUDGED_RULE}. Left out: 1, "
            f"reason: {NO_DIALOG}: ep2; 1, reason: {bench.NOT_JUDGED}: ep3. Over these 2 episodes, 28 agent × "
            "dimension scores: r from") in sentence
    # the table's columns, one per judge with its number of episodes
    assert "GPT-4 (published scores) r (3 episodes)" in sentence and "fake-judge r (2 episodes)" in sentence
    assert "Measured on a toy study (today" in sentence


@pytest.mark.slow
def test_measured_judges_page_agrees_with_the_benchmark_json(run_dir, tmp_path):
    """The page quotes bench/results/judge_human_sotopia_pi.json: every judge's r per
    dimension and its within-1-SD share, and draws figure 10 from its differences."""
    from synclib.judge import load_measured

    measured = load_measured()
    assert measured is not None, "bench/results/judge_human_sotopia_pi.json is missing"
    judge_claims(run_dir)
    text = run_page(PAGE, run_dir, tmp_path / "page.ipynb")
    assert f"GPT-4 (published scores) r ({measured['judges'][0]['episodes']} episodes)" in text
    for judge in measured["judges"]:
        es = judge["episode_set"]  # which episodes, by which rule, and the left-out ones with reasons
        assert es["episodes"] == judge["episodes"] and es["rule"] in text
        assert f"{es['episodes']} of the {es['rated_episodes']} rated episodes" in text
        assert es["episodes"] + sum(x["n"] for x in es["left_out"]) == es["rated_episodes"]
        for x in es["left_out"]:
            assert f"{x['n']}, reason: {x['reason']}" in text
        assert f" r ({judge['episodes']} episodes)" in text
        assert f"{100 * judge['within_one_sd']:.1f} %" in text
        for d in judge["dimensions"]:  # a dimension without r (constant scores) is a dash
            assert (f"{d['r']:.2f}" if d["r"] is not None else "–") in text
    assert "minus Sotopia-π" in text and "application/vnd.vegalite" in text
