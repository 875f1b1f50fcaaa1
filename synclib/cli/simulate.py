"""``synclib simulate``: two models play Sotopia tasks and fill an activation cube
(:func:`synclib.simulate.simulate`).

The options' defaults are the run-config schema's (:func:`synclib.config.default`), so
``synclib simulate`` and ``synclib run`` simulate alike.  ``python -m synclib.cli.simulate
...`` is the same as ``synclib simulate ...``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from synclib import argtypes as at
from synclib.cli import main as cli_main
from synclib.config import default
from synclib.cube import STORE_DTYPES, CubeError, is_complete
from synclib.engine import SCHEDULING
from synclib.models import PROMPT_FORMATS, ModelNotFoundError
from synclib.simulate import Batching, Passes, RunOptions, Sampling, simulate
from synclib.tasks.scenarios import ScenarioError, load_tasks

__all__ = ["configure_parser", "run", "main"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``synclib simulate``."""
    parser.add_argument("--model-a", required=True, metavar="NAME",
                        help="model playing agent 1: embedded name (smollm2-135m, gemma3-270m), "
                             "hub id, local directory or .gguf file")
    parser.add_argument("--model-b", metavar="NAME",
                        help="model playing agent 2 (default: the same as --model-a, loaded once)")
    parser.add_argument("--scenarios", default="embedded", metavar="DIR|sotopia|embedded",
                        help="Sotopia-format task directory (envs.json, agents.json, "
                             "env_agent_combos.json), 'sotopia' (the paper's tasks, fetched on first "
                             "use) or 'embedded' (default)")
    sel = parser.add_mutually_exclusive_group()
    sel.add_argument("--episodes", type=at.arg_type(at.positive_int, "episode count"), metavar="N",
                     help="simulate the first N tasks (default: all)")
    sel.add_argument("--tasks", type=at.arg_type(at.index_list, "task list"), metavar="LIST",
                     help="task indices to simulate, e.g. 0-39,45")
    parser.add_argument("--seeds", type=at.arg_type(at.seed_list, "seed list"), default=default("simulate.seeds"),
                        metavar="LIST", help="simulation seeds, e.g. 0,1,2 or 0-4 (default: %(default)s)")
    parser.add_argument("--out", required=True, metavar="PATH.nc",
                        help="cube to write; an interrupted run's parts in PATH.nc.parts are resumed")
    parser.add_argument("--passive", action="store_true",
                        help="also record the passive reader on the genuine dialogs (control 1)")
    parser.add_argument("--tom", action="store_true",
                        help="also run the Theory-of-Mind dialogs with emotion/action distributions")
    parser.add_argument("--tom-episodes", type=at.arg_type(at.positive_int, "episode count"), metavar="N",
                        help="with --tom: the ToM dialogs for the first N of the simulated tasks only "
                             "(default: all)")
    parser.add_argument("--scheduling", choices=SCHEDULING, default="turns",
                        help="turns: every dialog of a batch waits for the batch's longest reply; "
                             "continuous: a dialog's next utterance joins the running batch as soon as "
                             "its reply ends (same dialogs up to float rounding; default turns)")
    parser.add_argument("--max-new-tokens", type=at.arg_type(at.positive_int, "token count"),
                        default=default("simulate.max_new_tokens"), metavar="N",
                        help="maximum new tokens per utterance (default %(default)s)")
    parser.add_argument("--max-utterances", type=at.arg_type(at.positive_int, "utterance count"),
                        default=default("simulate.max_utterances"), metavar="N",
                        help="maximum utterances per episode, both agents (default %(default)s)")
    parser.add_argument("--temperature", type=at.arg_type(at.nonneg_float, "temperature"),
                        default=default("simulate.temperature"), metavar="T",
                        help="sampling temperature, 0 = greedy (default %(default)s)")
    parser.add_argument("--units-per-part", type=at.arg_type(at.positive_int, "unit count"), metavar="N",
                        help="episode x seed units played together and written as one crash-safe part "
                             "(default 64 on CUDA, 8 on CPU; a resumed run keeps its own)")
    parser.add_argument("--max-rows", type=at.arg_type(at.positive_int, "row count"), metavar="N",
                        help="rows per forward pass of each model (default: --units-per-part); halved by a "
                             "model that runs out of memory")
    parser.add_argument("--max-in-flight", type=at.arg_type(at.positive_int, "row count"), metavar="N",
                        help="--scheduling continuous: rows a model's decoding stream holds at once "
                             "(default: every dialog of the part; with --kv-tokens, of the two parts in play)")
    parser.add_argument("--kv-tokens", type=at.arg_type(at.positive_int, "token count"), metavar="N",
                        help="--scheduling continuous: key/value tokens a model's decoding rows may reserve "
                             "together, each its prompt and --max-new-tokens - 1 (default: no token limit)")
    parser.add_argument("--device", metavar="DEV",
                        help="torch device, e.g. cpu, cuda, cuda:1 (default: cuda if available)")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                        help="model weights dtype (default auto, as the run config's: bfloat16 on CUDA and on "
                             "CPUs with native bfloat16 matrix products, float32 elsewhere)")
    parser.add_argument("--store-dtype", choices=sorted(STORE_DTYPES), default="float32",
                        help="precision of the stored states: float32 (lossless, default), "
                             "float16 / bfloat16 (mantissa rounded to 10 / 7 bits, float32 range; "
                             "smaller files)")
    parser.add_argument("--top-k", type=at.arg_type(at.top_k, "top-k"), default=default("simulate.top_k"),
                        metavar="K|model|none", help="sampling top-k: 'model' (default: the model's "
                        "generation_config, else transformers' 50), 'none' or an integer")
    parser.add_argument("--top-p", type=at.arg_type(at.top_p, "top-p"), default=default("simulate.top_p"),
                        metavar="P|model|none", help="sampling top-p: 'model' (default), 'none' or a number in (0, 1]")
    parser.add_argument("--passive-seeds", type=at.arg_type(at.seed_list, "seed list"), metavar="LIST",
                        help="seeds the passive reader reads (default: all of --seeds; the paper: 0-2)")
    parser.add_argument("--prompt-format-a", choices=sorted(PROMPT_FORMATS), default="chat_template",
                        help="prompt format of model A (default: its tokenizer's chat template)")
    parser.add_argument("--prompt-format-b", choices=sorted(PROMPT_FORMATS),
                        help="prompt format of model B (default: as --prompt-format-a)")
    parser.add_argument("--no-first-line-stop", action="store_true",
                        help="generate every reply to its end (or --max-new-tokens) instead of stopping "
                             "at its first line, which is all that is kept")
    parser.add_argument("--cache-gib", type=at.arg_type(at.cache_gib, "cache size"), default="auto",
                        metavar="GIB|auto", help="memory the session caches of both models may hold, GiB "
                        "(default auto: on the CPU a quarter of the memory available, 0.25-4 GiB; on a GPU what the "
                        "device can give beyond a tenth of its memory); sessions that do not "
                        "fit are recomputed: the same dialogs, more time")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a finished cube at --out (default: leave it and exit)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


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
    else:
        tasks = list(taskset)
    if args.passive_seeds is not None:
        extra = sorted(set(args.passive_seeds) - set(args.seeds))
        if extra:
            return _fail(f"--passive-seeds: seed(s) {extra} are not among --seeds {args.seeds}")
    if is_complete(out) and not args.overwrite:
        print(f"{out} is already a finished cube; nothing to do (use --overwrite to redo it)",
              file=sys.stderr)
        return 0
    try:
        path = simulate(
            args.model_a, args.model_b or args.model_a, tasks, args.seeds, out, max_utterances=args.max_utterances,
            sampling=Sampling(temperature=args.temperature, max_new_tokens=args.max_new_tokens, top_k=args.top_k,
                              top_p=args.top_p, stop_at_first_line=not args.no_first_line_stop),
            passes=Passes(passive=args.passive, passive_seeds=args.passive_seeds, taskset=taskset, tom=args.tom,
                          tom_episodes=args.tom_episodes),
            batching=Batching(units_per_part=args.units_per_part, max_rows=args.max_rows,
                              max_in_flight=args.max_in_flight, kv_tokens=args.kv_tokens, scheduling=args.scheduling, cache_gib=args.cache_gib),
            options=RunOptions(device=args.device, dtype=args.dtype, store_dtype=args.store_dtype,
                               overwrite=args.overwrite, progress=not args.no_progress,
                               prompt_formats=(args.prompt_format_a, args.prompt_format_b or args.prompt_format_a)))
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
