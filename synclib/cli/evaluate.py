"""``synclib evaluate``: judge a cube's dialogs, or a file of finished episodes, and write
``SOURCE.judge.csv`` (:func:`synclib.judge.evaluate_cube`, :func:`synclib.judge.evaluate_episodes`).

An option that sets a ``judge.*`` key is read and checked by that key's rule
(:func:`synclib.argtypes.setting`) and defaults to the key's default; the options a run
config lacks default to :mod:`synclib.judge.options`'s.  The options become a
:class:`~synclib.judge.options.JudgeOptions` through the mapping the pipeline's judge step
uses (:meth:`~synclib.judge.options.JudgeOptions.from_config`).
"""
from __future__ import annotations

import argparse

from synclib import argtypes as at
from synclib.judge.errors import JudgeError
from synclib.judge.evaluate import evaluate_cube, evaluate_episodes
from synclib.judge.options import LOCAL_MAX_NEW_TOKENS, JudgeConnection, JudgeOptions, JudgeSampling
from synclib.keys import default

__all__ = ["configure_parser", "run"]


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
    parser.add_argument("--api-key-env", default=default("judge.api_key_env"),
                        help="environment variable holding the API key (default "
                             "OPENAI_API_KEY; unset means no key is sent). The key itself is "
                             "never written anywhere")
    parser.add_argument("--concurrency", type=at.setting("judge.concurrency"), metavar="N",
                        default=default("judge.concurrency"),
                        help="requests in flight at once (HTTP judge; default %(default)s)")
    parser.add_argument("--timeout", type=at.arg_type(at.positive_float, "seconds"),
                        default=JudgeConnection.timeout,
                        help="seconds to wait to connect and for each read (default %(default)g)")
    parser.add_argument("--max-retries", type=at.arg_type(at.nonneg_int, "retries"),
                        default=JudgeConnection.max_retries,
                        help="retries on 429/5xx/timeouts/dropped connections, with "
                             "exponential backoff (default %(default)s)")
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
    parser.add_argument("--seed", type=at.arg_type(at.nonneg_int, "seed"), default=JudgeSampling.seed,
                        help="judge seed (default %(default)s)")
    parser.add_argument("--max-tokens", type=at.arg_type(at.positive_int, "token count"),
                        default=JudgeSampling.max_tokens,
                        help=f"answer length limit (HTTP default: the server's; local: {LOCAL_MAX_NEW_TOKENS})")
    parser.add_argument("--batch-size", type=at.arg_type(at.positive_int, "batch size"),
                        default=JudgeOptions.batch_size,
                        help="rows per forward pass in constrained scoring (default %(default)s)")
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
    """``synclib evaluate``: judge a cube or an episodes file and write ``SOURCE.judge.csv``."""
    # the options named as the run config's keys, mapped as the pipeline maps a run config;
    # the options the run config lacks override the defaults
    cfg = {"scenarios": args.scenarios, "device": args.device, "judge": {
        "model": args.judge_model, "url": at.value_of(args.judge_url), "api_key_env": args.api_key_env,
        "mode": at.value_of(args.mode), "layout": args.layout, "structured": args.structured,
        "reasoning_max_chars": args.reasoning_max_chars, "concurrency": args.concurrency,
        "sample": at.value_of(args.sample), "sample_seed": args.sample_seed}}
    outputs = dict(out=args.out, cache=args.cache, progress=not args.no_progress)
    try:
        options = JudgeOptions.from_config(cfg, timeout=args.timeout, max_retries=args.max_retries,
                                           seed=args.seed, max_tokens=args.max_tokens,
                                           batch_size=args.batch_size)
        if str(args.source).endswith((".jsonl", ".json")):
            evaluate_episodes(args.source, options, **outputs)
        else:
            evaluate_cube(args.source, options, **outputs)
    except JudgeError as exc:
        raise SystemExit(f"synclib evaluate: {exc}") from None
    return 0
