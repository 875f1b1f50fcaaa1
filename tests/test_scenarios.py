"""Tests for synclib.tasks.scenarios (loading, validation) and synclib.tasks.prompts (the three prompt
views, masking, the reference parity of the prompt text and of the dialog rules, the leak
guard).

The Sotopia checks read the paper's 450 tasks from conftest's ``sotopia_dir`` (the folder
``$SYNCLIB_TEST_SOTOPIA`` names, else the cache ``synclib fetch sotopia`` fills) and are
skipped, with the reason, where neither has them; our ``.ci/run`` opts in. The
parity checks compare with ``tests/data/reference_prompt_digests.json``, written by
``tools/reference_prompt_digests.py`` from the reference code's own functions.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import shutil
import warnings
from pathlib import Path

import pytest

from synclib.judge import JudgeItem
from synclib.judge.prompt import judge_prompt
from synclib.tasks import prompts as pr
from synclib.tasks import scenarios as sc
from synclib.tasks.prompts import render_prompt
from synclib.tasks.scenarios import ScenarioError, load_tasks

REPO_ROOT = Path(__file__).resolve().parent.parent
DIGESTS = REPO_ROOT / "tests" / "data" / "reference_prompt_digests.json"
# The reference's two prompt wrappers (LM_hf.py get_inst), used when synclib.models has no
# PROMPT_FORMATS table.
REFERENCE_WRAPPERS = {
    "reference_inst": "[INST]{prompt}[/INST]",
    "reference_llama3": ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\nYou are a "
                         "helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n"
                         "{prompt}<|eot_id|>\n<|start_header_id|>assistant<|end_header_id|>"),
}

# The relationship table of protocol.md, written out independently of the module:
# which parts of the *other* agent's bio an agent sees.
VISIBLE_PARTS = {
    0: (),
    1: ("name",),
    2: ("name", "public"),
    3: ("name", "public", "values"),
    4: ("name", "public", "values"),
    5: ("name", "public", "values"),
}
GENDER = {"Man": "male", "Woman": "female", "Nonbinary": "nonbinary"}
LEFTOVER_TAG = re.compile(
    r"</?\s*(?:extra_info|strategy_hint|clarification_hint|root|p)\b[^>]*>|viewer\s*=")
TOM_PREFIX = "Joy. Assertive. "


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def sotopia(sotopia_dir):
    return load_tasks(sotopia_dir)


@pytest.fixture(scope="module")
def embedded():
    return load_tasks("embedded")


# ------------------------------------------------------------- the big check

def bio_parts(p: sc.Persona) -> dict[str, str]:
    """The four bio parts of protocol.md, composed here from the raw fields."""
    return {
        "name": f"{p.first_name} {p.last_name}",
        "public": f"is a {p.age}-year-old {GENDER[p.gender]} {p.occupation.lower()}. "
                  f"{p.gender_pronoun} pronouns. {p.public_info}",
        "values": f"Personality and values description: {p.personality_and_values}",
        "secret": f"{p.first_name}'s secrets: {p.secret}",
    }


def tag_contents(text: str) -> list[str]:
    """Contents of the inline tags of a goal, innermost tags removed, non-empty."""
    out = []
    for m in re.finditer(r"<(extra_info|strategy_hint|clarification_hint)>(.*?)</\1>", text, re.S):
        inner = re.sub(r"<[^>]+>", "", m.group(2)).strip()
        if len(inner) > 3:
            out.append(inner)
    return out


def agent_view(text: str, me: int | None) -> str:
    """What agent ``me`` (None: the judge, who sees all content) should see of a raw text
    (re-implemented here): ``<p viewer>`` content meant for someone else goes, other tags
    go with their content kept, line-opening spaces go, the result is stripped."""
    text = re.sub(r"<p\s+viewer=['\"]([^'\"]*)['\"]\s*>(.*?)</p>",
                  lambda m: m.group(2) if me is None or m.group(1) == f"agent_{me}" else "", text, flags=re.S)
    text = re.sub(r"</?(extra_info|strategy_hint|clarification_hint|root|p)>", "", text)
    return re.sub(r"\n +", "\n", text).strip()


def squash(text: str) -> str:
    """``text`` without any whitespace: the reference keeps whitespace artefacts (a trailing
    space after a hidden bio part, a goal running into the next line), so content checks
    ignore whitespace."""
    return re.sub(r"\s+", "", text)


def history_for(t: int) -> list[str]:
    """A synthetic ToM-style dialog of t utterances."""
    return [f"{TOM_PREFIX}Utterance number {i} here." for i in range(t)]


def check_task(task: sc.Task, tasks: sc.TaskSet) -> int:
    """Render every view for both agents and check content and masking; returns the number
    of prompts checked."""
    env, names = task.env, task.names
    n = 0
    for me in (0, 1):
        other = 1 - me
        own, theirs = task.agents[me], task.agents[other]
        own_bio = " ".join(bio_parts(own).values())
        visible = VISIBLE_PARTS[env.relationship]
        expected_other_bio = " ".join(v for k, v in bio_parts(theirs).items() if k in visible)
        own_goal = agent_view(env.agent_goals[me], me)
        scenario = agent_view(env.scenario, me)
        # text the agent may legitimately see; a masked string found in it is no leak
        allowed = "\n".join([scenario, own_bio, own_goal, expected_other_bio, *names])
        secret_strings = [bio_parts(theirs)[k] for k in ("name", "public", "values", "secret")
                          if k not in visible]
        secret_strings += [theirs.secret, theirs.personality_and_values]
        if "public" not in visible:
            secret_strings.append(theirs.public_info)
        other_goal_full = agent_view(env.agent_goals[other], None)
        secret_strings += [other_goal_full, *tag_contents(env.agent_goals[other])]
        # content of <p viewer="..."> not meant for this agent
        for m in re.finditer(r"<p\s+viewer=['\"]([^'\"]+)['\"]\s*>(.*?)</p>",
                             env.scenario + "\n" + env.agent_goals[me], re.S):
            if m.group(1) != f"agent_{me}":
                secret_strings.append(m.group(2).strip())
        persona = pr.passive_persona(tasks, task.index, 0)

        for extra in (0, 2):
            t = me + extra
            history = history_for(t)
            active = render_prompt(task, me, history, "active")
            for view in pr.VIEWS:
                prompt = render_prompt(task, me, history, view, persona=persona)
                n += 1
                lines = prompt.split("\n")
                where = f"task {task.index} agent {me} view {view} t={t}"
                assert not LEFTOVER_TAG.search(prompt), where
                flat = squash(prompt)
                bios = [own_bio, expected_other_bio] if me == 0 else [expected_other_bio, own_bio]
                assert squash(f"{names[0]}'s background: {bios[0]}{names[1]}'s background: "
                              f"{bios[1]}{names[0]}'s goal:") in flat, where
                assert squash(f"{names[me]}'s goal: {own_goal}") in flat, where
                assert f"{names[other]}'s goal: Unknown" in lines, where
                assert squash(f"Scenario: {scenario}Participants:") in flat, where
                for s in secret_strings:
                    if s and s not in allowed:
                        assert s not in prompt, f"{where}: leaked {s[:60]!r}"
                if view == "passive":
                    assert lines[0] == pr.PASSIVE_FIRST_LINE.format(name=persona.name), where
                    assert "LEAVE" not in prompt and "Keep your words concise" not in prompt, where
                    assert lines[1] == "Here is the context of this interaction:", where
                    assert all(line == line.strip() for line in lines), where
                    if t:  # the open line is dropped
                        assert lines[-1].endswith(f"Turn {t - 1}: {names[other]} said:{history[t - 1]}"), where
                    else:
                        assert lines[-1] == f"{names[1]}'s goal: Unknown", where
                    # the same content as the agent it replaces, without the instructions
                    # and the open line
                    expected = active[active.index("\nHere is the context of this") + 1:].replace(
                        pr.LEAVE_INSTRUCTION, "")
                    expected = expected[:expected.rindex("\n")]
                    assert flat == squash(lines[0] + expected), where
                else:
                    assert lines[-1] == f"Turn {t}: {names[me]} said:", where
                    assert lines[0].startswith(f"Imagine you are {names[me]}, your task is"), where
                    assert lines[3] == "Here is the context of this interaction:", where
                    assert pr.LEAVE_INSTRUCTION + "\n" in prompt, where
                assert (pr.TOM_INSTRUCTION in prompt) == (view == "tom"), where
                if view == "tom":
                    assert prompt.startswith(pr.agent_intro(task, me) + pr.TOM_INSTRUCTION + "\nTurn 0: "), where
                for i in range(t):
                    shown = history[i]
                    if view == "tom" and i % 2 != me:
                        shown = shown[len(TOM_PREFIX):]
                    assert f"Turn {i}: {names[i % 2]} said:{shown}" in prompt, (where, i)
    return n


def test_all_sotopia_tasks_render_and_mask(sotopia):
    assert len(sotopia) == 450
    n = sum(check_task(task, sotopia) for task in sotopia)
    assert n == 450 * 2 * 2 * 3


def test_embedded_tasks_render_and_mask(embedded):
    n = sum(check_task(task, embedded) for task in embedded)
    assert n == len(embedded) * 12


def test_judge_intros_are_unmasked(sotopia):
    for task in sotopia:
        intro, complete = pr.judge_intro(task), pr.complete_intro(task)
        assert complete.startswith("Here is the context of this interaction:\nScenario: ")
        for me in (0, 1):
            p = task.agents[me]
            assert f"{task.names[me]}'s background: {' '.join(bio_parts(p).values()).strip()}\n" in intro
            assert squash(f"{task.names[me]}'s background: {' '.join(bio_parts(p).values())}") in squash(complete)
            goal = agent_view(task.env.agent_goals[me], None)
            assert f"{task.names[me]}'s goal: {goal}" in intro
            assert squash(f"{task.names[me]}'s goal: {goal}") in squash(complete)
            assert "Unknown" not in intro.split("\n")[3 + me]
        assert not LEFTOVER_TAG.search(intro) and not LEFTOVER_TAG.search(complete)
        if "<p viewer" in task.env.scenario:  # environment-only content reaches the judge
            hidden = re.search(r"<p viewer=[^>]*>(.*?)</p>", task.env.scenario).group(1)
            assert hidden in intro and hidden in complete
            assert hidden not in render_prompt(task, 0)


# ------------------------------------------------------- reference parity (digests)

def _sha16(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _rec(text: str) -> str:
    return f"{_sha16(text)}:{len(text)}"


@pytest.fixture(scope="module")
def digests():
    if not DIGESTS.is_file():
        pytest.fail(f"{DIGESTS} is missing; regenerate it with tools/reference_prompt_digests.py")
    return json.loads(DIGESTS.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def sotopia_for_digests(sotopia, digests):
    """The Sotopia set, checked to be the one the digests were made from."""
    for name, sha in digests["task_files"].items():
        got = hashlib.sha256((sotopia.root / name).read_bytes()).hexdigest()
        assert got == sha, (f"{sotopia.root / name} is not the file the reference digests were "
                            f"made from (sha256 {got}, expected {sha})")
    return sotopia


def wrappers() -> dict[str, str]:
    """The two reference prompt formats (``{prompt}`` marks the prompt); synclib.models'
    table when it has them."""
    try:
        from synclib.models import PROMPT_FORMATS
        return {k: PROMPT_FORMATS[k]["template"] for k in REFERENCE_WRAPPERS}
    except (ImportError, KeyError, TypeError):
        return dict(REFERENCE_WRAPPERS)


def _ref_lines(digests, view: str, task_index: int, agent: int) -> list[tuple[str, int]]:
    width = digests["line_index_width"]
    packed = digests["tasks"]["lines"][view][task_index].split(" ")[agent]
    out = []
    for k in range(0, len(packed), width):
        digest, length = digests["lines"][int(packed[k:k + width], 16)].split(":")
        out.append((digest, int(length)))
    return out


def locate(ours: str, ref_lines: list[tuple[str, int]], skip_first: bool, open_last: bool) -> str:
    """Where ``ours`` first departs from the reference's lines (those of the agent's
    longest prompt, of which every earlier prompt's lines are a prefix, bar the open
    line)."""
    lines = ours.split("\n")
    upto = min(len(lines) - (1 if open_last else 0), len(ref_lines))
    pos = 0
    for k in range(upto):
        if k or not skip_first:
            digest, length = ref_lines[k]
            if (_sha16(lines[k]), len(lines[k])) != (digest, length):
                return (f"first differing line: {k + 1} (characters {pos}-{pos + len(lines[k])}; "
                        f"reference line length {length}, ours {len(lines[k])}; ours reads "
                        f"{lines[k][:80]!r})")
        pos += len(lines[k]) + 1
    return (f"lines 1-{upto} agree; the difference is in line {upto + 1} or later "
            f"(ours has {len(lines)} lines)")


def test_prompts_match_reference_digests(sotopia_for_digests, digests):
    """Every Sotopia task, both agents, turns 0-3 (the synthetic history), active and
    passive (persona seeds 0-2), raw and in both reference formats: synclib's text is the
    reference's, character for character (tools/reference_prompt_digests.py)."""
    tasks, cols = sotopia_for_digests, digests["tasks"]
    assert len(tasks) == digests["n_tasks"] == len(cols["active"])
    history, seeds = digests["history"], digests["passive_seeds"]
    formats = wrappers()
    for fmt, template in formats.items():
        assert hashlib.sha256(template.encode()).hexdigest() == digests["formats"][fmt]["template_sha256"], \
            f"prompt format {fmt}: the template is not the reference's get_inst wrapper"
    instructions = tasks.root / "judge_instructions.txt"
    assert hashlib.sha256(instructions.read_bytes()).hexdigest() == digests["judge_instructions"]
    instructions = instructions.read_text(encoding="utf-8")
    failures = []
    for i, task in enumerate(tasks):
        ordered = []
        refs = {"active": cols["active"][i].split(" ")}
        ours = {"active": [render_prompt(task, t % 2, history[:t]) for t in range(len(history))]}
        for seed in seeds:
            persona = pr.passive_persona(tasks, i, seed)
            refs[seed] = cols["passive"][str(seed)][i].split(" ")
            ours[seed] = [render_prompt(task, t % 2, history[:t], "passive", persona=persona)
                          for t in range(len(history))]
        for key in ["active", *seeds]:
            view = "active" if key == "active" else "passive"
            for t, (mine, ref) in enumerate(zip(ours[key], refs[key], strict=True)):
                ordered.append(mine)
                if _rec(mine) != ref:
                    where = locate(mine, _ref_lines(digests, view, i, t % 2),
                                   skip_first=view == "passive" and key != seeds[0],
                                   open_last=view == "active")
                    seed_txt = "" if view == "active" else f" persona seed {key}"
                    failures.append(f"task {i} agent {t % 2 + 1} {view}{seed_txt} turn {t}: "
                                    f"reference {ref}, ours {_rec(mine)}; {where}")
        raw_ok = not failures or not failures[-1].startswith(f"task {i} ")
        for fmt, template in formats.items():
            got = _sha16("\0".join(template.replace("{prompt}", s) for s in ordered))
            if got != cols["wrapped"][fmt][i] and raw_ok:
                failures.append(f"task {i} format {fmt}: the raw strings agree, the wrapped do not")
        if _rec(pr.complete_intro(task)) != cols["complete_intro"][i]:
            failures.append(f"task {i} complete intro: reference {cols['complete_intro'][i]}, "
                            f"ours {_rec(pr.complete_intro(task))}")
        judge = pr.complete_intro(task) + "\n".join(pr.dialog_lines(task, history)) + instructions
        # the judge package's own message for the paper preset (judge.layout: reference)
        item = JudgeItem(i, i, 0, pr.complete_intro(task), task.names, tuple(history), "reference")
        assert judge_prompt(item, instructions) == judge
        if _rec(judge) != cols["judge"][i]:
            failures.append(f"task {i} judge message: reference {cols['judge'][i]}, ours {_rec(judge)}")
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


def play_dialog(task: sc.Task, replies: list[str]) -> tuple[list[str], list[str]]:
    """Our dialog loop on raw replies: (active prompts by turn, stored utterances)."""
    prompts, utterances = [], []
    for t, raw in enumerate(replies):
        prompts.append(render_prompt(task, t % 2, utterances))
        utterances.append(pr.postprocess_reply(raw))
        if pr.is_leave(utterances[-1], task, t):
            break
    return prompts, utterances


def test_dialog_loop_matches_reference_on_crafted_replies(sotopia_for_digests, digests):
    """Raw replies with several ": ", several lines, edge whitespace, "\\r", an empty reply
    and a leave, through the reference's dialog loop, CSV round trip and passive transform
    on a task of every relationship, mutual friends and a scenario ending with a newline."""
    tasks, edge = sotopia_for_digests, digests["edge"]
    replies = edge["replies"]
    assert len(edge["tasks"]) >= 6
    for key, ref in edge["tasks"].items():
        i = int(key)
        task = tasks[i]
        prompts, utterances = play_dialog(task, replies)
        assert len(prompts) == len(ref["active"]) < len(replies), f"task {i}: stop turn"
        assert [_rec(line) for line in pr.dialog_lines(task, utterances)] == ref["dialog"], f"task {i}"
        assert [_rec(p) for p in prompts] == ref["active"], f"task {i} active"
        ordered = list(prompts)
        for k, seed in enumerate(digests["passive_seeds"]):
            persona = pr.passive_persona(tasks, i, seed)
            assert list(tasks.personas).index(persona.pk) == ref["persona"][k]
            passive = [render_prompt(task, t % 2, utterances[:t], "passive", persona=persona)
                       for t in range(len(prompts))]
            assert [_rec(p) for p in passive] == ref["passive"][k], f"task {i} passive seed {seed}"
            ordered += passive
        for fmt, template in wrappers().items():
            assert _sha16("\0".join(template.replace("{prompt}", s) for s in ordered)) == ref["wrapped"][fmt]
        assert _rec(pr.complete_intro(task)) == ref["complete_intro"]


def test_passive_persona_draw_matches_reference(sotopia_for_digests, digests):
    tasks = sotopia_for_digests
    ids = list(tasks.personas)
    for seed in digests["passive_seeds"]:
        drawn = digests["tasks"]["persona"][str(seed)]
        assert [ids.index(pr.passive_persona(tasks, i, seed).pk) for i in range(len(tasks))] == drawn
    # the rule, restated: the (i+1)-th random.sample(ids, 2) of random.Random(seed), first id
    for i, seed in [(0, 0), (36, 0), (127, 1), (449, 2), (3, 4)]:
        rng = random.Random(seed)
        for _ in range(i + 1):
            pair = rng.sample(ids, 2)
        assert pr.passive_persona(tasks, i, seed) == tasks.personas[pair[0]]
    # the same draw whatever order the calls come in
    assert pr.passive_persona(tasks, 5, 7) == pr.passive_persona(tasks, 5, 7)
    assert [pr.passive_persona(tasks, i, 9).pk for i in (3, 1, 2)] == \
        [p.pk for p in (pr.passive_persona(tasks, 3, 9), pr.passive_persona(tasks, 1, 9),
                        pr.passive_persona(tasks, 2, 9))]
    with pytest.raises(ValueError, match="task_index"):
        pr.passive_persona(tasks, -1, 0)


def test_reference_spot_values(sotopia):
    """Values read off the reference by hand (ref notes 3.4), independent of the digest file."""
    h = ["Hello there", "Hi", "Bye now"]
    p0 = pr.passive_persona(sotopia, 0, 0)
    assert _sha16(render_prompt(sotopia[0], 0, [])) == "9a7f53342e136f1f"
    assert len(render_prompt(sotopia[0], 0, [])) == 1526
    assert _sha16(render_prompt(sotopia[0], 1, h[:1])) == "d47631d750f373f2"
    assert _sha16(render_prompt(sotopia[0], 0, [], "passive", persona=p0)) == "4b00985affbfb264"
    assert _sha16(render_prompt(sotopia[127], 0, [])) == "c950973dc76ed162"
    assert _sha16(render_prompt(sotopia[449], 0, h[:2])) == "d481d317878419dd"
    assert _sha16(pr.complete_intro(sotopia[0]) + "\n".join(pr.dialog_lines(sotopia[0], h))
                  + (sotopia.root / "judge_instructions.txt").read_text(encoding="utf-8")) == "ded59af55f98de50"
    assert render_prompt(sotopia[0], 1, ["how are you?"]).endswith(
        "Keep your words concise.\nTurn 0: Leo Williams said:how are you?\nTurn 1: Hendrick Heinz said:")


# ------------------------------------------------------------------ leak guard

def test_leak_guard_passes_on_real_and_embedded_tasks(sotopia, embedded):
    with warnings.catch_warnings():
        warnings.simplefilter("error", pr.MaskingFallbackWarning)
        for tasks in (sotopia, embedded):
            assert pr.masking_notes(tasks) == []
            for task in tasks:
                for agent in (0, 1):
                    assert pr.reference_leaks(task, agent) == ()
                    pr.agent_intro(task, agent)


@pytest.mark.parametrize("field, value, hidden, leaky", [
    # an environment tag not preceded by a space: the reference's pattern misses it (both
    # agents would read it)
    ("scenario", 'Two people wait.<p viewer="environment">The bus was cancelled.</p>',
     "The bus was cancelled.", (0, 1)),
    # an agent tag in double quotes: the reference only removes single-quoted ones
    ("scenario", 'Two people wait. <p viewer="agent_1">Ben saw the timetable.</p>',
     "Ben saw the timetable.", (0,)),
    # a two-line goal without an <extra_info> block: only its first line is masked
    ("goal", "Keep your umbrella.\nHidden second line of the goal",
     "Hidden second line of the goal", (0,)),
])
def test_leak_guard_catches_a_crafted_leak(tmp_path, field, value, hidden, leaky):
    envs = json.loads(json.dumps(GOLDEN_ENVS))
    if field == "scenario":
        envs["ENV1"]["scenario"] = value
    else:
        envs["ENV1"]["agent_goals"][1] = value
    tasks = load_tasks(write_set(tmp_path / "leaky", envs=envs))
    task = tasks[0]
    for agent in leaky:
        assert hidden in pr._reference_intro(task, agent)  # what the reference would show
        assert hidden in pr.reference_leaks(task, agent)
        with pytest.warns(pr.MaskingFallbackWarning, match=f"task 0 .* agent {agent + 1}"):
            intro = pr.agent_intro(task, agent)
        assert hidden not in intro and intro.endswith(pr.LEAVE_INSTRUCTION + "\n")
        assert intro.startswith(f"Imagine you are {task.names[agent]}, your task")
        history = ["Hi.", "Hello.", "Bye."][:agent + 2]
        for view in pr.VIEWS:
            assert hidden not in render_prompt(task, agent, history[:agent], view, persona="Cy Vale")
            assert hidden not in render_prompt(task, agent, history, view, persona="Cy Vale")
    notes = pr.masking_notes(tasks)
    assert len(notes) == len(leaky)
    assert all("our masking" in note and f"agent {a + 1}" in note for note, a in zip(notes, leaky))
    if leaky == (0,):  # agent 2 may see it: its intro is the reference's
        assert pr.reference_leaks(task, 1) == ()
        assert render_prompt(task, 1, ["Hi."]).startswith(pr._reference_intro(task, 1))
    assert hidden in pr.complete_intro(task)  # the judge sees everything


# ------------------------------------------------------------------ masked parts located

def _filled(parts) -> str:
    """A prompt with every masked part put back: a cut's hidden text, a stand-in's original."""
    return "".join(p.text if p.kind == "shown" else p.hidden for p in parts)


def test_masked_prompt_is_the_prompt_and_marks_exactly_the_masked_parts(embedded):
    history = ["Joy. Assertive. Hello there.", " Trust. Directive. Fine, <b>you</b>?", "Anger. Commissive. ok"]
    seen = set()
    for task in embedded:
        other_bio = {0: "", 1: ""}
        for agent in (0, 1):
            other = task.agents[1 - agent]
            reader = pr.passive_persona(embedded, task.index, 0)
            for h in (history[:agent], history[:agent + 2]):
                for view in pr.VIEWS:
                    parts = pr.masked_prompt(task, agent, h, view, reader if view == "passive" else None)
                    plain = render_prompt(task, agent, h, view, reader if view == "passive" else None)
                    assert "".join(p.text for p in parts) == plain
                    masked = [p for p in parts if p.kind != "shown"]
                    assert all(p.kind in pr.PART_KINDS for p in parts)
                    # the other agent's goal: replaced by Unknown, a following <extra_info> block cut
                    goal = pr.render_text(task.env.agent_goals[1 - agent])
                    goals = [p for p in masked if p.what == "goal"]
                    assert [(p.kind, p.text) for p in goals] == [("replaced", "Unknown")] + [("removed", "")] * (
                        len(goals) - 1) and len(goals) <= 2
                    assert "\n".join(p.hidden for p in goals) == goal and goal not in plain
                    # the other agent's bio: the part its relationship hides, the secret included
                    bios = [p for p in masked if p.what == "bio"]
                    assert len(bios) == 1 and bios[0].kind == "removed" and bios[0].text == ""
                    assert bios[0].hidden.endswith(f"{other.first_name}'s secrets: {other.secret}")
                    assert other.secret not in plain
                    assert {p.what for p in masked} <= {"goal", "bio", "other", "environment"}
                    assert all(p.hidden not in plain and p.kind == "removed" for p in masked
                               if p.what in ("other", "environment"))
                    # put back, the context block is the judge's, unmasked: nothing else was cut (up to
                    # whitespace: the passive view strips its lines, an <extra_info> block had its own)
                    assert squash(pr.complete_intro(task)) in squash(_filled(parts))
                    other_bio[agent] = bios[0].hidden
                    seen.add(task.relationship)
        if task.relationship == 0:  # a stranger's whole bio
            assert other_bio[0] == pr.render_text(pr.bio(task.agents[1]))
        elif task.relationship >= 3:  # only the secret
            assert other_bio[0] == f"{task.agents[1].first_name}'s secrets: {task.agents[1].secret}"
    assert seen == {0, 1, 2, 3, 4, 5}


def test_masked_prompt_on_sotopia_marks_environment_text_and_extra_info(sotopia):
    whats = set()
    for task in list(sotopia)[:120]:
        for agent in (0, 1):
            for view in pr.VIEWS:
                parts = pr.masked_prompt(task, agent, ["Hi.", "Hello."][:agent], view, "Cy Vale")
                plain = render_prompt(task, agent, ["Hi.", "Hello."][:agent], view, "Cy Vale")
                assert "".join(p.text for p in parts) == plain
                hidden = " ".join(p.hidden for p in parts if p.kind != "shown")
                other = task.agents[1 - agent]
                assert other.secret in hidden and other.secret not in plain
                whats |= {p.what for p in parts if p.kind != "shown"}
    assert whats == {"bio", "goal", "environment"}


def test_masked_prompt_under_our_fallback_masking(tmp_path):
    envs = json.loads(json.dumps(GOLDEN_ENVS))
    envs["ENV1"]["agent_goals"][1] = "Keep your umbrella.\nHidden second line of the goal"
    task = load_tasks(write_set(tmp_path / "leaky", envs=envs))[0]
    assert pr.reference_leaks(task, 0)  # agent 1's prompts use our masking
    with warnings.catch_warnings():  # warned once per task (cached): maybe by an earlier test
        warnings.simplefilter("ignore", pr.MaskingFallbackWarning)
        plain = render_prompt(task, 0, [], "active")
    for view in pr.VIEWS:
        parts = pr.masked_prompt(task, 0, [], view, "Cy Vale")
        assert "".join(p.text for p in parts) == render_prompt(task, 0, [], view, "Cy Vale")
        goal = [p for p in parts if p.what == "goal"]
        assert [(p.kind, p.text) for p in goal] == [("replaced", "Unknown")]
        assert "Hidden second line of the goal" in goal[0].hidden
        assert "Hidden second line" not in "".join(p.text for p in parts)
    assert "".join(p.text for p in pr.masked_prompt(task, 0, [], "active")) == plain


# ------------------------------------------------------------ embedded set

def test_embedded_coverage(embedded):
    assert len(embedded) >= 40
    assert len(embedded.scenarios) >= 16
    assert {s.source for s in embedded.scenarios.values()} == set(sc.SOURCES)
    assert len(embedded.personas) >= 12
    assert {s.relationship for s in embedded.scenarios.values()} == set(range(6))
    assert {t.relationship for t in embedded} == set(range(6))
    used_envs = {t.env.pk for t in embedded}
    used_agents = {a.pk for t in embedded for a in t.agents}
    assert used_envs == set(embedded.scenarios)
    assert used_agents == set(embedded.personas)
    for p in embedded.personas.values():
        for field in dataclasses.fields(p):
            if field.name != "model_id":
                assert getattr(p, field.name), (p.pk, field.name)
    for pk in [*embedded.scenarios, *embedded.personas, *(t.pk for t in embedded)]:
        assert pk.startswith("01SYN") and len(pk) == 26
    assert (sc.embedded_dir() / "README.md").is_file()
    assert load_tasks(sc.embedded_dir())[0] == embedded[0]


def test_embedded_set_is_not_a_copy_of_sotopia(embedded, sotopia):
    ours = {s.scenario for s in embedded.scenarios.values()}
    ours |= {g for s in embedded.scenarios.values() for g in s.agent_goals}
    ours |= {getattr(p, f) for p in embedded.personas.values()
             for f in ("public_info", "personality_and_values", "secret")}
    theirs = {s.scenario for s in sotopia.scenarios.values()}
    theirs |= {g for s in sotopia.scenarios.values() for g in s.agent_goals}
    theirs |= {getattr(p, f) for p in sotopia.personas.values()
               for f in ("public_info", "personality_and_values", "secret")}
    assert not ours & theirs
    assert not set(embedded.personas) & set(sotopia.personas)
    assert not {p.name for p in embedded.personas.values()} & {p.name for p in sotopia.personas.values()}


def test_objects_are_immutable(embedded):
    task = embedded[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.index = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.agents[0].secret = "x"
    with pytest.raises(TypeError):
        embedded.scenarios["x"] = task.env
    assert isinstance(task.env.agent_goals, tuple)
    assert [t.index for t in embedded] == list(range(len(embedded)))


# ------------------------------------------------------------ golden prompts

GOLDEN_ENVS = {
    "ENV1": {
        "pk": "ENV1", "codename": "umbrella", "source": "hand-craft",
        "scenario": "Two acquaintances wait for the same bus. <p viewer='agent_1'>The bus is late."
                    "</p> <p viewer=\"environment\">Nobody knows why.</p>",
        "agent_goals": [
            "Borrow an umbrella (<extra_info>Extra information: it is raining.</extra_info>)",
            "Keep your umbrella (<extra_info>Extra information: it is new. <strategy_hint>Hint: "
            "be polite.</strategy_hint></extra_info>)",
        ],
        "relationship": 2, "age_constraint": "[(18, 70), (18, 70)]",
        "occupation_constraint": "nan", "agent_constraint": None,
    }
}
GOLDEN_AGENTS = {
    "A1": {"pk": "A1", "first_name": "Ada", "last_name": "Moss", "age": 30, "occupation": "Pilot",
           "gender": "Woman", "gender_pronoun": "She/her", "public_info": "Ada flies cargo planes.",
           "big_five": "Openness to Experience - High", "moral_values": ["Care/Harm"],
           "schwartz_personal_values": ["Stimulation"], "personality_and_values": "Ada Moss is bold.",
           "decision_making_style": "Decisive", "secret": "Is afraid of heights", "model_id": "",
           "mbti": "ESTP"},
    "A2": {"pk": "A2", "first_name": "Ben", "last_name": "Roe", "age": 45, "occupation": "Florist",
           "gender": "Man", "gender_pronoun": "He/him", "public_info": "Ben grows tulips.",
           "big_five": "Openness to Experience - Low", "moral_values": ["Authority/Subversion"],
           "schwartz_personal_values": ["Tradition"], "personality_and_values": "Ben Roe is shy.",
           "decision_making_style": "Cautious", "secret": "Has never seen the sea", "model_id": "",
           "mbti": "ISFJ"},
}
GOLDEN_COMBOS = [{"pk": "T1", "env_id": "ENV1", "agent_ids": ["A1", "A2"]}]


def write_set(root: Path, envs=GOLDEN_ENVS, agents=GOLDEN_AGENTS, combos=GOLDEN_COMBOS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, obj in (("envs.json", envs), ("agents.json", agents),
                      ("env_agent_combos.json", combos)):
        (root / name).write_text(json.dumps(obj, indent=1), encoding="utf-8")
    return root


@pytest.fixture
def golden(tmp_path):
    return load_tasks(write_set(tmp_path / "golden"))[0]


def test_golden_active_prompt(golden):
    expected = (
        "Imagine you are Ben Roe, your task is to act/speak as Ben Roe would, keeping in mind Ben Roe's social goal.\n"
        "You can find Ben Roe's goal (or background) in the 'Here is the context of the interaction' field.\n"
        "Note that Ben Roe's goal is only visible to you.\n"
        "Here is the context of this interaction:\n"
        "Scenario: Two acquaintances wait for the same bus. The bus is late.\n"
        "Participants: Ada Moss and Ben Roe\n"
        "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. Ada flies cargo planes. \n"
        "Ben Roe's background: Ben Roe is a 45-year-old male florist. He/him pronouns. Ben grows tulips. "
        "Personality and values description: Ben Roe is shy. Ben's secrets: Has never seen the sea\n"
        "Ada Moss's goal: Unknown\n"
        "Ben Roe's goal: Keep your umbrella (Extra information: it is new. Hint: be polite.)"
        "If your goal as the agent has been achieved, you should leave the conversation by saying \"LEAVE\". "
        "If your goal has not been achieved, you should say something to interact with the other. "
        "Keep your words concise.\n"
        "Turn 0: Ada Moss said:Hi Ben.\n"
        "Turn 1: Ben Roe said:"
    )
    assert render_prompt(golden, 1, ["Hi Ben."], "active") == expected
    assert pr.agent_intro(golden, 1) + "Turn 0: Ada Moss said:Hi Ben.\nTurn 1: Ben Roe said:" == expected


def test_golden_active_prompt_agent_1(golden):
    expected = (
        "Imagine you are Ada Moss, your task is to act/speak as Ada Moss would, keeping in mind Ada Moss's social goal.\n"
        "You can find Ada Moss's goal (or background) in the 'Here is the context of the interaction' field.\n"
        "Note that Ada Moss's goal is only visible to you.\n"
        "Here is the context of this interaction:\n"
        "Scenario: Two acquaintances wait for the same bus. \n"
        "Participants: Ada Moss and Ben Roe\n"
        "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. Ada flies cargo planes. "
        "Personality and values description: Ada Moss is bold. Ada's secrets: Is afraid of heights\n"
        "Ben Roe's background: Ben Roe is a 45-year-old male florist. He/him pronouns. Ben grows tulips. \n"
        "Ada Moss's goal: Borrow an umbrella (Extra information: it is raining.)\n"
        "Ben Roe's goal: Unknown\n"
        "If your goal as the agent has been achieved, you should leave the conversation by saying \"LEAVE\". "
        "If your goal has not been achieved, you should say something to interact with the other. "
        "Keep your words concise.\n"
        "Turn 0: Ada Moss said:"
    )
    assert render_prompt(golden, 0) == expected


def test_golden_passive_prompt(golden):
    expected = (
        "Imagine you are Cy Vale. You are reading an interaction between other two people.\n"
        "Here is the context of this interaction:\n"
        "Scenario: Two acquaintances wait for the same bus.\n"
        "Participants: Ada Moss and Ben Roe\n"
        "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. Ada flies cargo planes. "
        "Personality and values description: Ada Moss is bold. Ada's secrets: Is afraid of heights\n"
        "Ben Roe's background: Ben Roe is a 45-year-old male florist. He/him pronouns. Ben grows tulips.\n"
        "Ada Moss's goal: Borrow an umbrella (Extra information: it is raining.)\n"
        "Ben Roe's goal: Unknown\n"
        "Turn 0: Ada Moss said:Hi Ben.\n"
        "Turn 1: Ben Roe said:Hello Ada."
    )
    # lines are stripped (the trailing spaces of the scenario, of Ben's cut bio and of the
    # last utterance go), the open "Turn 2" line is dropped
    assert render_prompt(golden, 0, ["Hi Ben.", "Hello Ada.  "], "passive", persona="Cy Vale") == expected
    # agent 2's goal runs into the first dialog line once the instruction is gone
    passive_b = render_prompt(golden, 1, [" Hi Ben."], "passive", persona=golden.agents[0])
    assert passive_b.split("\n")[0] == pr.PASSIVE_FIRST_LINE.format(name="Ada Moss")
    assert passive_b.endswith("Hint: be polite.)Turn 0: Ada Moss said: Hi Ben.")
    # without a persona the reader is named after the replaced agent (not the reference)
    assert render_prompt(golden, 1, ["Hi."], "passive").startswith("Imagine you are Ben Roe. You are")
    # the passive view is the transform of the active string
    active = render_prompt(golden, 0, ["Hi Ben.", "Hello Ada."])
    assert pr.passive_from_active(active, "Cy Vale") == expected
    assert pr.passive_from_active("no intro here\r\nx", "Cy Vale") == "no intro here\nx"


def test_passive_view_applies_the_csv_round_trip(golden):
    """The reference reads the prompts back from a CSV file without newline='', so a "\\r"
    in an utterance becomes a line break before the transform."""
    active = render_prompt(golden, 0, ["a\r", "mid\rdle"])
    assert "said:a\r\nTurn 1" in active and "mid\rdle" in active  # the active view keeps it
    passive = render_prompt(golden, 0, ["a\r", "mid\rdle"], "passive", persona="Cy Vale")
    assert passive.endswith("Turn 0: Ada Moss said:a\nTurn 1: Ben Roe said:mid\ndle")
    assert "\r" not in passive


def test_golden_tom_prompt(golden):
    tom = ("Please be sure to indicate your emotion and action type both in a word at the beginning "
           "of your turn, in the format of: Emotion. Action type. Response. Emotion should be one of "
           "the following words: Joy. Trust. Fear. Surprise. Sadness. Disgust. Anger. Anticipation.; "
           "Action type should be one of the following words: Assertive. Directive. Commissive. "
           "Expressive. Declaration. Your output format should be: Emotion. Action type. Response.")
    prompt = render_prompt(golden, 0, ["Joy. Directive. Hi Ben.", "Fear. Assertive. Hello Ada."], "tom")
    active = render_prompt(golden, 0, ["Joy. Directive. Hi Ben.", "Hello Ada."], "active")
    head, tail = active.rsplit("Keep your words concise.\n", 1)
    assert prompt == head + "Keep your words concise.\n" + tom + "\n" + tail
    assert prompt == pr.agent_intro(golden, 0) + tom + "\n" + tail
    assert tail == ("Turn 0: Ada Moss said:Joy. Directive. Hi Ben.\n"
                    "Turn 1: Ben Roe said:Hello Ada.\n"
                    "Turn 2: Ada Moss said:")
    assert pr.TOM_INSTRUCTION == tom
    assert pr.EMOTIONS == ("Joy", "Trust", "Fear", "Surprise", "Sadness", "Disgust", "Anger",
                           "Anticipation")
    assert pr.ACTIONS == ("Assertive", "Directive", "Commissive", "Expressive", "Declaration")


def test_golden_judge_intros(golden):
    assert pr.judge_intro(golden) == (
        "Here is the context of this interaction:\n"
        "Scenario: Two acquaintances wait for the same bus. The bus is late. Nobody knows why.\n"
        "Participants: Ada Moss and Ben Roe\n"
        "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. Ada flies cargo planes. "
        "Personality and values description: Ada Moss is bold. Ada's secrets: Is afraid of heights\n"
        "Ben Roe's background: Ben Roe is a 45-year-old male florist. He/him pronouns. Ben grows tulips. "
        "Personality and values description: Ben Roe is shy. Ben's secrets: Has never seen the sea\n"
        "Ada Moss's goal: Borrow an umbrella (Extra information: it is raining.)\n"
        "Ben Roe's goal: Keep your umbrella (Extra information: it is new. Hint: be polite.)"
    )
    # the reference's complete intro is the same text here (no whitespace artefacts)
    assert pr.complete_intro(golden) == pr.judge_intro(golden)
    assert pr.dialog_lines(golden, ["Hi Ben.", " Hello: "]) == [
        "Turn 0: Ada Moss said:Hi Ben.", "Turn 1: Ben Roe said: Hello: "]
    assert pr.dialog_line(golden, 4) == "Turn 4: Ada Moss said:"
    with pytest.raises(TypeError):
        pr.dialog_lines(golden, "Hi")


def test_tagged_bio(golden):
    ada = golden.agents[0]
    full = pr.bio(ada)
    rest = full[len("Ada Moss "):]
    assert pr.tagged_bio(ada, 0, 0) == f"<root><p viewer='agent_0'>{full}</p></root>"
    assert pr.tagged_bio(ada, 1, 1) == f"Ada Moss <p viewer='agent_1'>{rest}</p>"
    assert pr.tagged_bio(ada, 2, 0) == (
        "Ada Moss is a 30-year-old female pilot. She/her pronouns. Ada flies cargo planes. "
        "<p viewer='agent_0'>Personality and values description: Ada Moss is bold. "
        "Ada's secrets: Is afraid of heights</p>")
    for rel in (3, 4, 5):
        assert pr.tagged_bio(ada, rel, 0) == full.replace("Ada's secrets", "<p viewer='agent_0'>Ada's secrets") + "</p>"
    with pytest.raises(ValueError, match="relationship"):
        pr.tagged_bio(ada, 6, 0)
    assert pr.format_docstring("  a\n   b \n c  ") == "a\nb \nc"


@pytest.mark.parametrize("relationship, line", [
    (0, "Ada Moss's background: "),
    (1, "Ada Moss's background: Ada Moss "),
    (2, "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. "
        "Ada flies cargo planes. "),
    (3, "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. "
        "Ada flies cargo planes. Personality and values description: Ada Moss is bold. "),
    (4, "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. "
        "Ada flies cargo planes. Personality and values description: Ada Moss is bold. "),
    (5, "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. "
        "Ada flies cargo planes. Personality and values description: Ada Moss is bold. "),
])
def test_other_bio_by_relationship(tmp_path, relationship, line):
    """The other agent's bio as the reference shows it: cut by relationship, with the space
    that preceded the hidden part kept."""
    envs = json.loads(json.dumps(GOLDEN_ENVS))
    envs["ENV1"]["relationship"] = relationship
    task = load_tasks(write_set(tmp_path / "r", envs=envs))[0]
    lines = render_prompt(task, 1, ["Hi."]).split("\n")
    assert lines[6] == line
    assert lines[7].endswith("Ben's secrets: Has never seen the sea")  # own bio whole
    assert task.env.relationship_name == sc.RELATIONSHIPS[relationship]
    # our own masking (the leak guard's fallback) normalises it
    own = pr._own_masking_intro(task, 1).split("\n")[6]
    assert own == (line.rstrip() if relationship else "Ada Moss's background: Unknown")


def test_bio_levels(golden):
    ada = golden.agents[0]
    assert pr.bio(ada, "none") == ""
    assert pr.bio(ada, "name") == "Ada Moss"
    assert pr.bio(ada) == (
        "Ada Moss is a 30-year-old female pilot. She/her pronouns. Ada flies cargo planes. "
        "Personality and values description: Ada Moss is bold. Ada's secrets: Is afraid of heights")
    assert pr.bio(ada, "no_secret") == pr.bio(ada).split(" Ada's secrets")[0]
    with pytest.raises(ValueError, match="visibility"):
        pr.bio(ada, "most")


def test_render_text_viewer_rules():
    text = "A <p viewer='agent_0'>zero</p> B <p viewer=\"agent_1\">one</p> C <p viewer='environment'>env</p> <p>plain</p>"
    assert pr.render_text(text, "agent_0") == "A zero B  C  plain"
    assert pr.render_text(text, "agent_1") == "A  B one C  plain"
    assert pr.render_text(text, "environment") == "A zero B one C env plain"
    nested = "<extra_info>x <p viewer='agent_1'>secret <strategy_hint>h</strategy_hint></p></extra_info>"
    assert pr.render_text(nested, "agent_0") == "x"
    assert pr.render_text(nested, "agent_1") == "x secret h"
    assert pr.render_text("a\n   b <root>c</root>") == "a\nb c"
    assert pr.render_text("open <p viewer='agent_1'>hidden", "agent_0") == "open"
    assert pr.render_text("open <p viewer='agent_1'>hidden", "agent_1") == "open hidden"


def test_render_prompt_rejects_bad_calls(golden):
    with pytest.raises(ValueError, match="turn 1 belongs to agent 1"):
        render_prompt(golden, 0, ["Hi."])
    with pytest.raises(ValueError, match="view"):
        render_prompt(golden, 0, [], "omniscient")
    with pytest.raises(ValueError, match="agent"):
        render_prompt(golden, 2, [])
    with pytest.raises(TypeError, match="sequence"):
        render_prompt(golden, 1, "Hi.")
    with pytest.raises(TypeError, match=r"history\[0\]"):
        render_prompt(golden, 1, [None])


# ------------------------------------------------------------ dialog rules

@pytest.mark.parametrize("raw, clean", [
    ("Joy. Assertive. Let's go.", "Let's go."),
    ("joy. assertive. Let's go.", "Let's go."),
    ("Anticipation, Commissive: I will bring it tomorrow.", "I will bring it tomorrow."),
    ("Emotion: Fear. Action type: Directive. Response: Please stop.", "Please stop."),
    ("**Trust.** **Expressive.** Thank you!", "Thank you!"),
    ("Assertive. Anger. No.", "No."),
    ("Sadness. I miss it.", "I miss it."),
    ("Trust me, it works.", "Trust me, it works."),
    ("Joyful news! Assertive. Hi", "Joyful news! Assertive. Hi"),
    ("Joy. Fear. Hi", "Fear. Hi"),  # one emotion word at most
    ("Hello there.", "Hello there."),
])
def test_strip_tom_words(raw, clean):
    assert pr.strip_tom_words(raw) == clean


# The reference's own _act / _judge_terminate on these raw replies (ref notes 5.2): the
# kept utterance and whether the episode stops after it.
REFERENCE_DIALOG_VECTORS = [
    ("Hello there!", "Hello there!", False),
    ("  Sure: I can help: you know\nsecond line", "I can helpyou know", False),
    ("Turn 1: Hendrick Heinz said: Hello friend.", "Hendrick Heinz saidHello friend.", False),
    ("\n\nHi!\nBye", "Hi!", False),
    ("a: b", "b", False),
    ("Name:  two spaces", " two spaces", False),
    ("ends with colon: ", "ends with colon:", False),
    ("no colon-space:here", "no colon-space:here", False),
    ("LEAVE", "LEAVE", True),
    ("LEAVE. I am going home now, goodbye friend", "LEAVE. I am going home now, goodbye friend", False),
    ("Thanks, I will leave", "Thanks, I will leave", True),
    ("I left.", "I left.", True),
    ("He said: LEAVE", "LEAVE", True),
    ("Okay. *leaves the room*", "Okay. *leaves the room*", False),
    ("", "", False),
    ("   \n  x", "x", False),
    ("a\r\nb", "a\r", False),
    ("tab\there: x", "x", False),
    ("I think I should leave now, thanks", "I think I should leave now, thanks", False),
    ("ok LEAVE", "ok LEAVE", True),
    ("Leave", "Leave", True),
    ("cleaver", "cleaver", True),
    ("LEFT", "LEFT", True),
    ("Goodbye. LEAVE.", "Goodbye. LEAVE.", True),
    ("Bye! *leaves*", "Bye! *leaves*", True),
    ("I'm leaving", "I'm leaving", False),
    ("a\nLEAVE", "a", False),
    ("He left.\nmore", "He left.", True),
]


@pytest.mark.parametrize("raw, kept, stop", REFERENCE_DIALOG_VECTORS)
def test_dialog_rules_match_reference_vectors(golden, raw, kept, stop):
    utterance = pr.postprocess_reply(raw)
    assert utterance == kept
    for turn in (0, 1, 11):
        assert pr.is_leave(utterance, golden, turn) is stop
        assert pr.is_leave_line(pr.dialog_line(golden, turn, utterance)) is stop
    assert pr.is_leave(utterance) is stop


def test_is_leave_edge_cases(golden):
    # the first 10 characters of the line are "Turn t: " and a letter or two of the name
    assert pr.is_leave_line("Turn 0: Leave said:x") is False
    assert pr.is_leave_line("leave it") is True
    assert pr.is_leave("", golden, 0) is False
    assert pr.is_leave("  leave  ") is True
    assert pr.is_leave("The leaves are turning yellow in the park today.") is False
    with pytest.raises(TypeError):
        pr.is_leave("x", golden)
    with pytest.raises(TypeError):
        pr.is_leave("x", None, 3)


def test_is_leave_reads_the_whole_line(tmp_path):
    """A name ending in "left" with a reply under 4 characters: the line's last 10
    characters reach into the name, so only the line-based check is the reference's."""
    agents = json.loads(json.dumps(GOLDEN_AGENTS))
    agents["A1"]["last_name"] = "Cleft"
    task = load_tasks(write_set(tmp_path / "cleft", agents=agents))[0]
    assert pr.dialog_line(task, 0, "") == "Turn 0: Ada Cleft said:"
    assert pr.is_leave("", task, 0) is True
    assert pr.is_leave("", task, 1) is False  # Ben Roe speaks at turn 1
    assert pr.is_leave("") is False


# ------------------------------------------------------------ validation

def _mutate(obj, path, value=KeyError):
    """Set (or delete, with KeyError) a nested key of a JSON object."""
    *head, last = path
    for k in head:
        obj = obj[k]
    if value is KeyError:
        del obj[last]
    else:
        obj[last] = value


@pytest.mark.parametrize("file, path, value, key, field, words", [
    ("envs.json", ("ENV1", "scenario"), KeyError, "ENV1", "scenario", "missing"),
    ("envs.json", ("ENV1", "relationship"), 7, "ENV1", "relationship", "unknown relationship code 7"),
    ("envs.json", ("ENV1", "relationship"), "friend", "ENV1", "relationship", "expected an integer"),
    ("envs.json", ("ENV1", "relationship"), True, "ENV1", "relationship", "expected an integer"),
    ("envs.json", ("ENV1", "agent_goals"), ["a", "b", "c"], "ENV1", "agent_goals", "exactly 2"),
    ("envs.json", ("ENV1", "agent_goals"), ["a"], "ENV1", "agent_goals", "exactly 2"),
    ("envs.json", ("ENV1", "agent_goals", 1), 5, "ENV1", "agent_goals[1]", "expected a string"),
    ("envs.json", ("ENV1", "codename"), None, "ENV1", "codename", "expected a string"),
    ("envs.json", ("ENV1", "pk"), "OTHER", "ENV1", "pk", "differs from its key"),
    ("envs.json", ("ENV1", "agent_constraint"), "x", "ENV1", "agent_constraint", "expected null"),
    ("agents.json", ("A2", "age"), "thirty", "A2", "age", "expected an integer"),
    ("agents.json", ("A1", "secret"), KeyError, "A1", "secret", "missing"),
    ("agents.json", ("A1", "gender"), "Robot", "A1", "gender", "Man, Woman, Nonbinary"),
    ("agents.json", ("A1", "moral_values"), "Care", "A1", "moral_values", "expected a list"),
    ("env_agent_combos.json", (0, "env_id"), "NOPE", "[0]", "env_id", "unknown scenario 'NOPE'"),
    ("env_agent_combos.json", (0, "agent_ids", 1), "NOPE", "[0]", "agent_ids[1]", "unknown persona 'NOPE'"),
    ("env_agent_combos.json", (0, "agent_ids"), ["A1", "A2", "A1"], "[0]", "agent_ids", "exactly 2"),
    ("env_agent_combos.json", (0, "agent_ids"), ["A1", "A1"], "[0]", "agent_ids", "same persona"),
    ("env_agent_combos.json", (0, "env_id"), KeyError, "[0]", "env_id", "missing"),
])
def test_bad_field_errors(tmp_path, file, path, value, key, field, words):
    data = json.loads(json.dumps({"envs.json": GOLDEN_ENVS, "agents.json": GOLDEN_AGENTS,
                                  "env_agent_combos.json": GOLDEN_COMBOS}))
    _mutate(data[file], path, value)
    root = write_set(tmp_path / "bad", data["envs.json"], data["agents.json"],
                     data["env_agent_combos.json"])
    with pytest.raises(ScenarioError) as info:
        load_tasks(root)
    err = info.value
    assert isinstance(err, ValueError)
    assert Path(err.file) == root / file and (err.key, err.field) == (key, field)
    msg = str(err)
    for part in (str(root / file), f"key '{key}'", f"field '{field}'", words):
        assert part in msg, (part, msg)


def test_missing_file_and_directory(tmp_path):
    root = write_set(tmp_path / "set")
    (root / "agents.json").unlink()
    with pytest.raises(ScenarioError, match=r"agents\.json: file not found") as info:
        load_tasks(root)
    assert (info.value.key, info.value.field) == (None, None)
    with pytest.raises(ScenarioError, match="task directory not found"):
        load_tasks(tmp_path / "nowhere")


def test_invalid_json_and_wrong_top_level(tmp_path):
    root = write_set(tmp_path / "set")
    (root / "envs.json").write_text('{"ENV1": {', encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"envs\.json: not valid JSON \(line 1"):
        load_tasks(root)
    write_set(root, envs=[GOLDEN_ENVS["ENV1"]])
    with pytest.raises(ScenarioError, match=r"envs\.json: expected a JSON object keyed by id"):
        load_tasks(root)
    write_set(root, combos={"T1": GOLDEN_COMBOS[0]})
    with pytest.raises(ScenarioError, match=r"env_agent_combos\.json: expected a JSON list"):
        load_tasks(root)


def test_duplicated_id_is_refused(tmp_path):
    """A persona id given twice would silently replace the first record: refused, naming it."""
    root = tmp_path / "copy"
    shutil.copytree(sc.embedded_dir(), root)
    text = (root / "agents.json").read_text(encoding="utf-8")
    first = next(iter(json.loads(text)))
    record = json.dumps(json.loads(text)[first])
    (root / "agents.json").write_text(text.rstrip()[:-1] + f', "{first}": {record}}}', encoding="utf-8")
    with pytest.raises(ScenarioError, match=rf"agents\.json.*{first}.*appears twice"):
        load_tasks(root)


def test_broken_copy_of_embedded_set(tmp_path):
    """A broken copy of the real embedded files names the exact record."""
    root = tmp_path / "copy"
    shutil.copytree(sc.embedded_dir(), root)
    envs = json.loads((root / "envs.json").read_text(encoding="utf-8"))
    key = list(envs)[3]
    envs[key]["relationship"] = 9
    (root / "envs.json").write_text(json.dumps(envs), encoding="utf-8")
    with pytest.raises(ScenarioError, match=rf"key '{key}': field 'relationship': unknown relationship code 9"):
        load_tasks(root)


def test_cli_prints_prompt(capsys, embedded):
    import argparse
    parser = argparse.ArgumentParser()
    pr.configure_parser(parser)
    assert pr.run(parser.parse_args(["--task", "2", "--agent", "1", "--history", "Hello."])) == 0
    out = capsys.readouterr().out
    assert out.rstrip("\n") == render_prompt(embedded[2], 1, ["Hello."])
    assert pr.run(parser.parse_args(["--task", "2", "--agent", "1"])) == 2
    assert "turn 0 belongs to agent 0" in capsys.readouterr().err


def test_the_papers_tasks_use_only_the_five_relationships_it_names(sotopia, embedded):
    """Figure 5: appendix G names five categories (strangers .. romantic), which are the codes
    the paper's 450 tasks use; Sotopia's sixth, family_member, occurs in none of them, so the
    closeness scale (CLOSENESS_CODES) leaves it out. The embedded tasks do use it (the figure 5
    page says how it is treated)."""
    assert {t.relationship for t in sotopia} == set(sc.CLOSENESS_CODES) == {0, 1, 2, 3, 4}
    assert [sc.RELATIONSHIPS[c] for c in sc.CLOSENESS_CODES][::4] == ["stranger", "romantic_relationship"]
    assert 5 in {t.relationship for t in embedded} and sc.RELATIONSHIPS[5] == "family_member"
