"""The prompts the models read, rendered from Sotopia-format tasks (:mod:`synclib.tasks.scenarios`); the dialog rules.

Rendering is pure text (the model layer applies the chat template) and is the paper's reference code's
(``zzn-nzz/LM_neural_synchrony`` @ 49fe97e, ``sot_env.py``, ``sotopia_utils/utils.py``,
``get_control_conditions.py``) character for character; ``tests/data/reference_prompt_digests.json`` holds
the digests of the reference's strings for the 450 Sotopia tasks.

* :func:`agent_intro`: both agents' tagged bios (:func:`tagged_bio`), the intro template,
  :func:`format_docstring` (so the last goal has no newline), the reference's four masking substitutions in
  order (the other agent's ``<p viewer='agent_K'>…</p>``, every `` <p viewer="environment">…</p>`` with its
  leading space, the other agent's goal to the end of its line -> ``Unknown``, a following ``<extra_info>``
  block), then :data:`LEAVE_INSTRUCTION` + ``"\\n"``, then every ``<…>`` tag removed, content kept, with no
  whitespace clean-up (a background line may end with a space, agent 2's goal runs into "If your goal…").
* :func:`render_prompt`, the user message before utterance ``t``:

  - ``"active"``: intro + the lines ``"Turn {i}: {name} said:{utterance}"`` (no space after ``said:``, the
    utterance as stored) joined by ``"\\n"``, last the open line ``"Turn {t}: {speaker} said:"``.
  - ``"passive"`` (control 1, the reference's ``transform_prompt``): from the active string, its first line
    :data:`PASSIVE_FIRST_LINE` naming the drawn persona (:func:`passive_persona`), the two goal-visibility
    lines and the instruction gone, the open line dropped, every line stripped, the first empty line removed.
  - ``"tom"`` (appendix J; **our choice**, the reference has none): the active intro,
    :data:`TOM_INSTRUCTION` + ``"\\n"``, the lines with the other agent's emotion/action words stripped
    (:func:`strip_tom_words`), the open line.
* :func:`masked_prompt`: :func:`render_prompt`'s message in :class:`PromptPart` pieces, the masking's cuts
  located (shown by :mod:`synclib.analysis.dialogs`).
* :func:`complete_intro`, :func:`dialog_lines`: the reference's judge message
  (``complete_intro + "\\n".join(lines) + instructions``); :func:`judge_intro` our normalised layout.
* :func:`postprocess_reply`, :func:`is_leave`: the reference's dialog-loop rules.

Leak guard.  The reference masks by textual patterns, so each intro is checked for what the agent must not
see (the other's secret, the bio parts its relationship hides, the other's goal, ``<p viewer=…>`` content
for the other agent or the environment) unless our own masking shows it too.  Nothing leaks on the 450
Sotopia and 64 embedded tasks; should it, that agent's intro falls back to our masking with a
:class:`MaskingFallbackWarning`, and :func:`masking_notes` lists the case.

Our own masking (the fallback, and :func:`judge_intro`; ``protocol.md``):

* The other agent's goal is ``Unknown``; its bio is cut by relationship (:data:`OTHER_BIO_VISIBILITY`), an
  empty one shown as ``Unknown``.  An agent's own bio is always whole.
* ``<extra_info>``, ``<strategy_hint>``, ``<clarification_hint>``, ``<root>`` and a plain ``<p>``: the tags
  are dropped, their content kept; ``<p viewer="X">...</p>`` (either quote) keeps its content only for
  ``X`` and the environment (the judge).
* Then spaces opening a line are dropped and each field is stripped.

Where the reference would crash (a name not of two words, ``sot_env.py`` 168) or treats a name as a regular
expression, we escape it and go on.  ``python -m synclib.tasks.prompts`` prints one rendered prompt.
"""
from __future__ import annotations

import argparse
import functools
import random
import re
import sys
import warnings
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping, Sequence

from synclib.tasks.scenarios import GENDER_WORDS, Persona, Task, TaskSet, load_tasks

__all__ = [
    "OTHER_BIO_VISIBILITY", "BIO_VISIBILITIES",
    "EMOTIONS", "ACTIONS", "TOM_INSTRUCTION", "LEAVE_INSTRUCTION", "PASSIVE_FIRST_LINE",
    "PASSIVE_PERSONA_RULE", "VIEWS", "MaskingFallbackWarning",
    "speaker_line", "bio", "tagged_bio", "format_docstring", "render_text",
    "agent_intro", "complete_intro", "dialog_line", "dialog_lines", "render_history",
    "render_prompt", "PART_KINDS", "PromptPart", "masked_prompt", "passive_from_active", "passive_persona", "reference_leaks",
    "masking_notes", "judge_intro", "context_lines", "strip_tom_words", "postprocess_reply", "REPLY_ENDS", "trim_to_sentence", "is_leave",
    "is_leave_line",
]
#: How much of a bio can be shown, from nothing to everything.
BIO_VISIBILITIES: tuple[str, ...] = ("none", "name", "public", "no_secret", "full")

#: relationship code -> how much of the *other* agent's bio an agent sees.
OTHER_BIO_VISIBILITY: Mapping[int, str] = MappingProxyType({
    0: "none", 1: "name", 2: "public", 3: "no_secret", 4: "no_secret", 5: "no_secret"})

#: ToM target words, in the protocol's order.
EMOTIONS: tuple[str, ...] = (
    "Joy", "Trust", "Fear", "Surprise", "Sadness", "Disgust", "Anger", "Anticipation")
ACTIONS: tuple[str, ...] = (
    "Assertive", "Directive", "Commissive", "Expressive", "Declaration")

#: the prompt views: the speaker's (the played dialog, the analysis' "genuine"), the passive reader's, the ToM run's
VIEWS: tuple[str, ...] = ("active", "passive", "tom")
View = Literal["active", "passive", "tom"]

#: The reference's ``additional_instruction`` (``sot_env.py`` 97) without its trailing ``"\n"``
LEAVE_INSTRUCTION = (
    'If your goal as the agent has been achieved, you should leave the conversation by '
    'saying "LEAVE". If your goal has not been achieved, you should say something to '
    'interact with the other. Keep your words concise.')

TOM_INSTRUCTION = (
    "Please be sure to indicate your emotion and action type both in a word at the "
    "beginning of your turn, in the format of: Emotion. Action type. Response. Emotion "
    "should be one of the following words: Joy. Trust. Fear. Surprise. Sadness. Disgust. "
    "Anger. Anticipation.; Action type should be one of the following words: Assertive. "
    "Directive. Commissive. Expressive. Declaration. Your output format should be: "
    "Emotion. Action type. Response.")

#: First line of the passive view (``get_control_conditions.py`` 52-53); ``{name}``: the drawn persona's
PASSIVE_FIRST_LINE = ("Imagine you are {name}. You are reading an interaction between "
                      "other two people.")

#: How :func:`passive_persona` draws the passive reader's persona (for the record).
PASSIVE_PERSONA_RULE = (
    "persona(task i, sim seed s) = the first of the (i+1)-th random.sample(ids, 2) of "
    "Python's random.Random(s), ids = the agents.json ids in file order (the reference's "
    "get_control_conditions.py 182-230 with sot_env.py 430-477)")


class MaskingFallbackWarning(UserWarning):
    """The reference's masking would show hidden text for a task; our masking was used."""


# ------------------------------------------------------------------------ rendering
# Our own masking: the leak guard's fallback and the normalised judge intro.

_VIEWER_P = re.compile(
    r"<p\s+viewer\s*=\s*(['\"])(?P<viewer>[^'\"]*)\1\s*>"
    r"(?P<body>(?:(?!<p[\s>]).)*?)</p\s*>", re.S)
_UNCLOSED_VIEWER_P = re.compile(
    r"<p\s+viewer\s*=\s*(['\"])(?P<viewer>[^'\"]*)\1\s*>(?P<body>.*)$", re.S)
_KEEP_CONTENT_TAGS = re.compile(
    r"</?(?:extra_info|strategy_hint|clarification_hint|root|p)\b[^>]*>")


def render_text(text: str, viewer: str = "environment") -> str:
    """Raw scenario, goal or bio text as ``viewer`` (``"agent_0"``, ``"agent_1"`` or ``"environment"``) sees it
    under our masking rules; an unclosed ``<p viewer>`` runs to the end of the text."""
    def keep(match: re.Match) -> str:
        return match["body"] if viewer == "environment" or match["viewer"] == viewer else ""

    prev = None
    while prev != text:  # innermost <p viewer> first, until none is left
        prev, text = text, _VIEWER_P.sub(keep, text)
    text = _UNCLOSED_VIEWER_P.sub(keep, text)  # an unclosed <p viewer> runs to the end
    text = _KEEP_CONTENT_TAGS.sub("", text)
    return re.sub(r"\n +", "\n", text).strip()


def bio(persona: Persona, visibility: str = "full") -> str:
    """A persona's bio cut to ``visibility`` (our masking).  ``full``: ``"{First Last} is a {age}-year-old
    {male|female|nonbinary} {occupation lowercased}. {pronoun} pronouns. {public_info} Personality and values
    description: {personality_and_values} {First}'s secrets: {secret}"``; ``no_secret`` ends before the
    secrets, ``public`` after ``public_info``, ``name`` is the name, ``none`` is ``""``."""
    if visibility not in BIO_VISIBILITIES:
        raise ValueError(f"visibility must be one of {BIO_VISIBILITIES}, got {visibility!r}")
    p = persona
    parts = [
        ("name", p.name),
        ("public", f"is a {p.age}-year-old {GENDER_WORDS[p.gender]} {p.occupation.lower()}. "
                   f"{p.gender_pronoun} pronouns. {p.public_info}"),
        ("no_secret", f"Personality and values description: {p.personality_and_values}"),
        ("full", f"{p.first_name}'s secrets: {p.secret}"),
    ]
    upto = BIO_VISIBILITIES.index(visibility)
    return " ".join(text for level, text in parts if BIO_VISIBILITIES.index(level) <= upto)


def _check_agent(agent: int) -> None:
    if agent not in (0, 1) or isinstance(agent, bool):
        raise ValueError(f"agent must be 0 (agent 1) or 1 (agent 2), got {agent!r}")


def _intro_head(me: str) -> list[str]:
    return [
        f"Imagine you are {me}, your task is to act/speak as {me} would, keeping in mind "
        f"{me}'s social goal.",
        f"You can find {me}'s goal (or background) in the 'Here is the context of the "
        f"interaction' field.",
        f"Note that {me}'s goal is only visible to you.",
    ]


def _no_mark(kind: str, hidden: str, shown: str, what: str) -> str:
    """The masking's default: only what the viewer is shown (see :func:`masked_prompt`)."""
    return shown


def _context_lines(task: Task, viewer: int | None, mark=_no_mark) -> list[str]:
    """The context block as agent ``viewer`` sees it under our masking (None: the judge, unmasked); ``mark`` as
    in :func:`_reference_mask`."""
    tag_viewer = "environment" if viewer is None else f"agent_{viewer}"
    env = task.env
    bios = []
    for i, persona in enumerate(task.agents):
        visibility = "full" if viewer in (None, i) else OTHER_BIO_VISIBILITY[env.relationship]
        shown = render_text(bio(persona, visibility), tag_viewer)
        if visibility != "full":
            full = render_text(bio(persona, "full"), tag_viewer)
            rest = full[len(shown):].strip() if full.startswith(shown) else full
            shown = (mark("replaced", full, "Unknown", "bio") if not shown
                     else shown + mark("removed", rest, "", "bio") if rest else shown)
        bios.append(shown)
    goals = [render_text(goal, tag_viewer) if viewer in (None, i)
             else mark("replaced", render_text(goal, "environment"), "Unknown", "goal")
             for i, goal in enumerate(env.agent_goals)]
    return context_lines(render_text(env.scenario, tag_viewer), task.names, bios, goals)


def context_lines(scenario: str, names: Sequence[str], backgrounds: Sequence[str],
                  goals: Sequence[str]) -> list[str]:
    """The "Here is the context of this interaction" lines: scenario, participants, each agent's background
    (``Unknown`` when empty) and goal."""
    lines = ["Here is the context of this interaction:",
             f"Scenario: {scenario}",
             f"Participants: {names[0]} and {names[1]}"]
    lines += [f"{name}'s background: {text or 'Unknown'}" for name, text in zip(names, backgrounds)]
    lines += [f"{name}'s goal: {text}" for name, text in zip(names, goals)]
    return lines


def _own_masking_intro(task: Task, agent: int, mark=_no_mark) -> str:
    """The leak guard's fallback: an agent's intro under our masking, laid out like the reference's."""
    lines = _intro_head(task.names[agent]) + _context_lines(task, agent, mark) + [LEAVE_INSTRUCTION]
    return "\n".join(lines) + "\n"


# The reference's rendering (sotopia_utils/utils.py 8-10, 39-64, 138-187; sot_env.py
# 152-182, 217-293).

def format_docstring(text: str) -> str:
    """Sotopia's ``format_docstring``: spaces opening a line dropped, both ends stripped."""
    return re.sub("\n +", "\n", text).strip()


def _clean_tags(text: str) -> str:
    """The reference's ``_clean_tags``: every ``<…>`` within a line removed, content kept."""
    return re.sub(r"<.*?>", "", text)


def tagged_bio(persona: Persona, relationship: int, agent: int) -> str:
    """A persona's bio as the reference builds it (``get_bio``), the part hidden from the other agent wrapped in
    ``<p viewer='agent_{agent}'>…</p>`` (``agent`` 0: agent 1's bio).  ``relationship`` 0 hides the whole bio
    (``<root>`` around it), 1 all but the name, 2 from ``Personality and values description`` on, 3-5 the secret."""
    _check_agent(agent)
    p = persona
    name = f"{p.first_name} {p.last_name}"
    adj = GENDER_WORDS[p.gender] if p.gender else ""
    core = (f"{p.age}-year-old {adj} {p.occupation.lower()}. {p.gender_pronoun} pronouns. "
            f"{p.public_info}")
    values = f"Personality and values description: {p.personality_and_values}"
    secret = f"{p.first_name}'s secrets: {p.secret}"
    tag = f"<p viewer='agent_{agent}'>"
    if relationship == 0:
        return f"<root>{tag}{name} is a {core} {values} {secret}</p></root>"
    if relationship == 1:
        return f"{name} {tag}is a {core} {values} {secret}</p>"
    if relationship == 2:
        return f"{name} is a {core} {tag}{values} {secret}</p>"
    if relationship in (3, 4, 5):
        return f"{name} is a {core} {values} {tag}{secret}</p>"
    raise ValueError(f"Unknown relationship {relationship}")


def _context_block(task: Task) -> str:
    """The reference's context template with tagged bios and raw goals, before ``format_docstring``."""
    env, (n1, n2) = task.env, task.names
    b1, b2 = (tagged_bio(task.agents[k], env.relationship, k) for k in (0, 1))
    g1, g2 = env.agent_goals
    return (f"Here is the context of this interaction:\nScenario: {env.scenario}\n"
            f"Participants: {n1} and {n2}\n{n1}'s background: {b1}\n{n2}'s background: {b2}\n"
            f"{n1}'s goal: {g1}\n{n2}'s goal: {g2}\n")


def _reference_mask(intro: str, agent: int, opponent: str, mark=_no_mark) -> str:
    """The reference's ``_mask_intro``: its four substitutions, in order.  ``mark(kind, hidden, shown, what)`` gives
    the text put in place of each cut (default: ``shown``; :func:`masked_prompt` locates the cuts with it)."""
    tag = f"<p viewer='agent_{1 - agent}'>"

    def for_other(m: re.Match) -> str:  # "bio" on the other's background line, else "other"
        line = m.string[m.string.rfind("\n", 0, m.start()) + 1:m.start()]
        return mark("removed", m[0], "", "bio" if line.startswith(f"{opponent}'s background: ") else "other")
    if tag in intro:
        intro = re.sub(re.escape(tag) + r".*?</p>", for_other, intro)
    intro = re.sub(r" <p viewer=\"environment\">.*?</p>", lambda m: mark("removed", m[0], "", "environment"),
                   intro)
    prefix = f"{opponent}'s goal: "
    opp = re.escape(opponent)  # the reference uses the name as a pattern; same for real names
    intro = re.sub(opp + r"'s goal: (.*?)(\n|$)",
                   lambda m: prefix + mark("replaced", m[1], "Unknown", "goal") + "\n", intro)

    def extra_info(m: re.Match) -> str:  # the goal line stays as the third substitution left it
        if mark is _no_mark:
            return prefix + "Unknown\n"
        cut = mark("removed", m[2], "", "goal") if m[2].startswith("\n<extra_info>") else ""
        return prefix + m[1] + cut + "\n"
    return re.sub(opp + r"'s goal: (.*?)(\n<extra_info>.*?\n</extra_info>|\n|$)", extra_info, intro, flags=re.S)


def _reference_intro(task: Task, agent: int, mark=_no_mark) -> str:
    me, opponent = task.names[agent], task.names[1 - agent]
    raw = format_docstring("\n".join(_intro_head(me)) + "\n" + _context_block(task))
    return _clean_tags(_reference_mask(raw, agent, opponent, mark) + LEAVE_INSTRUCTION + "\n")


def _hidden_texts(task: Task, agent: int) -> list[str]:
    """What ``agent`` must not see (the module docstring's leak guard)."""
    other = task.agents[1 - agent]
    level = BIO_VISIBILITIES.index(OTHER_BIO_VISIBILITY[task.relationship])
    hidden = [other.secret, task.env.agent_goals[1 - agent]]
    if level < BIO_VISIBILITIES.index("no_secret"):
        hidden.append(other.personality_and_values)
    if level < BIO_VISIBILITIES.index("public"):
        hidden.append(other.public_info)
    me = f"agent_{agent}"
    for text in (task.env.scenario, *task.env.agent_goals):
        prev = None
        while prev != text:  # innermost first; an outer tag's body then holds the inner text
            hidden += [m["body"] for m in _VIEWER_P.finditer(text) if m["viewer"] != me]
            prev, text = text, _VIEWER_P.sub(lambda m: m["body"], text)
        hidden += [m["body"] for m in _UNCLOSED_VIEWER_P.finditer(text) if m["viewer"] != me]
    return hidden


@functools.lru_cache(maxsize=8192)
def _guarded_intro(task: Task, agent: int) -> tuple[str, tuple[str, ...]]:
    """(reference intro, hidden pieces it shows that our own masking does not)."""
    ref = _reference_intro(task, agent)
    allowed = _own_masking_intro(task, agent)
    pieces: set[str] = set()
    for text in _hidden_texts(task, agent):
        for form in (render_text(text, "environment"), _clean_tags(text)):
            for piece in (form, *form.split("\n")):
                piece = piece.strip()
                if piece:
                    pieces.add(piece)
    leaks = tuple(sorted(p for p in pieces if p in ref and p not in allowed))
    return ref, leaks


def reference_leaks(task: Task, agent: int) -> tuple[str, ...]:
    """Hidden text the reference's masking would show ``agent`` (0 or 1) in ``task``."""
    _check_agent(agent)
    return _guarded_intro(task, agent)[1]


def masking_notes(tasks) -> list[str]:
    """One note per (task, agent) of a TaskSet or Tasks whose intro falls back to our masking."""
    notes = []
    for task in tasks:
        for agent in (0, 1):
            leaks = reference_leaks(task, agent)
            if leaks:
                notes.append(
                    f"task {task.index} ({task.pk}) agent {agent + 1}: the reference's masking "
                    f"would show {len(leaks)} hidden text(s), e.g. {leaks[0][:60]!r}; our "
                    f"masking is used for this agent's prompts")
    return notes


@functools.lru_cache(maxsize=8192)
def _fallback_intro(task: Task, agent: int) -> str:
    leaks = _guarded_intro(task, agent)[1]
    warnings.warn(
        f"task {task.index} ({task.pk}), agent {agent + 1}: the reference's masking would show "
        f"hidden text ({leaks[0][:60]!r}{', …' if len(leaks) > 1 else ''}); our masking is "
        f"used for this agent's prompts", MaskingFallbackWarning, stacklevel=3)
    return _own_masking_intro(task, agent)


def agent_intro(task: Task, agent: int) -> str:
    """The intro ``agent`` (0 = agent 1, 1 = agent 2) reads before the dialog lines: the reference's
    ``agent{1,2}_intro``, or the leak guard's fallback."""
    _check_agent(agent)
    ref, leaks = _guarded_intro(task, agent)
    return _fallback_intro(task, agent) if leaks else ref


def complete_intro(task: Task) -> str:
    """The judge's intro as the reference builds it (``SotopiaEnv.complete_intro``): the context block,
    ``format_docstring``'ed, every tag removed with its content kept; no trailing newline."""
    return _clean_tags(format_docstring(_context_block(task)))


def dialog_line(task: Task, turn: int, utterance: str = "") -> str:
    """``"Turn {turn}: {speaker} said:{utterance}"`` (agent 1 at even turns); without utterance, the open line."""
    return speaker_line(task.names, turn, utterance)


def speaker_line(names: Sequence[str], turn: int, utterance: str = "") -> str:
    """:func:`dialog_line` from the two agents' names alone."""
    return f"Turn {turn}: {names[turn % 2]} said:{utterance}"


def render_history(task: Task, history: Sequence[str], viewer: int | None = None,
                   tom: bool = False) -> list[str]:
    """The complete dialog lines; with ``tom=True`` the other agent's (not ``viewer``'s) utterances go through
    :func:`strip_tom_words`."""
    lines = []
    for i, utterance in enumerate(history):
        if not isinstance(utterance, str):
            raise TypeError(f"history[{i}] must be a str, got {type(utterance).__name__}")
        if tom and viewer is not None and i % 2 != viewer:
            utterance = strip_tom_words(utterance)
        lines.append(dialog_line(task, i, utterance))
    return lines


def dialog_lines(task: Task, utterances: Sequence[str]) -> list[str]:
    """The reference's complete dialog lines (``intended_dialog``), as the judge reads them."""
    if isinstance(utterances, str):
        raise TypeError("utterances must be a sequence of str, not a single str")
    return render_history(task, utterances)


def passive_from_active(prompt: str, persona_name: str) -> str:
    """The reference's passive view (``transform_prompt``, ``another_read=True``) of an active prompt for a
    reader named ``persona_name``, after the reference's CSV round trip (``"\\r\\n"``, ``"\\r"`` -> ``"\\n"``).
    A prompt without ``"Imagine you are "`` comes back unchanged, as in the reference."""
    text = prompt.replace("\r\n", "\n").replace("\r", "\n")
    try:
        me = text.split("Imagine you are ")[1].split(",")[0]
    except IndexError:
        return text
    first = text.split("\nYou can find")[0]
    out = text.replace(first, PASSIVE_FIRST_LINE.format(name=persona_name))
    out = out.replace(f"Note that {me}'s goal is only visible to you.\n", "")
    out = out.replace(f"You can find {me}'s goal (or background) in the 'Here is the context "
                      f"of the interaction' field.\n", "")
    out = out.replace(LEAVE_INSTRUCTION + "\n", "")
    lines = [s.strip() for s in out.split("\n")[:-1]]
    if "" in lines:
        lines.remove("")
    return "\n".join(lines)


@functools.lru_cache(maxsize=64)
def _draws(ids: tuple[str, ...], seed: int) -> tuple[random.Random, list[str]]:
    return random.Random(seed), []


def passive_persona(taskset: TaskSet, task_index: int, sim_seed: int) -> Persona:
    """The persona the passive reader of task ``task_index`` is told it is, drawn as the reference does
    (:data:`PASSIVE_PERSONA_RULE`).  It reads both agents' turns and may be one of the participants."""
    ids = tuple(taskset.personas)
    if len(ids) < 2:
        raise ValueError(f"the passive persona is drawn from at least 2 personas, "
                         f"{taskset.root} has {len(ids)}")
    if isinstance(task_index, bool) or int(task_index) != task_index or task_index < 0:
        raise ValueError(f"task_index must be an integer >= 0, got {task_index!r}")
    rng, firsts = _draws(ids, int(sim_seed))
    while len(firsts) <= task_index:
        firsts.append(rng.sample(ids, 2)[0])
    return taskset.personas[firsts[int(task_index)]]


def render_prompt(task: Task, agent: int, history: Sequence[str] = (),
                  view: View = "active", persona: Persona | str | None = None) -> str:
    """The user message (no chat template) for ``agent`` before utterance ``len(history)``.

    Parameters
    ----------
    task : Task
    agent : int
        0 (agent 1) or 1 (agent 2), whose turn it must be (``len(history) % 2 == agent``); in the passive view,
        the agent the reader replaces.
    history : sequence of str
        The utterances so far as stored (post-processed, unstripped; index = turn).
    view : {"active", "passive", "tom"}
    persona : Persona or str, optional
        Passive view only: the drawn reader (:func:`passive_persona`) or its name; None: the replaced agent.

    Returns the message: ``active`` and ``tom`` end with the open line, ``passive`` with the last complete line.
    """
    _check_agent(agent)
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    if isinstance(history, str):
        raise TypeError("history must be a sequence of utterances, not a single str")
    t = len(history)
    if t % 2 != agent:
        raise ValueError(f"turn {t} belongs to agent {t % 2} (agent {t % 2 + 1}), "
                         f"not to agent {agent}")
    return _compose(task, agent, history, view, persona, agent_intro(task, agent))


def _compose(task: Task, agent: int, history: Sequence[str], view: View,
             persona: Persona | str | None, intro: str) -> str:
    """:func:`render_prompt` from an agent's intro (checked arguments)."""
    t = len(history)
    lines = render_history(task, history, viewer=agent, tom=(view == "tom"))
    lines.append(dialog_line(task, t))
    if view == "tom":
        return intro + TOM_INSTRUCTION + "\n" + "\n".join(lines)
    active = intro + "\n".join(lines)
    if view == "active":
        return active
    if persona is None:
        name = task.names[agent]
    else:
        name = persona if isinstance(persona, str) else persona.name
    return passive_from_active(active, name)


#: :func:`masked_prompt`'s parts: shown text, a cut (shown nowhere), a stand-in (``Unknown`` for the hidden text)
PART_KINDS: tuple[str, ...] = ("shown", "removed", "replaced")
_MARK = re.compile("\ue000(\\d+)\ue001([^\ue000-\ue002]*)\ue002")


@dataclass(frozen=True)
class PromptPart:
    """A piece of a prompt: ``text`` as the viewer reads it, ``kind`` one of :data:`PART_KINDS`; for a cut or a
    stand-in, the ``hidden`` text (tags removed) and ``what`` was masked: ``"bio"``, ``"goal"`` (with extra
    information), ``"other"`` (for the other agent only) or ``"environment"``."""

    text: str
    kind: str = "shown"
    hidden: str = ""
    what: str = ""


def masked_prompt(task: Task, agent: int, history: Sequence[str] = (), view: View = "active",
                  persona: Persona | str | None = None) -> tuple[PromptPart, ...]:
    """:func:`render_prompt`'s user message in parts, the masking's cuts located:
    ``"".join(p.text for p in parts) == render_prompt(task, agent, history, view, persona)``.

    The intro is rendered again by the masking in use, each substitution leaving a mark with what it hid, and
    the marks are aligned on :func:`render_prompt`'s output.  Our own masking marks the other agent's bio and
    goal, not ``<p viewer=…>`` content cut from the scenario.

    Raises
    ------
    ValueError
        Bad arguments (as :func:`render_prompt`), or the marks could not be aligned (task
        texts holding the private-use characters U+E000-U+E002).
    """
    plain = render_prompt(task, agent, history, view, persona)
    cuts: list[tuple[str, str, str]] = []

    def mark(kind: str, hidden: str, shown: str, what: str) -> str:
        hidden = _MARK.sub(lambda m: cuts[int(m[1])][1], hidden)  # a cut inside a cut
        cuts.append((kind, format_docstring(_clean_tags(hidden)), what))
        return f"\ue000{len(cuts) - 1}\ue001{shown}\ue002"

    own = bool(_guarded_intro(task, agent)[1])
    intro = _own_masking_intro(task, agent, mark) if own else _reference_intro(task, agent, mark)
    return _align(_compose(task, agent, history, view, persona, intro), plain, cuts)


def _align(marked: str, plain: str, cuts: Sequence[tuple[str, str, str]]) -> tuple[PromptPart, ...]:
    """Parts of ``plain`` from ``marked`` (``plain`` with marks, perhaps with whitespace ``plain`` stripped)."""
    parts: list[PromptPart] = []
    i = start = pos = 0

    def feed(chars: str) -> None:
        nonlocal i
        for ch in chars:
            if i < len(plain) and plain[i] == ch:
                i += 1
            elif not ch.isspace():
                raise ValueError(f"masked_prompt: the marks do not align at character {i} of the prompt")

    for m in _MARK.finditer(marked):
        feed(marked[pos:m.start()])
        if i > start:
            parts.append(PromptPart(plain[start:i]))
        kind, hidden, what = cuts[int(m[1])]
        start = i
        feed(m[2])
        parts.append(PromptPart(plain[start:i], kind, hidden, what))
        start, pos = i, m.end()
    feed(marked[pos:])
    if i != len(plain):
        raise ValueError("masked_prompt: the marks do not align with the end of the prompt")
    if i > start:
        parts.append(PromptPart(plain[start:i]))
    return tuple(parts)


def judge_intro(task: Task) -> str:
    """The complete, unmasked intro in our normalised layout (:func:`context_lines`), ``"\\n"``-joined."""
    return "\n".join(_context_lines(task, None))


# ----------------------------------------------------------------------- dialog rules

_TOM_WORD = re.compile(
    r"^\s*[*_\"'`]*\s*(?:(?:emotion|action(?:\s+type)?)\s*[:=-]\s*)?[*_\"'`]*"
    r"(?P<word>" + "|".join(EMOTIONS + ACTIONS) + r")[*_\"'`]*\s*(?:[.,:;!]+|$)[*_\"'`]*",
    re.I)
_RESPONSE_LABEL = re.compile(r"^\s*[*_]*response\s*[:=-]\s*[*_]*", re.I)


def strip_tom_words(utterance: str) -> str:
    """Remove the leading emotion and action-type words: ``"Joy. Assertive. Let's go."`` -> ``"Let's go."``.

    At most one of each, in either order, each followed by ``. , : ; !`` or the end, optionally labelled
    (``Emotion: Joy.``) or wrapped in ``*`` or quotes; a following ``Response:`` goes too.  Otherwise the text
    is only stripped (``"Trust me, ..."`` keeps its first word).
    """
    text, seen = utterance, set()
    for _ in range(2):
        match = _TOM_WORD.match(text)
        if not match:
            break
        word = match["word"].capitalize()
        kind = "emotion" if word in EMOTIONS else "action"
        if kind in seen:
            break
        seen.add(kind)
        text = text[match.end():]
    if seen:
        text = _RESPONSE_LABEL.sub("", text, count=1)
    return text.strip()


def postprocess_reply(text: str) -> str:
    """The reference's reply clean-up (``LM_hf.get_result_from_output``'s strip, then ``sot_env._act`` 386-392):
    strip, keep the first line, drop the text before the first ``": "`` and every later ``": "``.  No strip
    afterwards: ``"Name:  two spaces"`` -> ``" two spaces"``, and a ``"\\r"`` stays."""
    r = text.strip().split("\n")[0]
    if ": " in r:
        r = "".join(r.split(": ")[1:])
    return r


#: how a reply cut by ``max_new_tokens`` ends: "line" as generated (the reference), "sentence" (ours)
REPLY_ENDS = ("line", "sentence")
_SENTENCE_END = re.compile(r"""[.!?]["')\]]*(?=\s|$)""")


def trim_to_sentence(reply: str) -> str:
    """``reply`` up to its last complete sentence (``.``, ``!`` or ``?``, closing quotes or brackets, then a space
    or the end), or unchanged: ``"Hi there. I was going to"`` -> ``"Hi there."`` (``simulate.reply_end: sentence``)."""
    ends = list(_SENTENCE_END.finditer(reply))
    return reply[:ends[-1].end()] if ends else reply


_LEAVE_WORDS = ("left", "leave")


def is_leave_line(line: str) -> bool:
    """The reference's stop rule (``_judge_terminate``): the line's first or last 10 characters, lowercased,
    contain ``"left"`` or ``"leave"``."""
    return any(w in line[:10].lower() or w in line[-10:].lower() for w in _LEAVE_WORDS)


def is_leave(utterance: str, task: Task | None = None, turn: int | None = None) -> bool:
    """True when the episode ends after ``utterance``: with ``task`` and ``turn``, :func:`is_leave_line` on its
    dialog line (the reference); without, the last 10 characters of ``"said:" + utterance``, which differs only
    for a name ending in ``left`` and a reply under 4 characters.  ``"LEAVE"`` opening a longer reply or
    ``"leaving"`` do not end the episode, ``"cleaver"`` does."""
    if task is not None:
        if turn is None:
            raise TypeError("is_leave: give the turn together with the task")
        return is_leave_line(dialog_line(task, turn, utterance))
    if turn is not None:
        raise TypeError("is_leave: give the task together with the turn")
    tail = ("said:" + utterance)[-10:].lower()
    return any(w in tail for w in _LEAVE_WORDS)


# ---------------------------------------------------------------------- small CLI

def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options for printing one rendered prompt (``python -m synclib.tasks.prompts``)."""
    parser.add_argument("--tasks", default="embedded",
                        help="task directory in Sotopia's format, 'sotopia' (the paper's tasks, fetched on "
                             "first use) or 'embedded' (default)")
    parser.add_argument("--task", type=int, default=0, help="task index (episode), default 0")
    parser.add_argument("--agent", type=int, default=0, choices=(0, 1),
                        help="0 = agent 1, 1 = agent 2 (default 0)")
    parser.add_argument("--view", default="active", choices=VIEWS + ("complete", "judge"),
                        help="prompt view; 'complete' prints the reference's judge intro, "
                             "'judge' our normalised one (default active)")
    parser.add_argument("--sim-seed", type=int, default=0,
                        help="simulation seed of the passive reader's persona draw (default 0)")
    parser.add_argument("--history", nargs="*", default=[],
                        help="utterances so far, in order (their count must match --agent's turn)")


def run(args: argparse.Namespace) -> int:
    """Print the prompt selected by ``args``; 0 on success, 2 on bad input."""
    try:
        tasks = load_tasks(args.tasks)
        task = tasks[args.task]
        if args.view == "judge":
            print(judge_intro(task))
        elif args.view == "complete":
            print(complete_intro(task))
        else:
            persona = (passive_persona(tasks, args.task, args.sim_seed)
                       if args.view == "passive" else None)
            print(render_prompt(task, args.agent, args.history, args.view, persona=persona))
    except (ValueError, IndexError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    _parser = argparse.ArgumentParser(prog="python -m synclib.tasks.prompts",
                                      description="Print one rendered prompt.")
    configure_parser(_parser)
    sys.exit(run(_parser.parse_args()))
