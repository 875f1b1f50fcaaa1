"""The dialogs page's "What the models read": the three prompts of one turn of one dialog, the masking marked.

At utterance ``t`` of a dialog the speaking agent reads the *active* prompt; the passive
reader (control 1) reads the same dialog up to ``t - 1`` told it is someone else (the
persona the run drew: the cube's ``passive_reader``, :func:`synclib.tasks.prompts.passive_persona`);
the Theory-of-Mind run (appendix J, a separate dialog on the same task and seed) reads the
*tom* prompt. All three carry the speaking agent's view of the task: the other agent's
profile masked.

* :func:`turn_prompts` gives, for a task, an agent, the turn's history and the simulation
  seed, the three prompts as :func:`synclib.tasks.prompts.render_prompt` builds the user message
  (the models read it inside their chat template), each split into parts by
  :func:`synclib.tasks.prompts.masked_prompt`: the masking's own substitutions mark what they
  removed (the other agent's secret, the bio parts its relationship hides, text meant for
  the environment, the goal's extra information) or replaced (the goal -> ``Unknown``).
* :func:`render_html` shows a :class:`TurnPrompts` as one self-contained HTML fragment
  (inline CSS, no script, no external asset): each prompt verbatim and HTML-escaped, a
  stand-in in ``<ins>``, a cut in ``<del>`` holding the hidden text (not part of the prompt:
  drop the ``<del>`` elements and the prompt is exact), and a legend.  A character that a
  page's fonts may not draw (an emoji, an invisible joiner, U+FFFD) shows as its code point
  (:func:`visible_html`), in an ``<ins>`` that still holds the character.
* :func:`dialog_turn_prompts` picks one turn of one dialog of a run (the dialogs of
  :mod:`synclib.figures.dialogs`, whose ``prompts_section`` gives the page its sentence and HTML).
"""
from __future__ import annotations

import hashlib
import html
import re
import unicodedata
from dataclasses import dataclass, replace
from typing import Sequence

from synclib.tasks.prompts import masked_prompt, passive_persona

__all__ = ["VIEW_TITLES", "WHAT_LABELS", "ViewPrompt", "TurnPrompts", "turn_prompts", "dialog_turn_prompts",
           "render_html", "masked_sentence", "visible_html"]

#: the three prompts of a turn, in the page's order
VIEW_TITLES = {"active": "the speaker (active view)", "passive": "the passive reader (control 1)",
               "tom": "the Theory-of-Mind dialog (tom view)"}
#: what a masked part is (``PromptPart.what``)
WHAT_LABELS = {"bio": "the other agent's bio (the part this relationship hides, its secret included)",
               "goal": "the other agent's goal (and its extra information)",
               "other": "text meant for the other agent only",
               "environment": "text meant for the environment (the judge) only"}


@dataclass(frozen=True)
class ViewPrompt:
    """One view's prompt: ``parts`` (:class:`synclib.tasks.prompts.PromptPart`; ``None`` when this
    turn has no such prompt, ``note`` says why) and ``note`` (who reads it, what history)."""

    view: str
    parts: tuple | None
    note: str = ""

    @property
    def text(self) -> str | None:
        """The prompt exactly as :func:`synclib.tasks.prompts.render_prompt` returns it."""
        return None if self.parts is None else "".join(p.text for p in self.parts)

    @property
    def masked(self) -> tuple:
        """The parts the masking removed or replaced."""
        return () if self.parts is None else tuple(p for p in self.parts if p.kind != "shown")


@dataclass(frozen=True)
class TurnPrompts:
    """The three prompts of turn ``turn`` (agent ``agent`` speaks) of a dialog on task
    ``task_index`` with simulation seed ``sim_seed``; ``reader`` is the passive reader's
    persona (``None``: told it is the agent it replaces); ``source`` says where the turn comes
    from (a run's dialog, or an illustration)."""

    task_index: int
    codename: str
    names: tuple
    agent: int
    turn: int
    sim_seed: int
    reader: object
    views: tuple
    source: str = ""
    notes: tuple = ()

    def view(self, name: str) -> ViewPrompt:
        return next(v for v in self.views if v.view == name)


def turn_prompts(task, agent: int, history: Sequence[str], sim_seed: int, taskset=None, *,
                 tom_history: Sequence[str] | None = None, reader=None, source: str = "") -> TurnPrompts:
    """The speaker's, the passive reader's and the ToM dialog's prompts before utterance
    ``len(history)`` of ``task`` (agent ``agent`` speaks), with the masked parts located.

    Parameters
    ----------
    task : synclib.tasks.scenarios.Task
    agent : 0 (agent 1) or 1 (agent 2); ``len(history) % 2 == agent``
    history : the genuine dialog's utterances before this turn, as stored
    sim_seed : the simulation seed (the passive reader's draw)
    taskset : the task set (its personas); the reader is drawn from it when ``reader`` is None
    tom_history : the ToM dialog's utterances before this turn (``None``: the ToM prompt is
        shown only at turn 0, where both dialogs have no history)
    reader : Persona, or a persona id of ``taskset`` (the cube's ``passive_reader``); ``None``:
        :func:`synclib.tasks.prompts.passive_persona` ``(taskset, task.index, sim_seed)``, or the
        replaced agent itself without a task set (as the simulator does)
    """
    history = list(history)
    t = len(history)
    notes = []
    if isinstance(reader, str):
        reader = taskset.personas[reader]
    drawn = passive_persona(taskset, task.index, sim_seed) if taskset is not None else None
    if reader is None:
        reader = drawn
    elif drawn is not None:
        if drawn.pk != reader.pk:
            notes.append(f"The recorded reader {reader.name} is not the one drawn by passive_persona "
                         f"({drawn.name}).")
    me = task.names[agent]
    lines = f"utterances 0 to {t - 1}" if t > 1 else ("utterance 0" if t == 1 else "no utterance yet")
    views = [ViewPrompt("active", masked_prompt(task, agent, history, "active"),
                        f"{me} (agent {agent + 1}) reads this before speaking at turn {t}: its intro, the dialog "
                        f"so far ({lines}) and the open line it completes.")]
    who = reader.name if reader is not None else me
    views.append(ViewPrompt("passive", masked_prompt(task, agent, history, "passive", reader),
                            f"The passive reader, told it is {who}, reads the same dialog ({lines}) as a third "
                            f"party, without the open line; it replaces {me} (agent {agent + 1}) and sees the "
                            f"task as {me} does, the other agent's profile masked."))
    if tom_history is None and t == 0:
        tom_history = []
    if tom_history is None or len(tom_history) != t:
        views.append(ViewPrompt("tom", None, f"The ToM dialog has no turn {t} here."))
    else:
        views.append(ViewPrompt("tom", masked_prompt(task, agent, list(tom_history), "tom"),
                                f"In the ToM run (a separate dialog on the same task and seed) {me} reads this "
                                f"before its turn {t}: the intro, the emotion / action instruction, that dialog's "
                                f"own utterances (the other agent's emotion and action words stripped) and the "
                                f"open line."))
    return TurnPrompts(task_index=int(task.index), codename=task.codename, names=tuple(task.names), agent=agent,
                       turn=t, sim_seed=int(sim_seed), reader=reader, views=tuple(views), source=source,
                       notes=tuple(notes))


def _pick_turn(d, turn: int | None) -> int | None:
    n = d.genuine.n_utterances
    n_tom = d.tom.n_utterances if d.tom is not None else None
    candidates = [turn] if turn is not None else [3, 2, 1, 0]
    for t in candidates:
        if 0 <= t < n and (n_tom is None or t < n_tom):
            return t
    return None


def dialog_turn_prompts(found, tasks, *, run: str | None = None, episode: int | None = None,
                        seed: int | None = None, turn: int | None = None) -> TurnPrompts | None:
    """The three prompts of one turn of one dialog of ``found`` (:class:`synclib.figures.dialogs.DialogSet`).

    ``tasks`` is the run's task set (:func:`synclib.figures.dialogs.load_run_tasks`). Without a
    choice: the first dialog (cube order) whose task texts matched, preferring one that the
    passive reader re-read and that has a ToM dialog, at turn 3 (else 2, 1, 0: the latest
    that both dialogs reached). ``None`` when no dialog fits.
    """
    if tasks is None:
        return None
    by_index = {int(t.index): t for t in tasks}
    fits = [d for d in found.dialogs
            if d.goals is not None and d.task_index in by_index and tuple(by_index[d.task_index].names) == d.names
            and (run is None or d.run == run) and (episode is None or d.episode == episode)
            and (seed is None or d.sim_seed == seed) and _pick_turn(d, turn) is not None]
    if not fits:
        return None
    fits.sort(key=lambda d: (not d.passive_reader_id, d.tom is None))
    d = fits[0]
    t = _pick_turn(d, turn)
    history = [x.text for x in d.genuine.turns[:t]]
    tom = [x.text for x in d.tom.turns[:t]] if d.tom is not None else None
    reader = d.passive_reader_id if d.passive_reader_id in getattr(tasks, "personas", {}) else None
    out = turn_prompts(by_index[d.task_index], t % 2, history, d.sim_seed, tasks, tom_history=tom, reader=reader,
                       source=(f"run {d.run} (agent 1 {d.model_a}, agent 2 {d.model_b}), episode {d.episode}"
                               f"{' (' + d.codename + ')' if d.codename else ''}, seed {d.sim_seed}, turn {t}"))
    if not d.passive_reader_id:
        notes = out.notes + ("This dialog was not re-read by a passive reader in the run (its seed is not among "
                             "the passive seeds); the passive prompt shown is the one the drawn reader would read.",)
        out = replace(out, notes=notes)
    return out


# --------------------------------------------------------------------------- HTML
_CSS = """
#{id}{max-width:100%;box-sizing:border-box;overflow-wrap:anywhere;word-break:break-word;font-size:0.95em;line-height:1.45}
#{id} *{box-sizing:border-box;max-width:100%}
#{id} details.spv-view{border:1px solid rgba(128,128,128,0.45);border-radius:4px;margin:0.35em 0;padding:0.2em 0.6em}
#{id} details.spv-view>summary{cursor:pointer;font-weight:600}
#{id} .spv-note{font-size:0.9em;opacity:0.85;margin:0.3em 0}
#{id} .spv-text{white-space:pre-wrap;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:0.85em;
margin:0.3em 0;padding:0.4em 0.5em;background:rgba(128,128,128,0.08);border-radius:3px}
#{id} ins.spv-rep{text-decoration:none;background:rgba(255,191,0,0.35);border-bottom:2px solid rgba(200,140,0,0.9);
padding:0 0.1em}
#{id} del.spv-cut{text-decoration:none;font-family:inherit;font-style:italic;opacity:0.8;
background:rgba(214,39,40,0.08);border:1px dashed rgba(214,39,40,0.75);border-radius:3px;padding:0 0.25em;margin:0 0.1em}
#{id} .spv-tag{font-style:normal;font-weight:600;font-size:0.85em;color:rgb(170,30,30)}
#{id} .synclib-cp{text-decoration:none;font-size:0}
#{id} .synclib-cp::before{content:attr(data-cp);font-size:0.72rem;font-style:normal;padding:0 0.2em;margin:0 0.05em;
border:1px solid rgba(128,128,128,0.7);border-radius:3px}
"""


def _e(x) -> str:
    return html.escape(str(x), quote=True)


#: candidates for :func:`visible_html` (everything outside printable ASCII; the test is :func:`_by_code`)
_UNUSUAL = re.compile(r"[^\x20-\x7e\n\t]")


def _by_code(ch: str) -> bool:
    """Whether a page shows ``ch`` by its code point: characters beyond the Basic Multilingual
    Plane (emoji: fonts often lack them, and the prompt's monospace font drew them as boxes),
    U+FFFD (decoded from a token that ends inside a character), variation selectors, and
    control, format (zero-width joiner), private-use and unassigned characters."""
    o = ord(ch)
    return (o > 0xFFFF or o == 0xFFFD or 0xFE00 <= o <= 0xFE0F
            or unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cn", "Cs"))


def visible_html(text, tag: str = "span", classes: str = "synclib-cp") -> str:
    """``text`` HTML-escaped, each character of :func:`_by_code` wrapped in ``<tag class=classes
    data-cp="U+1F469" title="U+1F469 WOMAN">`` around the character itself: the book's CSS
    (and :func:`render_html`'s) shows the code point and hides the glyph, so nothing is drawn
    as an empty box, while the text (copied, or read from the page) stays exact."""
    def one(m):
        ch = m.group(0)
        if not _by_code(ch):
            return ch
        cp = f"U+{ord(ch):04X}"
        name = unicodedata.name(ch, "")
        return (f'<{tag} class="{classes}" data-cp="{cp}" title="{_e((cp + " " + name).strip())}">'
                f"{ch}</{tag}>")

    return _UNUSUAL.sub(one, _e(text))


def _text(x) -> str:
    """Prompt text: escaped, unusual characters by their code point in an ``<ins>`` (unwrapping
    the ``<ins>`` tags gives the text back, :func:`render_html`)."""
    return visible_html(x, tag="ins", classes="spv-cp synclib-cp")


def _part_html(p) -> str:
    label = WHAT_LABELS.get(p.what, p.what or "hidden text")
    cut = (f'<del class="spv-cut" data-what="{_e(p.what)}" title="not in the prompt: {_e(label)}">'
           f'<span class="spv-tag">[not shown: {_e(p.what or "hidden")}]</span> {_e(p.hidden)}</del>')
    if p.kind == "replaced":
        return (f'<ins class="spv-rep" data-what="{_e(p.what)}" title="stands for {_e(label)}">{_text(p.text)}</ins>'
                + cut)
    if p.kind == "removed":
        return cut
    return _text(p.text)


def _view_html(v: ViewPrompt, number: int) -> str:
    title = f"{number}. {VIEW_TITLES[v.view]}"
    if v.parts is None:
        return (f'<details class="spv-view" data-view="{v.view}"><summary>{_e(title)}: not available</summary>'
                f'<p class="spv-note">{_e(v.note)}</p></details>')
    n = len(v.masked)
    summary = (f"{title}: {len(v.text)} characters, {n} masked part{'s' if n != 1 else ''} marked")
    return (f'<details class="spv-view" data-view="{v.view}" open><summary>{_e(summary)}</summary>'
            f'<p class="spv-note">{_e(v.note)}</p>'
            f'<div class="spv-text">{"".join(_part_html(p) for p in v.parts)}</div></details>')


def render_html(tp: TurnPrompts, element_id: str | None = None) -> str:
    """The three prompts of ``tp`` as one self-contained HTML fragment (module docstring).

    Each prompt is HTML-escaped and verbatim (``white-space: pre-wrap``); removing every
    ``<del class="spv-cut">…</del>`` and unwrapping the ``<ins>`` tags gives the prompt's text
    exactly. No script and no external reference; ``element_id`` (default: from the content)
    scopes the inline CSS.
    """
    body = [_view_html(v, i + 1) for i, v in enumerate(tp.views)]
    if element_id is None:
        element_id = "spv-" + hashlib.sha1("\n".join(body).encode()).hexdigest()[:10]
    eid = _e(element_id)
    legend = ('<p class="spv-note"><b>Legend.</b> Each box is the user message exactly as the model reads it '
              '(before its chat template). <ins class="spv-rep">Unknown</ins>: text the masking put in place '
              'of hidden text; <del class="spv-cut"><span class="spv-tag">[not shown: …]</span> text</del>: '
              'what the masking removed or replaced, shown here for you only: it is <i>not</i> part of the '
              'prompt. The marks come from the masking itself (synclib.tasks.prompts.masked_prompt).</p>')
    head = (f'<p class="spv-note"><b>{_e(tp.source or "One turn")}.</b> Task {tp.task_index}'
            f'{" (" + _e(tp.codename) + ")" if tp.codename else ""}: agent 1 {_e(tp.names[0])}, agent 2 '
            f'{_e(tp.names[1])}; {_e(tp.names[tp.agent])} speaks at turn {tp.turn}; simulation seed '
            f'{tp.sim_seed}; passive reader: '
            f'{_e(tp.reader.name + " (" + tp.reader.pk + ")") if tp.reader is not None else "the agent itself"}.</p>')
    notes = "".join(f'<p class="spv-note">{_e(n)}</p>' for n in tp.notes)
    return (f'<div class="spv" id="{eid}"><style>{_CSS.replace("{id}", element_id)}</style>'
            + head + legend + notes + "".join(body) + "</div>")


def masked_sentence(tp: TurnPrompts) -> str:
    """The sentence saying what the masking hides from the speaker in ``tp``."""
    v = tp.view("active")
    whats = list(dict.fromkeys(p.what for p in v.masked))
    hidden = "; ".join(WHAT_LABELS.get(w, w) for w in whats) or "nothing"
    return (f"In every view the masking hides from {tp.names[tp.agent]} {hidden}: "
            f"{len(v.masked)} marked part{'s' if len(v.masked) != 1 else ''} in the speaker's prompt.")
