"""``synclib evaluate``: judge a cube's dialogs, or a file of finished episodes, and write ``SOURCE.judge.csv``.

Each ``judge.*`` key is an option (``judge.max_tokens``: ``--max-tokens``; ``judge.model`` and ``judge.url``:
``--judge-model``, ``--judge-url``), with the key's default, mapped to
:class:`~synclib.judge.options.JudgeOptions` as the pipeline's judge step maps a run config.
"""
from __future__ import annotations

import argparse

from synclib.cli import argtypes as at
from synclib.judge.errors import JudgeError
from synclib.judge.evaluate import evaluate_cube, evaluate_episodes
from synclib.judge.options import LOCAL_MAX_NEW_TOKENS, JudgeOptions
from synclib.keys import KEYS, default, lookup

__all__ = ["configure_parser", "run"]

#: the judge.* keys, each an option; its dest where that is not the key's name
_KEYS = tuple(k.path.split(".", 1)[1] for k in KEYS if k.path.startswith("judge."))
_DEST = {"model": "judge_model", "url": "judge_url"}


def _keyed(parser: argparse.ArgumentParser, name: str, metavar: str) -> None:
    """The option of ``judge.<name>``: the key's rule, default and help."""
    path = "judge." + name
    parser.add_argument("--" + name.replace("_", "-"), type=at.setting(path), default=default(path),
                        metavar=metavar, help=f"{lookup(path).help} (default %(default)s)")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``synclib evaluate``."""
    parser.add_argument("source", metavar="CUBE_OR_EPISODES",
                        help="an activation cube (.nc) whose dialogs are judged, or a JSON-lines "
                             "file of finished episodes (.jsonl): Sotopia's episode export "
                             "(episodes_to_jsonl) or synclib's own {episode_id, scenario, agents: "
                             "[{name, background, goal}] x 2, utterances} (formats: the book's "
                             "page on table 4 and figure 10)")
    parser.add_argument("--scenarios", default=JudgeOptions.scenarios,
                        help="the task set the cube was simulated from: a Sotopia-format "
                             "directory, 'sotopia' (the paper's tasks, fetched on first use) or "
                             "'embedded' (default). A judge_instructions.txt "
                             "in the directory is appended to the prompt; otherwise "
                             "synclib's own instructions are. For an episodes file it only "
                             "chooses these instructions")
    parser.add_argument("--judge-model", required=True,
                        help="served model name at --judge-url, or, without --judge-url, a "
                             "local judge for synclib.models.load_model (e.g. smollm2-135m)")
    parser.add_argument("--judge-url", type=at.setting("judge.url"), default=None, metavar="URL",
                        help="base URL of an OpenAI-compatible API, e.g. "
                             "http://localhost:8000/v1 (requests go to URL/chat/completions)")
    parser.add_argument("--api-key-env", type=at.setting("judge.api_key_env"), default=default("judge.api_key_env"),
                        help="environment variable holding the API key (default "
                             "OPENAI_API_KEY; unset means no key is sent). The key itself is "
                             "never written anywhere")
    parser.add_argument("--concurrency", type=at.setting("judge.concurrency"), metavar="N",
                        default=default("judge.concurrency"),
                        help="requests in flight at once (HTTP judge; default %(default)s)")
    _keyed(parser, "timeout", "SECONDS")
    _keyed(parser, "max_retries", "N")
    parser.add_argument("--mode", type=at.setting("judge.mode"), default=None, metavar="json|constrained",
                        help="json: the judge writes the whole evaluation (default for "
                             "--judge-url); constrained: one agent and dimension at a time, "
                             "score read from the judge's distribution over the allowed "
                             "integers (local judges only; their default)")
    parser.add_argument("--layout", type=at.setting("judge.layout"), default=default("judge.layout"),
                        metavar="sotopia|reference",
                        help="the judge message: sotopia (Sotopia's quoted turn lines, default) or "
                             "reference (as the paper's code laid it out: its complete intro, the "
                             "agents' own dialog lines, the instructions, no separators)")
    parser.add_argument("--structured", dest="structured",
                        action=argparse.BooleanOptionalAction,
                        default=default("judge.structured"),
                        help="HTTP judge, json mode: ask the server for structured output "
                             "(response_format json_schema: one {reasoning, score} object per "
                             "dimension, bounded reasoning, scores within range; default), "
                             "falling back to plain JSON mode for the rest of the run when the "
                             "server refuses it. --no-structured: plain JSON mode throughout")
    parser.add_argument("--reasoning-max-chars", type=at.setting("judge.reasoning_max_chars"), metavar="N",
                        default=default("judge.reasoning_max_chars"),
                        help="with structured output, the longest reasoning per dimension, in "
                             "characters (1-1999; default %(default)s)")
    _keyed(parser, "seed", "SEED")
    parser.add_argument("--max-tokens", type=at.setting("judge.max_tokens"), default=default("judge.max_tokens"),
                        metavar="N", help=f"answer length limit (default: an HTTP judge sends none and the server's "
                                          f"own applies; a local judge in json mode stops at {LOCAL_MAX_NEW_TOKENS})")
    _keyed(parser, "batch_size", "N")
    parser.add_argument("--device", default=None, help="device of a local judge (default: auto)")
    parser.add_argument("--sample", type=at.setting("judge.sample"), default=default("judge.sample"), metavar="N",
                        help="judge a random sample of N dialogs (episode x sim seed; default: all)")
    parser.add_argument("--sample-seed", type=at.setting("judge.sample_seed"), default=default("judge.sample_seed"),
                        metavar="SEED", help="seed of the --sample draw (default %(default)s)")
    parser.add_argument("--out", default=None,
                        help="output CSV (default: the source with .judge.csv instead of .nc/.jsonl)")
    parser.add_argument("--cache", default=None,
                        help="answer cache, JSON lines (default: the source with .judge-cache.jsonl)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``synclib evaluate``."""
    cfg = {"scenarios": args.scenarios, "device": args.device,
           "judge": {name: at.value_of(getattr(args, _DEST.get(name, name))) for name in _KEYS}}
    outputs = dict(out=args.out, cache=args.cache, progress=not args.no_progress)
    try:
        options = JudgeOptions.from_config(cfg)
        if str(args.source).endswith((".jsonl", ".json")):
            evaluate_episodes(args.source, options, **outputs)
        else:
            evaluate_cube(args.source, options, **outputs)
    except JudgeError as exc:
        raise SystemExit(f"synclib evaluate: {exc}") from None
    return 0
