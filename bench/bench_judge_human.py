"""Measured: judges held against the published human Sotopia-eval ratings (table 4, figure 10).

The ratings are Sotopia-π's (Wang et al., 2024), fetched by ``synclib fetch sotopia-human``
(pinned commits, SHA-256 checked; :mod:`synclib.judge.sotopia_human`).  For every judge
given, per Sotopia-eval dimension: Pearson r between the judge's score and the annotators'
mean, its p-value and n, and the share of scores within one standard deviation of the human
ratings (:mod:`synclib.judge.human`).  Always measured: GPT-4's published scores of the
GPT-4 episodes.  With ``--local-judge`` (e.g. ``smollm2-135m``) the same episodes are also
judged here by a local model in constrained mode (a few seconds a dialog on 2 CPU cores; the
answers are cached, so a re-run asks nothing again).

Written to ``bench/results/judge_human_sotopia_pi.json``; the table 4 / figure 10 page
quotes it.  Only derived statistics are written, never the ratings or the dialogs.

Usage::

    synclib fetch sotopia-human                      # once (or --from a folder you brought)
    python bench/bench_judge_human.py                # GPT-4's published scores only
    python bench/bench_judge_human.py --local-judge smollm2-135m
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUT = HERE / "results" / "judge_human_sotopia_pi.json"


def _finite(x):
    """JSON has no NaN: a missing value is null."""
    import math

    return float(x) if x is not None and math.isfinite(x) else None


def measure(judge_table, ratings_path) -> dict:
    """Agreement of one judge table with the ratings: per-dimension rows and the 1-SD share."""
    from synclib.judge import agreement, differences, paired_scores, read_ratings, within_share

    judged = judge_table[judge_table["score"].notna()]
    human = read_ratings(ratings_path)  # every line checked; then the episodes this judge scored
    human = human[human["episode_id"].isin(set(judged["episode_id"].astype(str)))]
    paired = paired_scores(judged, human)
    agree = agreement(paired)
    diffs = differences(paired)
    return {"judge": ", ".join(sorted(set(judged["judge"]))),
            "episodes": int(paired["episode_id"].nunique()),
            "scores": int(len(paired)),
            "raters_per_score": float(paired["n_raters"].mean()),
            "within_one_sd": within_share(diffs),
            "dimensions": [{"dimension": r.dimension, "r": _finite(r.r), "p": _finite(r.p), "n": int(r.n),
                            "reason": r.reason} for r in agree.itertuples()],
            # figure 10's histogram: every score's judge - human difference (no ratings, no texts)
            "differences": [[r.dimension, round(float(r.difference), 3), bool(r.within)]
                            for r in diffs.itertuples()]}


def main(argv=None) -> int:
    from synclib import datasets
    from synclib.judge import evaluate_episodes, read_table

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=None, help="the cache root (default: synclib's)")
    ap.add_argument("--local-judge", default=None, help="also judge the GPT-4 episodes with this local model")
    ap.add_argument("--work", default=None, help="where the local judge's table and cache go "
                                                 "(default: a bench folder in the dataset's cache)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)

    root = datasets.path(datasets.SOTOPIA_HUMAN, download=True, cache=args.cache)
    gpt4 = read_table(root / "gpt-4.judge.csv")
    results = [measure(gpt4, root / "ratings.csv")]
    judged = {}
    if args.local_judge:
        scored = set(gpt4.loc[gpt4["score"].notna(), "episode_id"].astype(str))
        work = Path(args.work or root / "bench")  # the judge's cache lives here: a re-run asks nothing again
        work.mkdir(parents=True, exist_ok=True)
        subset = work / "gpt4-episodes.jsonl"
        lines = [ln for ln in (root / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
                 if json.loads(ln)["episode_id"] in scored]
        subset.write_text("\n".join(lines) + "\n", encoding="utf-8")
        # constrained mode (a local judge) asks one question per agent and dimension: no instructions file
        table = evaluate_episodes(subset, judge_model=args.local_judge, progress=False,
                                  out=work / f"gpt4-episodes.{args.local_judge}.judge.csv",
                                  cache=work / f"gpt4-episodes.{args.local_judge}.judge-cache.jsonl")
        judged[args.local_judge] = len(lines)  # its time is bench_candidates.py's subject, not this one's
        results.append(measure(table, root / "ratings.csv"))
    import torch

    record = {
        "benchmark": "judge_human",
        "ratings": {"source": "Sotopia-π human evaluation (Wang et al., 2024), github.com/sotopia-lab/"
                              f"sotopia-pi@{datasets.SOTOPIA_PI_COMMIT[:7]}",
                    "gpt4_scores": f"github.com/sotopia-lab/sotopia@{datasets.SOTOPIA_SCORES_COMMIT[:7]}",
                    "episodes": "the GPT-4 episodes that GPT-4's published scores cover"},
        "judges": results,
        "locally_judged_dialogs": judged,
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    for res in results:
        rs = ", ".join(f"{d['dimension']} " + (f"{d['r']:.2f}" if d["r"] is not None else "none")
                       for d in res["dimensions"])
        print(f"{res['judge']}: {res['episodes']} episodes, {res['scores']} scores; r: {rs}; "
              f"within 1 SD {100 * res['within_one_sd']:.1f} %")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
