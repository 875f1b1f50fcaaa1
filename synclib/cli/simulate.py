"""``synclib simulate``: two models play Sotopia tasks and fill an activation cube (:func:`synclib.simulate.simulate`).

An option that sets a ``simulate.*`` key is that key spelt as an option (``--max-new-tokens``); the settings go
to the option groups through ``synclib run``'s ``from_config``. Their defaults are the schema's, or
``--config``'s (without it, the passive reader and ToM dialogs are off unless asked for), so ``synclib simulate
--config C`` and ``synclib run --config C`` simulate alike.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from synclib.cli import argtypes as at
from synclib.cli import main as cli_main
from synclib.config import ConfigError, default, load_config
from synclib.keys import section_defaults
from synclib.cube import CubeError, check_passive_seeds, is_complete
from synclib.models import PROMPT_FORMATS, ModelNotFoundError
from synclib.simulate import Batching, Passes, RunOptions, Sampling, simulate
from synclib.tasks.scenarios import ScenarioError, load_tasks, select_tasks

__all__ = ["configure_parser", "run", "main"]

#: the simulate.* keys set by an option of their own: (key, metavar or None for on/off, help)
_KEYED = (
    ("seeds", "LIST", "simulation seeds, e.g. 0,1,2 or 0-4"),
    ("passive", None, "also record the passive reader on the genuine dialogs (control 1)"),
    ("passive_seeds", "LIST", "seeds the passive reader reads (null: all of --seeds; the paper: 0-2)"),
    ("passive_own", None, "with --passive: a second reader told it is the agent it replaces (ours)"),
    ("tom", None, "also run the Theory-of-Mind dialogs with emotion/action distributions"),
    ("tom_episodes", "N", "with --tom: the ToM dialogs for the first N of the simulated tasks only (null: all)"),
    ("scheduling", "turns|continuous", "turns: every dialog of a batch waits for the batch's longest reply; "
     "continuous: a dialog's next utterance joins the running batch as soon as its reply ends (same dialogs "
     "up to float rounding)"),
    ("max_new_tokens", "N", "maximum new tokens per utterance"),
    ("max_utterances", "N", "maximum utterances per episode, both agents"),
    ("temperature", "T", "sampling temperature, 0 = greedy"),
    ("top_k", "K|model|none", "sampling top-k: 'model' (the model's generation_config, else transformers' 50), "
     "none or an integer"),
    ("top_p", "P|model|none", "sampling top-p: 'model', none or a number in (0, 1]"),
    ("stop_at_first_line", None, "stop a reply at its first line, which is all that is kept "
     "(--no-stop-at-first-line: generate every reply to its end or --max-new-tokens)"),
    ("reply_end", "line|sentence", "a reply cut by --max-new-tokens: kept as generated (line, the reference) "
     "or cut back to its last complete sentence (sentence)"),
    ("units_per_part", "N", "episode x seed units played together and written as one crash-safe part "
     "(null: 64 on CUDA, 8 on CPU; a resumed run keeps its own)"),
    ("max_rows", "N", "rows per forward pass of each model (null: --units-per-part); halved by a model that "
     "runs out of memory"),
    ("max_in_flight", "N", "--scheduling continuous: rows a model's decoding stream holds at once "
     "(null: every dialog of the part; with --kv-tokens, of the two parts in play)"),
    ("kv_tokens", "N", "--scheduling continuous: key/value tokens a model's decoding rows may reserve "
     "together, each its prompt and --max-new-tokens - 1 (null: no token limit)"),
    ("cache_gib", "GIB|auto", "memory the session caches of both models may hold, GiB (auto: on the CPU a "
     "quarter of the memory available, 0.25-4 GiB; on a GPU what the device can give beyond a tenth of its "
     "memory); sessions that do not fit are recomputed: the same dialogs, more time"),
    ("store_dtype", "float32|float16|bfloat16", "precision of the stored states: float32 (lossless), "
     "float16 / bfloat16 (mantissa rounded to 10 / 7 bits, float32 range; smaller files)"),
)
#: off without --config (the library's default), on in the run config's
_OPT_IN = ("passive", "tom")


def _shown(value) -> str:
    """A default as the option takes it: null, 0,1 for a list, the value."""
    if value is None:
        return "null"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value).lower() if isinstance(value, bool) \
        else str(value)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``synclib simulate``."""
    parser.add_argument("--model-a", required=True, metavar="NAME",
                        help="model playing agent 1: embedded name (smollm2-135m, gemma3-270m), "
                             "hub id, local directory or .gguf file")
    parser.add_argument("--model-b", metavar="NAME",
                        help="model playing agent 2 (default: the same as --model-a, loaded once)")
    parser.add_argument("--config", metavar="CONFIG",
                        help="run config (YAML) whose simulate.* settings to use, as the main job does "
                             "(default: the schema's defaults); the options below override its keys")
    parser.add_argument("--scenarios", default="embedded", metavar="DIR|sotopia|embedded",
                        help="Sotopia-format task directory (envs.json, agents.json, "
                             "env_agent_combos.json), 'sotopia' (the paper's tasks, fetched on first "
                             "use) or 'embedded' (default)")
    sel = parser.add_mutually_exclusive_group()
    sel.add_argument("--episodes", type=at.arg_type(at.positive_int, "episode count"), metavar="N",
                     help="simulate the first N tasks (default: --config's simulate.episodes, else all)")
    sel.add_argument("--tasks", type=at.arg_type(at.index_list, "task list"), metavar="LIST",
                     help="task indices to simulate, e.g. 0-39,45")
    parser.add_argument("--out", required=True, metavar="PATH.nc",
                        help="cube to write; an interrupted run's parts in PATH.nc.parts are resumed")
    for name, metavar, text in _KEYED:
        flag = "--" + name.replace("_", "-")
        shown = "off without --config" if name in _OPT_IN else _shown(default("simulate." + name))
        help_ = f"{text} (simulate.{name}; default {shown})".replace("%", "%%")
        if metavar is None:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            parser.add_argument(flag, type=at.setting("simulate." + name), metavar=metavar, help=help_)
    parser.add_argument("--device", metavar="DEV",
                        help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    parser.add_argument("--dtype", type=at.setting("dtype"), default=default("dtype"),
                        metavar="auto|float32|bfloat16|float16",
                        help="model weights dtype (default auto, as the run config's: bfloat16 on CUDA and on "
                             "CPUs with native bfloat16 matrix products, float32 elsewhere)")
    parser.add_argument("--prompt-format-a", choices=sorted(PROMPT_FORMATS), default="chat_template",
                        help="prompt format of model A (default: its tokenizer's chat template)")
    parser.add_argument("--prompt-format-b", choices=sorted(PROMPT_FORMATS),
                        help="prompt format of model B (default: as --prompt-format-a)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a finished cube at --out (default: leave it and exit)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def settings(args: argparse.Namespace) -> dict:
    """The ``simulate`` section this command runs with (see the module doc); raises
    :class:`~synclib.config.ConfigError` for a bad ``--config``."""
    if args.config:
        sim = dict(load_config(args.config)["simulate"])
    else:
        sim = section_defaults("simulate")["simulate"]
        sim.update({name: False for name in _OPT_IN})
    for name, _, _ in _KEYED:
        if getattr(args, name) is not None:
            sim[name] = at.value_of(getattr(args, name))
    return sim


def _fail(msg: str) -> int:
    print(f"synclib simulate: error: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run ``synclib simulate``; 0 on success, 2 on bad input."""
    out = Path(args.out)
    if out.suffix != ".nc":
        return _fail(f"--out: {args.out!r} must end in .nc")
    if not out.parent.exists():
        return _fail(f"--out: directory {str(out.parent)!r} does not exist")
    if args.device is not None:
        import torch

        try:
            dev = torch.device(args.device)
        except (RuntimeError, ValueError) as exc:
            return _fail(f"--device: {exc}")
        if dev.type == "cuda" and not torch.cuda.is_available():
            return _fail(f"--device: {args.device!r} requested but CUDA is not available")
    try:
        taskset = load_tasks(args.scenarios)
    except ScenarioError as exc:
        return _fail(f"--scenarios: {exc}")
    except FileNotFoundError as exc:
        return _fail(f"--scenarios: {exc}")
    try:
        sim = settings(args)
    except ConfigError as exc:
        return _fail(f"--config: {exc}")
    n = len(taskset)
    if args.tasks is not None:
        bad = [i for i in args.tasks if i >= n]
        if bad:
            return _fail(f"--tasks: index {bad[0]} out of range; {args.scenarios} has {n} tasks (0-{n - 1})")
        tasks = [taskset[i] for i in args.tasks]
    elif args.episodes is not None:
        if args.episodes > n:
            return _fail(f"--episodes: {args.episodes} requested but {args.scenarios} has only {n} tasks")
        tasks = [taskset[i] for i in range(args.episodes)]
    elif args.config:
        try:
            tasks = select_tasks(taskset, sim["episodes"])
        except (ScenarioError, ValueError) as exc:
            return _fail(f"--config: simulate.episodes: {exc}")
    else:
        tasks = list(taskset)
    try:
        check_passive_seeds(sim["passive_seeds"], sim["seeds"])
    except ValueError as exc:
        return _fail(f"--passive-seeds: {exc} (--seeds)")
    if is_complete(out) and not args.overwrite:
        print(f"{out} is already a finished cube; nothing to do (use --overwrite to redo it)",
              file=sys.stderr)
        return 0
    cfg = {"simulate": sim}
    try:
        path = simulate(
            args.model_a, args.model_b or args.model_a, tasks, sim["seeds"], out, max_utterances=sim["max_utterances"],
            sampling=Sampling.from_config(cfg), passes=Passes.from_config(cfg, taskset=taskset),
            batching=Batching.from_config(cfg),
            options=RunOptions.from_config(cfg, device=args.device, dtype=args.dtype, overwrite=args.overwrite,
                                           progress=not args.no_progress,
                                           prompt_formats=(args.prompt_format_a,
                                                           args.prompt_format_b or args.prompt_format_a)))
    except CubeError as exc:
        return _fail(str(exc))
    except Exception as exc:  # model loading problems carry their own clear message
        if isinstance(exc, ModelNotFoundError):
            return _fail(f"--model-a/--model-b: {exc}")
        raise
    print(f"wrote {path}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m synclib.cli.simulate ...`` (same as ``synclib simulate ...``)."""
    return cli_main(["simulate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
