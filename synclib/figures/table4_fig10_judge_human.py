"""Table 4 and figure 10: the judge against human ratings (appendix H).

The notebook ``notebooks/table4_fig10_judge_human.md`` draws this page from the functions here:
:func:`setup` (the page reads no run), :func:`against_humans` (the judge given to the page
against the ratings given to it), table 4 (:func:`judge_human_table`), the judges the benchmark
measured on published ratings (:func:`measured_judge_table`, :func:`sentence_measured_judges`),
figure 10 (:func:`difference_histogram`) and :func:`sentence_judge_human`.
"""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from synclib import stats
from synclib.figures.charts import NEGATIVE_GREY, OTHER_COLOURS, need_columns, placeholder_if_empty, enable, placeholder
from synclib.figures.verdicts import CANNOT, Claim
from synclib.judge.human import (agreement, differences, episode_coverage, load_measured, measured_differences,
                                 paired_scores, read_ratings, within_share)
from synclib.judge.sotopia_human import GPT4_JUDGE
from synclib.judge.table import read_table
from synclib.figures.report import join_words, paper_note, readable
from synclib.models import EMBEDDED
from synclib.paths import in_repo
from synclib.stats import fmt as _f

__all__ = ["setup", "HumanComparison", "against_humans", "judge_human_table", "measured_judge_table",
           "sentence_measured_judges", "sentence_judge_human", "difference_histogram", "load_measured",
           "measured_differences", "placeholder", "readable", "judge", "CLAIMS"]


def setup() -> dict:
    """This page's first step (it reads no run): interactive charts on; the paper's published
    numbers (:func:`synclib.analysis.results.load_published`)."""
    # lazy: xarray (through synclib.analysis.results) only when the page runs, not with its claims
    from synclib.analysis.results import load_published

    enable()
    return load_published()


@dataclass
class HumanComparison:
    """The judge given to the page against the human ratings given to it (:func:`against_humans`)."""

    human: pd.DataFrame     #: the ratings, one row per episode, agent, dimension and rater
    paired: pd.DataFrame    #: both scores per agent and dimension (:func:`~synclib.judge.human.paired_scores`)
    agree: pd.DataFrame     #: table 4's r, p, n per dimension (:func:`~synclib.judge.human.agreement`)
    diffs: pd.DataFrame     #: figure 10's differences (:func:`~synclib.judge.human.differences`)
    share: float            #: the share within one standard deviation (:func:`~synclib.judge.human.within_share`)
    coverage: dict          #: which rated episodes it rests on (:func:`~synclib.judge.human.episode_coverage`)
    judge_name: str         #: the judge(s) of the judge table

    def sentence(self) -> str:
        """How many episodes, ratings and raters the comparison rests on (Markdown)."""
        h = self.human
        return (f"{h['episode_id'].nunique()} rated episodes, {len(h)} ratings from "
                f"{max(h['rater'].nunique(), 1)} rater label(s); {len(self.paired)} agent × "
                f"dimension scores, of {self.coverage['episodes']} episodes, have both a judge and a human score.")


def against_humans(ratings, judge_scores) -> HumanComparison | None:
    """The page's ``ratings`` (CSV of human ratings) against its ``judge_scores`` (the judge's
    table of the same episodes, ``synclib evaluate EPISODES.jsonl``), both relative to the
    repository root or absolute; None when neither is given.  Refuses one without the other."""
    if (ratings is None) != (judge_scores is None):
        raise ValueError("give both ratings and judge_scores, or neither")
    if ratings is None:
        return None
    table = read_table(in_repo(judge_scores))
    if "episode_id" not in table.columns:
        raise ValueError(f"judge_scores = {judge_scores!r} has no episode_id column: judge the "
                         "rated episodes file (synclib evaluate EPISODES.jsonl)")
    human = read_ratings(in_repo(ratings), episode_ids=set(table["episode_id"].astype(str)))
    paired = paired_scores(table, human)
    diffs = differences(paired)
    return HumanComparison(human=human, paired=paired, agree=agreement(paired), diffs=diffs,
                           share=within_share(diffs), coverage=episode_coverage(table, human),
                           judge_name=", ".join(sorted(set(table["judge"]))) or "the judge")


def judge_human_table(agree: pd.DataFrame | None, published: dict) -> pd.DataFrame:
    """Table 4 beside the paper's: per dimension our judge's r, p and n (when ``agree``,
    from :func:`synclib.judge.human.agreement`, is given) and the paper's two columns."""
    paper = pd.DataFrame(published["table4"]["rows"]).rename(
        columns={"gpt-4": "paper GPT-4 r", "gpt-oss-120b": "paper gpt-oss-120b r"})
    if agree is None:
        return paper
    return agree[["dimension", "r", "p", "n"]].merge(paper, on="dimension", how="left")


def _judge_label(judge: str) -> str:
    if judge == GPT4_JUDGE:
        return "GPT-4 (published scores)"
    return f"{judge} (tiny, embedded)" if judge in EMBEDDED else judge


def _episode_set_text(es: dict, rule: str | None = None) -> str:
    """Which rated episodes a judge's numbers rest on (an ``episode_set``, i.e.
    :func:`synclib.judge.human.episode_coverage`'s record, with its ``rule``), and why the
    others are left out; ids are named where a reason covers five or fewer.  Whole
    sentences, the first one open to the caller's start ("GPT-4 on ")."""
    def ids(x):
        return f": {', '.join(x)}" if len(x) <= 5 else ""

    rule = rule or es.get("rule")
    s = f"{es['episodes']} of the {es['rated_episodes']} rated episodes"
    if es.get("without_dialog"):
        s += f" ({len(es['without_dialog'])} of them without a dialog{ids(es['without_dialog'])})"
    s += "." + (f" Which and why: {rule}." if rule else "")
    left = [f"{x['n']}, reason: {x['reason']}{ids(x['episode_ids'])}" for x in es.get("left_out", [])]
    return s + (" Left out: " + "; ".join(left) + "." if left else " None left out.")


def measured_judge_table(measured: dict | None, published: dict) -> pd.DataFrame | None:
    """The judges measured on Sotopia-π's published ratings (``bench/bench_judge_human.py``'s
    JSON, :func:`synclib.judge.human.load_measured`): per dimension each judge's r, beside the
    paper's two columns (measured on other ratings).  None when nothing was measured."""
    if not measured:
        return None
    table = judge_human_table(None, published)
    for j in measured["judges"]:
        r = {d["dimension"]: np.nan if d["r"] is None else d["r"] for d in j["dimensions"]}
        table[f"{_judge_label(j['judge'])} r ({j['episodes']} episodes)"] = table["dimension"].map(r)
    return table


def sentence_measured_judges(measured: dict | None) -> str:
    """What the measured judges show, with where the numbers come from."""
    if not measured:
        return ("*Nothing measured on published ratings yet: `synclib fetch sotopia-human`, then "
                "`python bench/bench_judge_human.py [--local-judge smollm2-135m]`.*")
    parts = []
    for j in measured["judges"]:
        ok = [d for d in j["dimensions"] if d["r"] is not None and np.isfinite(d["r"])]
        best = max(ok, key=lambda d: d["r"]) if ok else None
        sig = [d["dimension"] for d in ok if d["p"] <= 0.01]
        none = [d for d in j["dimensions"] if d not in ok]
        gap = (f"; no r on {join_words([d['dimension'] for d in none])} ({none[0].get('reason') or 'undefined'})"
               if none else "")
        on = _episode_set_text(j["episode_set"]) if j.get("episode_set") else f"{j['episodes']} episodes."
        parts.append(f"**{_judge_label(j['judge'])}** on {on} Over these {j['episodes']} episodes, {j['scores']} "
                     f"agent × dimension scores: r from {min(d['r'] for d in ok):.2f} to {best['r']:.2f} ({best['dimension']}), "
                     f"p ≤ 0.01 on {len(sig)} of 7 dimensions ({join_words(sig) or 'none'}){gap}; "
                     f"{100 * j['within_one_sd']:.1f} % of its scores within one standard deviation of the "
                     "human ratings." if ok else
                     f"**{_judge_label(j['judge'])}** on {on} No dimension has a correlation.")

    tiny = [j for j in measured["judges"] if j["judge"] in EMBEDDED]
    note = (" The embedded judges are tiny models (135M / 270M parameters), measured here to show how far "
            "a judge that small is from people; the paper's judge is gpt-oss-120b." if tiny else "")
    return (f"Measured on {measured['ratings']['source']} ({measured['date']}, "
            "`bench/results/judge_human_sotopia_pi.json`): " + " ".join(parts) + note +
            " These are other episodes and other annotators than the paper's, so they test the judges "
            "the way appendix H does without being its numbers.")


def sentence_judge_human(agree: pd.DataFrame | None, share: float | None, n_scores: int,
                         judge: str, published: dict, coverage: dict | None = None) -> str:
    """What table 4 and figure 10 show for this judge, or what the page needs; ``coverage``
    (:func:`synclib.judge.human.episode_coverage`) says which rated episodes they rest on."""
    fig10 = published["fig10"]
    paper = paper_note(published["table4"], "r from 0.22 to 0.71 (GPT-4) and 0.22 to 0.60 "
                   f"(gpt-oss-120b) across dimensions; {fig10['text']} ({fig10['source']}).")
    if agree is None:
        return ("No human ratings were given to this run, so its judge is not held against people "
                "here; the table shows the paper's numbers. To fill it, judge rated episodes (`synclib "
                "fetch sotopia-human` gets published ones) with `synclib evaluate EPISODES.jsonl` and set "
                "`notebooks.human_ratings` and `notebooks.human_judge_scores` (or the notebook's `ratings` "
                "and `judge_scores` parameters).") + paper
    ok = agree[np.isfinite(agree["r"])]
    rs = "; ".join(f"{r.dimension} r = {r.r:.2f} (p = {stats.format_p(r.p)}, n = {r.n})" for r in ok.itertuples())
    missing = [f"{r.dimension} ({r.reason})" for r in agree.itertuples() if not np.isfinite(r.r)]
    s = f"{_judge_label(judge)} against the human raters' mean: {rs or 'no dimension has a correlation'}."
    if missing:
        s += " No r for " + join_words(missing) + "."
    if coverage is not None:
        s += " They rest on " + _episode_set_text(coverage, "those the judge's table scores")
    if share is not None and np.isfinite(share):
        s += (f" {100 * share:.1f} % of its {n_scores} scores lie within one standard deviation "
              f"of the human ratings (paper, {fig10['judge']}: {100 * fig10['within_one_sd']:.1f} %).")
    return s + paper


@placeholder_if_empty
def difference_histogram(frame: pd.DataFrame, title: str) -> alt.LayerChart:
    """Figure 10: histogram of judge minus human scores (``difference``, bins of 1), bars
    coloured by whether the difference lies within one standard deviation of the human
    ratings (``within``); a dashed rule marks 0.  ``frame`` is
    :func:`synclib.judge.human.differences`'s table."""
    need_columns(frame, ["difference", "within", "dimension"], "difference_histogram")
    data = frame.assign(within=np.where(frame["within"], "within 1 SD", "beyond 1 SD"))
    bars = alt.Chart(data).mark_bar(opacity=0.85).encode(
        x=alt.X("difference:Q", bin=alt.Bin(step=1), title="judge − human score"),
        y=alt.Y("count():Q", title="agent × dimension scores", stack=True),
        color=alt.Color("within:N", title=None,
                        scale=alt.Scale(domain=["within 1 SD", "beyond 1 SD"], range=[OTHER_COLOURS[0], NEGATIVE_GREY])),
        tooltip=[alt.Tooltip("within:N"), alt.Tooltip("count():Q", title="scores")])
    zero = alt.Chart(pd.DataFrame({"x": [0]})).mark_rule(color="black", strokeDash=[4, 3]).encode(x="x:Q")
    return alt.layer(bars, zero).properties(title=title, width=420, height=220)


def judge(res, published: dict) -> Claim:
    """Table 4 and figure 10: the paper's judge agrees with people."""
    what = "The paper's judge (gpt-oss-120b) agrees with human ratings (appendix H, table 4, figure 10)"
    measured = load_measured()
    text = "gpt-oss-120b is not run here"
    if measured:
        parts = []
        for j in measured["judges"]:
            rs = [d["r"] for d in j["dimensions"] if d["r"] is not None and np.isfinite(d["r"])]
            tiny = " (tiny, embedded)" if j["judge"] in EMBEDDED else ""
            parts.append(f"{j['judge']}{tiny}: r from {_f(min(rs))} to {_f(max(rs))} over {len(rs)} dimensions, "
                         f"{j['episodes']} episodes" if rs else f"{j['judge']}{tiny}: no correlation")
        text += ("; the benchmark measures other judges on Sotopia-π's published human ratings (the table 4 "
                 "page): " + "; ".join(parts))
    return Claim("table4", what, CANNOT, text + ".")


#: this page's claims of the paper: (function, data/published.json key)
CLAIMS = ((judge, "table4"), (judge, "fig10"),)
