"""Digests of the reference code's own prompts, for synclib's prompt-parity test.

Runs the prompt-building functions of the paper's reference code
(``zzn-nzz/LM_neural_synchrony`` @ 49fe97e1e22b18061cae49aec14aba69a9ec0e8c: ``sot_env``,
``get_control_conditions``, ``LM_hf``, ``utils``), imported from a checkout with stub
modules for ``nnsight``, ``openai`` and ``nltk`` (nothing of them is used on this path) and a
fake model that returns fixed replies, on every task of a Sotopia task directory, and stores
SHA-256 digests of what they produce; no Sotopia text is written.

For each task:

* the dialog loop (``SotopiaEnv.reset`` / ``step``, with the reference's reply clean-up and
  leave check) over the fixed synthetic history :data:`HISTORY` (agent 1 at turns 0 and 2,
  agent 2 at turns 1 and 3): the active prompt of every turn (``env.prompts``);
* the passive view of every turn for persona seeds 0, 1, 2 (``utils.set_seed(seed)``, one
  ``random_sample_agents_from_pool_with_descriptions_standalone`` draw per task in task
  order, the prompts written and read back through the reference's CSV round trip
  (``load_prompts_from_csv``), then ``transform_prompt(..., another_read=True)``), and the
  drawn persona's position in ``agents.json``;
* every active and passive string wrapped by ``LM_hf.BaseLM.get_inst`` for
  ``Mistral-7B-Instruct-v0.2`` (``[INST]…[/INST]``) and ``Llama-3-8B-Instruct`` (the
  Llama-3 wrapper), the only two distinct wrappers of the paper's six models;
* the judge's complete intro (``env.complete_intro``) and its message
  ``complete_intro + "\\n".join(intended_dialog) + judge instructions``.

A few tasks (``edge``) are played again with raw replies that exercise the reply clean-up
(several ``": "``, several lines, edge whitespace, ``"\\r"``, an empty reply, a leave).

Output (JSON). A *record* is ``"<first 16 hex of sha256(utf-8)>:<length in characters>"``.
Per-task data is stored by column, element ``i`` for task ``i`` (``tasks``):

``active``
    the records of the active prompts by turn, space-separated;
``passive``
    per persona seed, the records of the passive prompts by turn, space-separated;
``persona``
    per persona seed, the drawn persona's position in ``agents.json``;
``wrapped``
    per synclib prompt format, 16 hex of sha256 over ``"\\0".join`` of the wrapped strings
    in the order: active turns, passive seed 0 turns, seed 1, seed 2;
``complete_intro``, ``judge``
    records;
``lines``
    for ``active`` and ``passive`` (seed 0): the lines (split on ``"\\n"``) of the last
    prompt of agent 1 and of agent 2 (space-separated), each line an index into the
    top-level ``lines`` table of line records, written as ``line_index_width`` hex digits
    and concatenated.

``edge`` holds our synthetic raw ``replies`` and, per task index, the same records plus
``dialog``: the records of the complete dialog lines ``Turn t: Name said:utterance``.

Regenerate (from the repository root; about 15 s on one core)::

    git clone https://github.com/zzn-nzz/LM_neural_synchrony /tmp/ref
    git -C /tmp/ref checkout 49fe97e1e22b18061cae49aec14aba69a9ec0e8c
    .venv/bin/synclib fetch sotopia        # prints the folder holding the paper's task files
    .venv/bin/python tools/reference_prompt_digests.py --reference /tmp/ref \\
        --tasks ~/.cache/synclib/sotopia --out tests/data/reference_prompt_digests.json

The reference needs Python >= 3.10, torch, transformers, numpy, pandas and pydantic (all in
synclib's environment). ``tests/test_scenarios.py`` compares synclib's rendering with the
file.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import os
import sys
import tempfile
import types
import warnings
from pathlib import Path

REFERENCE_REPO = "zzn-nzz/LM_neural_synchrony"
REFERENCE_COMMIT = "49fe97e1e22b18061cae49aec14aba69a9ec0e8c"

#: Clean synthetic utterances: no ": ", no newline, no edge whitespace, no leave word.
HISTORY = ("Hello there", "Hi", "Bye now", "ok")
#: Raw replies for the edge tasks (before the reference's strip); the episode stops after
#: the leave at index 9, so the last reply is never used.
EDGE_REPLIES = (
    "  Sure: I can help: you know\nsecond line",
    "Name:  two spaces",
    "trailing spaces  \nnext",
    "a\r\nb",
    "mid\rdle text",
    "tab\there: x",
    "",
    "Turn 7: Someone said: hi there",
    "   \n  x",
    "Thanks, I will leave",
    "never used",
)
PASSIVE_SEEDS = (0, 1, 2)
#: synclib prompt format -> a reference model name that selects it in ``get_inst``.
FORMAT_MODELS = {"reference_inst": "Mistral-7B-Instruct-v0.2",
                 "reference_llama3": "Llama-3-8B-Instruct"}
HEX = 16


def sha16(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HEX]


def record(text: str) -> str:
    return f"{sha16(text)}:{len(text)}"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ the reference

def _stub(name: str, **attrs) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


class _Unused:
    def __init__(self, *args, **kwargs):
        pass


def load_reference(checkout: Path) -> types.SimpleNamespace:
    """Import the reference's prompt code from ``checkout`` on CPU."""
    for name in ("sot_env", "get_control_conditions", "LM_hf", "utils"):
        if name in sys.modules:
            raise RuntimeError(f"a module named {name!r} is already imported")
    _stub("nnsight", LanguageModel=_Unused)
    _stub("openai", OpenAI=_Unused)
    _stub("nltk")
    _stub("nltk.translate")
    _stub("nltk.translate.bleu_score", sentence_bleu=lambda *a, **k: 0.0)
    sys.path.insert(0, str(checkout))
    warnings.filterwarnings("ignore")
    with contextlib.redirect_stdout(io.StringIO()):
        import get_control_conditions
        import LM_hf
        import sot_env
        import utils as ref_utils
    return types.SimpleNamespace(sot_env=sot_env, gcc=get_control_conditions, LM_hf=LM_hf,
                                 utils=ref_utils)


class _FakeModel:
    """Returns the queued replies as ``LM_hf.get_result_from_output`` would (stripped)."""

    def __init__(self):
        self.replies: list[str] = []

    def generate_response_and_get_state(self, prompt, max_new_tokens, layer, token=-1, **kw):
        import numpy as np

        reply = self.replies.pop(0).strip()
        return reply, reply, np.zeros((1, 1, 1)), np.zeros(0)


def make_env(ref, checkout: Path, tasks: Path, workdir: str):
    fake = _FakeModel()
    ref.sot_env.getLM = lambda *a, **k: fake
    cwd = os.getcwd()
    os.chdir(checkout)  # SotopiaEnv.__init__ reads model_paths.json from the CWD
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            env = ref.sot_env.SotopiaEnv("X_None_0", "X_None_0", max_turns=len(HISTORY),
                                         saving_dir_base=workdir, save_states=True,
                                         max_new_tokens=300, temperature=0.7, seed=0)
    finally:
        os.chdir(cwd)
    for attr, name in (("envs", "envs.json"), ("agent_profiles", "agents.json"),
                       ("env_agent_combos", "env_agent_combos.json")):
        with open(tasks / name, encoding="utf-8") as fh:
            setattr(env, attr, json.load(fh))
    return env, fake


def play(env, fake, episode: int, replies) -> tuple[list[str], list[str], str]:
    """(active prompts by turn, complete dialog lines, complete intro) of one episode."""
    fake.replies = list(replies)
    env.max_turns = len(replies)
    with contextlib.redirect_stdout(io.StringIO()):
        env.reset(env_id=episode)
        while not env.step():
            pass
    return list(env.prompts), list(env.intended_dialog), env.complete_intro


def csv_round_trip(ref, prompts: list[str], workdir: str) -> list[str]:
    """Write the prompts as ``sample_normal_agent.py`` 78-87 does, read them back with the
    reference's ``load_prompts_from_csv``."""
    path = os.path.join(workdir, "prompt_records.csv")
    with open(path, mode="w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["save_states"])
        for p in prompts:
            writer.writerow([p])
    return ref.gcc.load_prompts_from_csv(path)


def persona_draws(ref, tasks: Path, n: int, seed: int) -> list[dict]:
    """The passive reader's profiles as ``get_control_conditions.main`` draws them."""
    with contextlib.redirect_stdout(io.StringIO()):
        ref.utils.set_seed(seed)
        return [ref.sot_env.random_sample_agents_from_pool_with_descriptions_standalone(
            agents_file_path=str(tasks / "agents.json")) for _ in range(n)]


def get_inst(ref, fmt: str, text: str) -> str:
    return ref.LM_hf.BaseLM.get_inst(types.SimpleNamespace(model_name=FORMAT_MODELS[fmt]), text)


# ------------------------------------------------------------------ the digests

class LineTable:
    def __init__(self):
        self.index: dict[str, int] = {}

    def add(self, text: str) -> list[int]:
        out = []
        for line in text.split("\n"):
            out.append(self.index.setdefault(record(line), len(self.index)))
        return out


def task_entry(ref, env, fake, ep: int, replies, profiles: dict, agent_ids: list[str],
               schema: str, workdir: str, lines: LineTable | None):
    prompts, dialog, intro = play(env, fake, ep, replies)
    reread = csv_round_trip(ref, prompts, workdir)
    passive = {}
    for seed in PASSIVE_SEEDS:
        with contextlib.redirect_stdout(io.StringIO()):
            passive[seed] = [ref.gcc.transform_prompt(p, profiles[seed][ep], t % 2 + 1, True)
                             for t, p in enumerate(reread)]
    ordered = prompts + [s for seed in PASSIVE_SEEDS for s in passive[seed]]
    entry = {
        "active": [record(p) for p in prompts],
        "passive": [[record(p) for p in passive[seed]] for seed in PASSIVE_SEEDS],
        "persona": [agent_ids.index(profiles[seed][ep]["agent1_profile"]["agent_id"])
                    for seed in PASSIVE_SEEDS],
        "wrapped": {fmt: sha16("\0".join(get_inst(ref, fmt, s) for s in ordered))
                    for fmt in FORMAT_MODELS},
        "complete_intro": record(intro),
        "judge": record(intro + "\n".join(dialog) + schema),
    }
    if lines is not None:
        last = [max(t for t in range(len(prompts)) if t % 2 == a) for a in (0, 1)]
        entry["lines"] = {"active": [lines.add(prompts[t]) for t in last],
                          "passive": [lines.add(passive[PASSIVE_SEEDS[0]][t]) for t in last]}
    else:
        entry["dialog"] = [record(line) for line in dialog]
    return entry


def edge_tasks(tasks: Path) -> list[int]:
    """The first task of each relationship, of the mutual-friends source and of a scenario
    ending with a newline."""
    envs = json.loads((tasks / "envs.json").read_text(encoding="utf-8"))
    combos = json.loads((tasks / "env_agent_combos.json").read_text(encoding="utf-8"))
    picks: dict = {}
    for i, c in enumerate(combos):
        e = envs[c["env_id"]]
        for key in (("rel", e["relationship"]), ("src", e["source"] == "mutual_friends"),
                    ("nl", e["scenario"].endswith("\n"))):
            if key[0] == "rel" or key[1]:
                picks.setdefault(key, i)
    return sorted(set(picks.values()))


def build(checkout: Path, tasks: Path) -> dict:
    ref = load_reference(checkout)
    agents = json.loads((tasks / "agents.json").read_text(encoding="utf-8"))
    combos = json.loads((tasks / "env_agent_combos.json").read_text(encoding="utf-8"))
    agent_ids = list(agents)
    n = len(combos)
    schema_file = tasks / "judge_instructions.txt"
    if not schema_file.is_file():
        schema_file = checkout / "sotopia_utils" / "output_schema.txt"
    schema = schema_file.read_text(encoding="utf-8")
    profiles = {seed: persona_draws(ref, tasks, n, seed) for seed in PASSIVE_SEEDS}
    lines = LineTable()
    with tempfile.TemporaryDirectory() as workdir:
        env, fake = make_env(ref, checkout, tasks, workdir)
        entries = [task_entry(ref, env, fake, ep, HISTORY, profiles, agent_ids, schema,
                              workdir, lines) for ep in range(n)]
        edge = {str(ep): task_entry(ref, env, fake, ep, EDGE_REPLIES, profiles, agent_ids,
                                    schema, workdir, None) for ep in edge_tasks(tasks)}
    width = max(1, len(f"{len(lines.index) - 1:x}"))
    column = {
        "active": [" ".join(e["active"]) for e in entries],
        "passive": {str(seed): [" ".join(e["passive"][k]) for e in entries]
                    for k, seed in enumerate(PASSIVE_SEEDS)},
        "persona": {str(seed): [e["persona"][k] for e in entries]
                    for k, seed in enumerate(PASSIVE_SEEDS)},
        "wrapped": {fmt: [e["wrapped"][fmt] for e in entries] for fmt in FORMAT_MODELS},
        "complete_intro": [e["complete_intro"] for e in entries],
        "judge": [e["judge"] for e in entries],
        "lines": {view: [" ".join("".join(f"{i:0{width}x}" for i in idx)
                                  for idx in e["lines"][view]) for e in entries]
                  for view in ("active", "passive")},
    }
    return {
        "about": "Digests of the reference code's prompts; see tools/reference_prompt_digests.py",
        "reference": {"repository": REFERENCE_REPO, "commit": REFERENCE_COMMIT},
        "task_files": {name: file_sha256(tasks / name)
                       for name in ("envs.json", "agents.json", "env_agent_combos.json")},
        "judge_instructions": file_sha256(schema_file),
        "record": "first 16 hex digits of sha256(utf-8 text), ':', length in characters",
        "history": list(HISTORY),
        "passive_seeds": list(PASSIVE_SEEDS),
        "formats": {fmt: {"model_name": name,
                          "template_sha256": hashlib.sha256(
                              get_inst(ref, fmt, "{prompt}").encode("utf-8")).hexdigest()}
                    for fmt, name in FORMAT_MODELS.items()},
        "n_tasks": n,
        "tasks": column,
        "line_index_width": width,
        "lines": list(lines.index),
        "edge": {"replies": list(EDGE_REPLIES), "tasks": edge},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True, type=Path,
                        help="checkout of zzn-nzz/LM_neural_synchrony at commit " + REFERENCE_COMMIT)
    parser.add_argument("--tasks", required=True, type=Path,
                        help="Sotopia task directory (envs.json, agents.json, env_agent_combos.json)")
    parser.add_argument("--out", required=True, type=Path, help="output JSON file")
    args = parser.parse_args(argv)
    checkout, tasks = args.reference.resolve(), args.tasks.resolve()
    if not (checkout / "sot_env.py").is_file():
        parser.error(f"{checkout} is not a checkout of {REFERENCE_REPO} (no sot_env.py)")
    out = build(checkout, tasks)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=0, separators=(",", ":"))
        fh.write("\n")
    print(f"{args.out}: {out['n_tasks']} tasks, {len(out['lines'])} distinct lines, "
          f"{args.out.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
