"""Tests for synclib.scenarios: loading, validation, the three prompt views, masking.

The Sotopia checks read ``<repo>/../shared/sotopia`` (the paper's 450 tasks); they are
skipped only where that directory is absent, and fail instead when ``CI`` is set.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from synclib import scenarios as sc
from synclib.scenarios import ScenarioError, load_tasks, render_prompt

REPO_ROOT = Path(__file__).resolve().parent.parent
SOTOPIA_DIR = REPO_ROOT.parent / "shared" / "sotopia"

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
def sotopia():
    if not SOTOPIA_DIR.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the Sotopia tasks are missing at {SOTOPIA_DIR}")
        pytest.skip(f"Sotopia tasks not found at {SOTOPIA_DIR} (a user's clone)")
    return load_tasks(SOTOPIA_DIR)


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
    """What agent ``me`` (None: the judge, who sees all content) should see of a raw text (the rules of protocol.md and the module
    docstring, re-implemented here): ``<p viewer>`` content meant for someone else goes,
    other tags go with their content kept, line-opening spaces go, the result is stripped."""
    text = re.sub(r"<p\s+viewer=['\"]([^'\"]*)['\"]\s*>(.*?)</p>",
                  lambda m: m.group(2) if me is None or m.group(1) == f"agent_{me}" else "", text, flags=re.S)
    text = re.sub(r"</?(extra_info|strategy_hint|clarification_hint|root|p)>", "", text)
    return re.sub(r"\n +", "\n", text).strip()


def history_for(t: int) -> list[str]:
    """A synthetic ToM-style dialog of t utterances."""
    return [f"{TOM_PREFIX}Utterance number {i} here." for i in range(t)]


def check_task(task: sc.Task) -> int:
    """Render every view for both agents and check masking; returns prompts checked."""
    env, names = task.env, task.names
    n = 0
    for me in (0, 1):
        other = 1 - me
        own, theirs = task.agents[me], task.agents[other]
        # each rendered field is stripped (some Sotopia texts end with a space)
        own_bio = " ".join(bio_parts(own).values()).strip()
        visible = VISIBLE_PARTS[env.relationship]
        expected_other_bio = " ".join(v for k, v in bio_parts(theirs).items() if k in visible).strip()
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

        for extra in (0, 2):
            t = me + extra
            history = history_for(t)
            for view in sc.VIEWS:
                prompt = render_prompt(task, me, history, view)
                n += 1
                lines = prompt.split("\n")
                where = f"task {task.index} agent {me} view {view} t={t}"
                assert lines[-1] == f"Turn {t}: {names[me]} said:", where
                assert not LEFTOVER_TAG.search(prompt), where
                assert f"{names[me]}'s background: {own_bio}\n" in prompt, where
                assert f"{names[other]}'s background: {expected_other_bio or 'Unknown'}\n" in prompt, where
                assert f"{names[me]}'s goal: {own_goal}\n" in prompt, where
                assert f"{names[other]}'s goal: Unknown\n" in prompt, where
                assert f"Scenario: {scenario}\n" in prompt, where
                for s in secret_strings:
                    if s and s not in allowed:
                        assert s not in prompt, f"{where}: leaked {s[:60]!r}"
                # views
                if view == "passive":
                    assert lines[0] == (f"Imagine you are {names[me]}. You are reading an "
                                        "interaction between other two people."), where
                    assert "LEAVE" not in prompt and "Keep your words concise" not in prompt, where
                    assert lines[1] == "Here is the context of this interaction:", where
                else:
                    assert lines[0].startswith(f"Imagine you are {names[me]}, your task is"), where
                    assert lines[3] == "Here is the context of this interaction:", where
                    assert sc.LEAVE_INSTRUCTION in lines, where
                assert (sc.TOM_INSTRUCTION in prompt) == (view == "tom"), where
                for i in range(t):
                    shown = history[i]
                    if view == "tom" and i % 2 != me:
                        shown = shown[len(TOM_PREFIX):]
                    assert f"Turn {i}: {names[i % 2]} said: {shown}" in lines, (where, i)
            # the passive reader sees the same context as the agent it replaces
            active = render_prompt(task, me, history, "active")
            passive = render_prompt(task, me, history, "passive").split("\n")
            context = active[active.index("Here is the context of this interaction:"):active.index(sc.LEAVE_INSTRUCTION)]
            assert "\n".join(passive[1:len(passive) - t - 1]) + "\n" == context
    return n


def test_all_sotopia_tasks_render_and_mask(sotopia):
    assert len(sotopia) == 450
    n = sum(check_task(task) for task in sotopia)
    assert n == 450 * 2 * 2 * 3


def test_embedded_tasks_render_and_mask(embedded):
    n = sum(check_task(task) for task in embedded)
    assert n == len(embedded) * 12


def test_judge_intro_is_unmasked(sotopia):
    for task in sotopia:
        intro = sc.judge_intro(task)
        for me in (0, 1):
            p = task.agents[me]
            assert f"{task.names[me]}'s background: {' '.join(bio_parts(p).values()).strip()}\n" in intro
            goal = agent_view(task.env.agent_goals[me], None)
            assert f"{task.names[me]}'s goal: {goal}" in intro
            assert "Unknown" not in intro.split("\n")[3 + me]
        assert not LEFTOVER_TAG.search(intro)
        if "<p viewer" in task.env.scenario:  # environment-only content reaches the judge
            hidden = re.search(r"<p viewer=[^>]*>(.*?)</p>", task.env.scenario).group(1)
            assert hidden in intro
            assert hidden not in render_prompt(task, 0)


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
        "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. Ada flies cargo planes.\n"
        "Ben Roe's background: Ben Roe is a 45-year-old male florist. He/him pronouns. Ben grows tulips. "
        "Personality and values description: Ben Roe is shy. Ben's secrets: Has never seen the sea\n"
        "Ada Moss's goal: Unknown\n"
        "Ben Roe's goal: Keep your umbrella (Extra information: it is new. Hint: be polite.)\n"
        "If your goal as the agent has been achieved, you should leave the conversation by saying \"LEAVE\". "
        "If your goal has not been achieved, you should say something to interact with the other. "
        "Keep your words concise.\n"
        "Turn 0: Ada Moss said: Hi Ben.\n"
        "Turn 1: Ben Roe said:"
    )
    assert render_prompt(golden, 1, ["Hi Ben."], "active") == expected


def test_golden_passive_prompt(golden):
    expected = (
        "Imagine you are Ada Moss. You are reading an interaction between other two people.\n"
        "Here is the context of this interaction:\n"
        "Scenario: Two acquaintances wait for the same bus.\n"
        "Participants: Ada Moss and Ben Roe\n"
        "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. Ada flies cargo planes. "
        "Personality and values description: Ada Moss is bold. Ada's secrets: Is afraid of heights\n"
        "Ben Roe's background: Ben Roe is a 45-year-old male florist. He/him pronouns. Ben grows tulips.\n"
        "Ada Moss's goal: Borrow an umbrella (Extra information: it is raining.)\n"
        "Ben Roe's goal: Unknown\n"
        "Turn 0: Ada Moss said: Hi Ben.\n"
        "Turn 1: Ben Roe said: Hello Ada.\n"
        "Turn 2: Ada Moss said:"
    )
    assert render_prompt(golden, 0, ["Hi Ben.", "Hello Ada."], "passive") == expected


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
    assert tail == ("Turn 0: Ada Moss said: Joy. Directive. Hi Ben.\n"
                    "Turn 1: Ben Roe said: Hello Ada.\n"
                    "Turn 2: Ada Moss said:")
    assert sc.TOM_INSTRUCTION == tom
    assert sc.EMOTIONS == ("Joy", "Trust", "Fear", "Surprise", "Sadness", "Disgust", "Anger",
                           "Anticipation")
    assert sc.ACTIONS == ("Assertive", "Directive", "Commissive", "Expressive", "Declaration")


def test_golden_judge_intro(golden):
    assert sc.judge_intro(golden) == (
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


@pytest.mark.parametrize("relationship, line", [
    (0, "Ada Moss's background: Unknown"),
    (1, "Ada Moss's background: Ada Moss"),
    (2, "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. "
        "Ada flies cargo planes."),
    (3, "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. "
        "Ada flies cargo planes. Personality and values description: Ada Moss is bold."),
    (4, "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. "
        "Ada flies cargo planes. Personality and values description: Ada Moss is bold."),
    (5, "Ada Moss's background: Ada Moss is a 30-year-old female pilot. She/her pronouns. "
        "Ada flies cargo planes. Personality and values description: Ada Moss is bold."),
])
def test_other_bio_by_relationship(tmp_path, relationship, line):
    envs = json.loads(json.dumps(GOLDEN_ENVS))
    envs["ENV1"]["relationship"] = relationship
    task = load_tasks(write_set(tmp_path / "r", envs=envs))[0]
    lines = render_prompt(task, 1, ["Hi."]).split("\n")
    assert lines[6] == line
    assert lines[7].endswith("Ben's secrets: Has never seen the sea")  # own bio whole
    assert task.env.relationship_name == sc.RELATIONSHIPS[relationship]


def test_bio_levels(golden):
    ada = golden.agents[0]
    assert sc.bio(ada, "none") == ""
    assert sc.bio(ada, "name") == "Ada Moss"
    assert sc.bio(ada) == (
        "Ada Moss is a 30-year-old female pilot. She/her pronouns. Ada flies cargo planes. "
        "Personality and values description: Ada Moss is bold. Ada's secrets: Is afraid of heights")
    assert sc.bio(ada, "no_secret") == sc.bio(ada).split(" Ada's secrets")[0]
    with pytest.raises(ValueError, match="visibility"):
        sc.bio(ada, "most")


def test_render_text_viewer_rules():
    text = "A <p viewer='agent_0'>zero</p> B <p viewer=\"agent_1\">one</p> C <p viewer='environment'>env</p> <p>plain</p>"
    assert sc.render_text(text, "agent_0") == "A zero B  C  plain"
    assert sc.render_text(text, "agent_1") == "A  B one C  plain"
    assert sc.render_text(text, "environment") == "A zero B one C env plain"
    nested = "<extra_info>x <p viewer='agent_1'>secret <strategy_hint>h</strategy_hint></p></extra_info>"
    assert sc.render_text(nested, "agent_0") == "x"
    assert sc.render_text(nested, "agent_1") == "x secret h"
    assert sc.render_text("a\n   b <root>c</root>") == "a\nb c"
    assert sc.render_text("open <p viewer='agent_1'>hidden", "agent_0") == "open"
    assert sc.render_text("open <p viewer='agent_1'>hidden", "agent_1") == "open hidden"


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
    assert sc.strip_tom_words(raw) == clean


@pytest.mark.parametrize("raw, clean", [
    ("Hello there.", "Hello there."),
    ("Hello there.\nSecond line: ignored", "Hello there."),
    ("\n  Hi Ben.  \nmore", "Hi Ben."),
    ('Ben Roe said: "Nice to see you."', '"Nice to see you."'),
    ("Turn 3: Ben: ok", "Ben: ok"),  # only up to the first ": "
    ("Price:$40 is fine", "Price:$40 is fine"),
    ("", ""),
])
def test_postprocess_reply(raw, clean):
    assert sc.postprocess_reply(raw) == clean


@pytest.mark.parametrize("utterance, leave", [
    ("LEAVE", True),
    ("I think I should leave now, bye.", False),  # "leave" is in neither 10-char window
    ("Okay, I will leave", True),
    ("Left the conversation.", True),
    ("Goodbye! (LEAVE)", True),
    ("Sure, let's meet at the cafe tomorrow at noon.", False),
    ("  leave  ", True),
    ("The leaves are turning yellow in the park today.", True),  # the rule is literal
])
def test_is_leave(utterance, leave):
    assert sc.is_leave(utterance) is leave


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
    sc.configure_parser(parser)
    assert sc.run(parser.parse_args(["--task", "2", "--agent", "1", "--history", "Hello."])) == 0
    out = capsys.readouterr().out
    assert out.rstrip("\n") == render_prompt(embedded[2], 1, ["Hello."])
    assert sc.run(parser.parse_args(["--task", "2", "--agent", "1"])) == 2
    assert "turn 0 belongs to agent 0" in capsys.readouterr().err
