"""Measured: judges held against the published human Sotopia-eval ratings (table 4, figure 10).

The ratings are Sotopia-π's (Wang et al., 2024), fetched by ``synclib fetch sotopia-human``
(pinned commits, SHA-256 checked; :mod:`synclib.judge.sotopia_human`).  For every judge
given, per Sotopia-eval dimension: Pearson r between the judge's score and the annotators'
mean, its p-value and n, and the share of scores within one standard deviation of the human
ratings (:mod:`synclib.judge.human`).

Each judge is measured on the episodes it can be measured on, and the JSON says which
(``episode_set``: the rule, the count, and the left-out episodes with their reasons):

* GPT-4's published scores (always): every rated episode with a published GPT-4 score,
  i.e. all GPT-4 episodes.  Comparing two published score sets needs no dialog, so the
  GPT-4 episode whose dialog the study's files lack counts too.
* With ``--local-judge`` (e.g. ``smollm2-135m``): a local model in constrained mode judges
  the GPT-4 episodes whose dialog the files hold (it must read the dialog), one fewer.  A
  few seconds a dialog on 2 CPU cores; the answers are cached, so a re-run asks nothing again.

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


#: which episodes each judge is measured on, and why (the JSON's ``episode_set.rule``)
PUBLISHED_RULE = ("every rated episode with a published GPT-4 score (the GPT-4 episodes); comparing two "
                  "published score sets needs no dialog, so an episode whose dialog the study's files lack "
                  "counts too")
JUDGED_RULE = ("the GPT-4 episodes (those GPT-4's published scores cover, so both judges face the same "
               "task) whose dialog the study's files hold: a judge run here must read the dialog")
#: why the local judge was not run on a rated episode with a dialog
NOT_JUDGED = "not a GPT-4 episode (judged here are the episodes GPT-4's published scores cover)"


def measure(judge_table, ratings_path, rule: str, not_judged: str = "not in the judge's table") -> dict:
    """Agreement of one judge table with the ratings: per-dimension rows, the 1-SD share,
    and the episodes it rests on (``rule`` says which and why; the left-out ones with reasons)."""
    from synclib.judge.human import (agreement, differences, episode_coverage, paired_scores, read_ratings,
                                     within_share)

    judged = judge_table[judge_table["score"].notna()]
    human = read_ratings(ratings_path)  # every line checked; paired_scores keeps the episodes judged
    paired = paired_scores(judged, human)
    coverage = episode_coverage(judge_table, human, not_judged=not_judged)
    assert coverage["episodes"] == paired["episode_id"].nunique()
    agree = agreement(paired)
    diffs = differences(paired)
    return {"judge": ", ".join(sorted(set(judged["judge"]))),
            "episodes": int(paired["episode_id"].nunique()),
            "episode_set": {"rule": rule, **coverage},
            "scores": int(len(paired)),
            "raters_per_score": float(paired["n_raters"].mean()),
            "within_one_sd": within_share(diffs),
            "dimensions": [{"dimension": r.dimension, "r": _finite(r.r), "p": _finite(r.p), "n": int(r.n),
                            "reason": r.reason} for r in agree.itertuples()],
            # figure 10's histogram: every score's judge - human difference (no ratings, no texts)
            "differences": [[r.dimension, round(float(r.difference), 3), bool(r.within)]
                            for r in diffs.itertuples()]}


def measure_all(root, judge=None, work=None) -> tuple[list[dict], dict]:
    """Every judge on the prepared ``sotopia-human`` folder ``root``: GPT-4's published
    scores, and ``judge`` (a function: episodes file -> judge table; None: none) on the
    GPT-4 episodes with a dialog, written to ``work`` (default ``root/bench``).

    Returns the judges' records and ``{judge name: dialogs it read}``.
    """
    from synclib.judge import read_table

    root = Path(root)
    gpt4 = read_table(root / "gpt-4.judge.csv")
    results = [measure(gpt4, root / "ratings.csv", PUBLISHED_RULE)]
    judged = {}
    if judge is not None:
        scored = set(gpt4.loc[gpt4["score"].notna(), "episode_id"].astype(str))
        work = Path(work or root / "bench")  # the judge's cache lives here: a re-run asks nothing again
        work.mkdir(parents=True, exist_ok=True)
        subset = work / "gpt4-episodes.jsonl"
        # episodes.jsonl holds the episodes with a dialog only: the scored ones without a dialog drop out here
        lines = [ln for ln in (root / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
                 if json.loads(ln)["episode_id"] in scored]
        subset.write_text("\n".join(lines) + "\n", encoding="utf-8")
        table = judge(subset)
        res = measure(table, root / "ratings.csv", JUDGED_RULE, not_judged=NOT_JUDGED)
        judged[res["judge"]] = len(lines)  # its time is bench_candidates.py's subject, not this one's
        results.append(res)
    return results, judged


def main(argv=None) -> int:
    from synclib.tasks import datasets
    from synclib.judge import JudgeConnection, JudgeOptions, evaluate_episodes

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=None, help="the cache root (default: synclib's)")
    ap.add_argument("--local-judge", default=None, help="also judge the GPT-4 episodes with this local model")
    ap.add_argument("--work", default=None, help="where the local judge's table and cache go "
                                                 "(default: a bench folder in the dataset's cache)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)

    root = datasets.path(datasets.SOTOPIA_HUMAN, download=True, cache=args.cache)
    judge = None
    if args.local_judge:
        def judge(subset: Path):
            # constrained mode (a local judge) asks one question per agent and dimension: no instructions file
            return evaluate_episodes(subset, JudgeOptions(JudgeConnection(args.local_judge)), progress=False,
                                     out=subset.with_name(f"gpt4-episodes.{args.local_judge}.judge.csv"),
                                     cache=subset.with_name(f"gpt4-episodes.{args.local_judge}.judge-cache.jsonl"))
    results, judged = measure_all(root, judge, args.work)
    import torch

    record = {
        "benchmark": "judge_human",
        "ratings": {"source": "Sotopia-π human evaluation (Wang et al., 2024), github.com/sotopia-lab/"
                              f"sotopia-pi@{datasets.SOTOPIA_PI_COMMIT[:7]}",
                    "gpt4_scores": f"github.com/sotopia-lab/sotopia@{datasets.SOTOPIA_SCORES_COMMIT[:7]}",
                    "rated_episodes": results[0]["episode_set"]["rated_episodes"],
                    "episodes": "per judge, in its episode_set: the rule, the count and the rated episodes "
                                "left out with their reasons"},
        "judges": results,
        "locally_judged_dialogs": judged,
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()},
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    for res in results:
        rs = ", ".join(f"{d['dimension']} " + (f"{d['r']:.2f}" if d["r"] is not None else "none")
                       for d in res["dimensions"])
        out = "; ".join(f"{x['n']} {x['reason']}" for x in res["episode_set"]["left_out"])
        print(f"{res['judge']}: {res['episodes']} of {res['episode_set']['rated_episodes']} rated episodes "
              f"(left out: {out}), {res['scores']} scores; r: {rs}; "
              f"within 1 SD {100 * res['within_one_sd']:.1f} %")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
