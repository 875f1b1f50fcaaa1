"""The first page's overview: three caveats, one chart and the scorecard of the paper's claims.

:func:`overview_markdown` writes ``book/_generated/overview.md``, which the book's first page
includes before everything else: three sentences of caveats worded from the run (its models, the
share of genuine SyncR² the passive reader keeps, its size and how many claims it cannot test),
the chart :func:`overview_chart` (genuine SyncR² and every control, per ordered run, with 95 %
intervals over resampled episodes; ``book/_generated/overview.png``, :func:`overview_png`) and
the scorecard (:func:`scorecard_table`): one row per claim of the paper, the paper's value from
``data/published.json`` beside this run's, the verdict and a link to the figure's page.  The
scorecard reads the same evaluation as the claims' lines (:func:`synclib.figures.verdicts.evaluate`
of :func:`synclib.figures.claims`): its numbers are the claims' :class:`~synclib.figures.verdicts.Measure`
and its verdicts theirs, so the two cannot disagree.  The pipeline's pages step writes both files
(:func:`synclib.run.pipeline.step_pages`).

The README's image is the same chart, regenerated with::

    python -m synclib.figures.scorecard --results results/embedded --out book/_static/overview.png
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd

from synclib.analysis import power
from synclib.figures import claims
from synclib.figures.charts import WRAPPED_LABEL, chart_png, colour_scale
from synclib.figures.fig09_sample_size import dataset_sizes
from synclib.figures.report import join_words, passive_share_value
from synclib.figures.verdicts import CANNOT, PAPER_PAIRS, Claim, evaluate, n_claim_tests, test_link

__all__ = ["PAPER_MODELS", "CONDITIONS", "overview_frame", "overview_chart", "overview_png",
           "paper_text", "scorecard_rows", "scorecard_table", "caveats", "overview_markdown", "main"]

#: the paper's models, as the scorecard's header names them (data/published.json, "models": three
#: Mistral-7B versions, Llama-2-7B, Llama-3-8B and Llama-3.2-3B)
PAPER_MODELS = "Mistral/Llama, 3-8B"
#: the chart's conditions in order, with their names on the axis (the surrogate partners come last)
CONDITIONS = {"genuine": "genuine", "passive": "passive reader", "shuffled": "shuffled", "lag1": "lag\u00a01",
              "lag2": "lag\u00a02", "pseudo": "pseudo-dyads", "surrogates": "surrogate partners"}
#: the chart's width in pixels for the README's image (the PNG is about 50 wider with its axis: about 800)
CHART_WIDTH = 740
#: the book's image: narrower (its text column is about 650 pixels wide) and drawn at twice the scale, sharp
BOOK_WIDTH, BOOK_SCALE = 600, 2.0


def _who(res) -> str:
    """This run, as a header and a caption name it."""
    if res.synthetic:
        return "synthetic test data"
    if res.embedded:
        return "embedded tiny models"
    return ", ".join(dict.fromkeys(m for r in res.runs for m in (r.model_a, r.model_b)))


# --------------------------------------------------------------------------- the chart
def overview_frame(res) -> pd.DataFrame:
    """Per ordered run and condition (:data:`CONDITIONS`, those the run has): the reported SyncR²
    (``mean``, over the run's directions) and its 95 % interval (``lo``, ``hi``) over resampled
    episodes (``sync_r2_boot``, the draws of the claims' bootstrap), ± its standard error over split
    seeds where the analysis has no resamples; for the surrogate partners their mean and their lowest
    to highest (:func:`synclib.analysis.power.surrogate_test`).  ``interval`` says which."""
    rows = []
    for r in res.runs:
        ds = res.analysis(r.name)
        conds = [str(c) for c in ds["condition"].values]
        for cond in (c for c in CONDITIONS if c in conds):
            if not np.isfinite(ds["sync_r2"].sel(condition=cond).to_numpy().astype(float)).any():
                continue  # too few samples to fit the maps: nothing to draw
            mean = float(np.nanmean(ds["sync_r2"].sel(condition=cond).to_numpy().astype(float)))
            t = power.episode_interval(res, cond, runs=[r.name])
            if t["n_boot"]:
                lo, hi, how = t["ci_lo"], t["ci_hi"], "episodes"
            else:
                se = float(np.nanmean(ds["sync_r2_se"].sel(condition=cond).to_numpy().astype(float)))
                lo, hi, how = mean - se, mean + se, "se"
            rows.append({"run": r.name, "condition": cond, "label": CONDITIONS[cond], "mean": mean, "lo": lo,
                         "hi": hi, "interval": how})
        t = power.surrogate_test(res, [r.name])
        if t["n_surrogates"]:
            s = np.asarray(t["surrogates"], dtype=float)
            s = s[np.isfinite(s)]
            rows.append({"run": r.name, "condition": "surrogates", "label": CONDITIONS["surrogates"],
                         "mean": t["surrogate_mean"], "lo": float(s.min()), "hi": float(s.max()),
                         "interval": "range"})
    out = pd.DataFrame(rows, columns=["run", "condition", "label", "mean", "lo", "hi", "interval"])
    return out[np.isfinite(out["mean"].astype(float))].reset_index(drop=True)


def overview_chart(res, width: int = CHART_WIDTH) -> alt.LayerChart:
    """Genuine SyncR² and every control (:func:`overview_frame`), bars per ordered run with their
    intervals; genuine solid, the controls lighter."""
    d = overview_frame(res)
    order = [CONDITIONS[c] for c in CONDITIONS if c in set(d["condition"])]
    runs = list(dict.fromkeys(d["run"]))
    x = alt.X("label:N", sort=order, title=None, axis=alt.Axis(labelAngle=0, labelExpr=WRAPPED_LABEL))
    xo = alt.XOffset("run:N", sort=runs)
    tips = [alt.Tooltip("run:N", title="ordered run"), alt.Tooltip("label:N", title="condition"),
            alt.Tooltip("mean:Q", title="SyncR²", format=".3f"), alt.Tooltip("lo:Q", format=".3f"),
            alt.Tooltip("hi:Q", format=".3f")]
    bars = alt.Chart().mark_bar().encode(
        x=x, xOffset=xo, y=alt.Y("mean:Q", title="SyncR²"),
        color=alt.Color("run:N", title="ordered run", sort=runs, scale=colour_scale(runs),
                        legend=alt.Legend(orient="top")),
        opacity=alt.condition(alt.datum.condition == "genuine", alt.value(1.0), alt.value(0.55)), tooltip=tips)
    err = alt.Chart().mark_errorbar(ticks=True, color="black").encode(
        x=x, xOffset=xo, y=alt.Y("lo:Q", title="SyncR²"), y2="hi:Q", tooltip=tips)
    hows = set(d["interval"])
    sub = ("bars: 95 % intervals over resampled episodes" if hows <= {"episodes", "range"} else
           "bars: ± the standard error over split seeds, or 95 % intervals over resampled episodes")
    if "range" in hows:
        sub += "; surrogate partners (dialogs that never met): lowest to highest"
    title = alt.TitleParams(f"Genuine SyncR² and its controls, per ordered run ({_who(res)})", fontSize=13,
                            subtitle=sub, subtitleColor="#555")
    return alt.layer(bars, err, data=d).properties(title=title, width=width, height=240,
                                                   description="Genuine SyncR² against every control, per ordered "
                                                               "run, with 95 % intervals")


def overview_png(res, width: int = BOOK_WIDTH, scale: float = BOOK_SCALE) -> bytes:
    """:func:`overview_chart` as a PNG (vl-convert: no browser, no network); by default the book's
    (the README's: ``width=CHART_WIDTH, scale=1``, what :func:`main` writes)."""
    return chart_png(overview_chart(res, width).to_dict(), scale=scale)


def _caption(res, pages: str = "executed/") -> str:
    d = overview_frame(res)
    if d.empty:
        return "No SyncR² of this run could be computed (too few samples to fit the maps): the chart is empty."
    hows = set(d["interval"])
    bars = ("95 % intervals over resampled episodes" if hows <= {"episodes", "range"} else
            "± the standard error over split seeds" if hows <= {"se", "range"} else
            "95 % intervals over resampled episodes, or ± the standard error over split seeds where a run has no "
            "resamples")
    sur = "; the surrogate partners (dialogs that never met): their mean, the bar from lowest to highest" \
        if "range" in hows else ""
    models = join_words(list(dict.fromkeys(m for r in res.runs for m in (r.model_a, r.model_b))))
    who = (f"the embedded tiny models ({models}), not the paper's" if res.embedded and not res.synthetic else
           "synthetic test data, not a result of any model" if res.synthetic else f"this run's models ({models})")
    return (f"Genuine SyncR² and every control for each ordered run, with {bars}{sur}. These are {who}; "
            f"[the controls page]({pages}fig03_04_controls.ipynb) tests every gap.")


# --------------------------------------------------------------------------- the scorecard
def _first_clause(text: str) -> str:
    """``text`` up to its first ``;`` outside parentheses (the claims' lines put the finding first)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == ";" and depth == 0:
            return text[:i]
    return text.rstrip(".")


def _sentences(text: str, most: int = 2) -> str:
    s = re.split(r"(?<=\.)\s+", text.strip())
    return " ".join(s[:most])


def paper_text(name: str, keys: list[str], published: dict) -> str:
    """The paper's value for the claim function ``name`` (of ``data/published.json`` entries ``keys``):
    its printed numbers where it gives them, else its statement in words."""
    parts = []
    for key in keys:
        e = published.get(key, {})
        if key == "fig3_4":
            parts.append({"passive": e.get("claim_passive", ""), "lags": e.get("claim_lag", ""),
                          "shuffled": "not reported (the paper's code has the control)",
                          "pseudo": "not in the paper (ours)"}.get(name, ""))
        elif key == "fig6" and e.get("pearson"):
            parts.append("Pearson r " + ", ".join(f"{r['r']:.2f} ({r['family']}, p {r['p']})" for r in e["pearson"])
                         + f" over {PAPER_PAIRS} pairs")
        elif key == "table1" and e.get("partial_r"):
            rows = e["partial_r"]
            parts.append("partial r given IFEval " + " / ".join(f"{r['ifeval']:.2f}" for r in rows)
                         + ", given MuSR " + " / ".join(f"{r['musr']:.2f}" for r in rows)
                         + f" ({' / '.join(r['family'] for r in rows)})")
        elif key in ("table2", "table5") and e.get("rows"):
            a, b = e["settings"]
            parts.append(f"SyncR² {a} → {b}: " + "; ".join(f"{r['pair']} {r[a][0]:.2f} → {r[b][0]:.2f}"
                                                         for r in e["rows"]))
        elif key == "table4" and e.get("rows"):
            v = [r["gpt-oss-120b"] for r in e["rows"]]
            parts.append(f"gpt-oss-120b against human ratings: r {min(v):.2f} to {max(v):.2f} over {len(v)} "
                         "dimensions")
        elif key == "fig10" and e.get("within_one_sd"):
            parts.append(f"{100 * e['within_one_sd']:.1f} % of its scores within one sd of the human ratings")
        else:
            parts.append(_sentences(_first_clause(e.get("claim", ""))))
    return "; ".join(p for p in parts if p) or "—"


def _run_cells(c: Claim) -> tuple[str, str]:
    """This run's value and its 95 % interval for the scorecard: the claim's measures, or where it has
    none the finding its line puts first, and a dash."""
    if not c.measures:
        return _first_clause(c.text), "—"
    value = "; ".join(m.value_text() for m in c.measures)
    ivs = [m.interval_text() for m in c.measures]
    if all(i == "—" for i in ivs):
        return value, "—"
    if len(ivs) == 1:
        return value, ivs[0]
    return value, "; ".join(f"{m.label or m.quantity}: {i}" for m, i in zip(c.measures, ivs))


def scorecard_rows(res, published: dict, evaluated: list[Claim] | None = None) -> pd.DataFrame:
    """One row per claim of the paper (:func:`synclib.figures.claims`, each function once, in the
    paper's order): ``claim`` (short, with where the paper makes it), ``keys`` (its
    data/published.json entries), ``paper``, ``run`` and ``interval`` (this run's numbers,
    :func:`_run_cells`), ``verdict``, ``module`` (the figure's page) and ``claim_obj``.

    ``evaluated``: the claims as :func:`synclib.figures.verdicts.evaluate` returned them (default:
    evaluated here), so a page that shows both the lines and the scorecard evaluates once."""
    every = claims()
    fns = list(dict.fromkeys(f for f, _ in every))
    evaluated = evaluate(every, res, published) if evaluated is None else evaluated
    if len(evaluated) != len(fns):
        raise ValueError(f"{len(evaluated)} evaluated claims for {len(fns)} claim functions")
    rows = []
    for fn, c in zip(fns, evaluated):
        keys = [k for f, k in every if f is fn]
        run, interval = _run_cells(c)
        rows.append({"claim": c.what, "keys": keys, "paper": paper_text(fn.__name__, keys, published), "run": run,
                     "interval": interval, "verdict": c.verdict, "module": fn.__module__.rsplit(".", 1)[-1],
                     "claim_obj": c})
    return pd.DataFrame(rows, columns=["claim", "keys", "paper", "run", "interval", "verdict", "module", "claim_obj"])


def _linked(what: str, link: str) -> str:
    """A claim linked to its page, where the paper makes it left outside the link:
    ``"[Synchrony: ...](executed/fig02_heatmaps.ipynb) (section 3.2, figure 2)"``."""
    i = what.rfind(" (")
    if i > 0 and what.endswith(")"):
        return f"[{what[:i]}]({link}){what[i:]}"
    return f"[{what}]({link})"


def _cell(text: str) -> str:
    """Text in a Markdown table cell: no pipe or line break."""
    return " ".join(str(text).replace("|", "\\|").split())


def scorecard_table(res, published: dict, evaluated: list[Claim] | None = None, pages: str = "executed/") -> str:
    """The scorecard as a Markdown table (:func:`scorecard_rows`); each claim links to its figure's page
    at ``pages`` + ``NAME.ipynb`` (relative to the including page: the first page is book/intro.md)."""
    rows = scorecard_rows(res, published, evaluated)
    lines = [f"| claim of the paper (its page) | the paper ({PAPER_MODELS}) | this run ({_who(res)}) | "
             "95 % interval | verdict |", "| --- | --- | --- | --- | --- |"]
    for r in rows.itertuples():
        claim = _linked(r.claim, f"{pages}{r.module}.ipynb")
        lines.append("| " + " | ".join(_cell(x) for x in (claim, r.paper, r.run, r.interval, f"**{r.verdict}**"))
                     + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the caveats and the page
def caveats(res, published: dict, evaluated: list[Claim], pages: str = "executed/") -> str:
    """Three sentences worded from the run: its models, how much of genuine SyncR² the passive reader
    keeps (shared input), its size against the paper's and how many claims it cannot test."""
    models = list(dict.fromkeys(m for r in res.runs for m in (r.model_a, r.model_b)))
    if res.embedded and not res.synthetic:
        one = (f"The default models are tiny ({join_words(models)}, where the paper has Mistral and Llama models of "
               f"3 to 8 billion parameters), and their [dialogs]({pages}dialogs.ipynb) are often incoherent.")
    elif res.synthetic:
        one = "These numbers are synthetic test data, not results of any model."
    else:
        one = (f"This run's models are {join_words(models)}; the paper's are Mistral and Llama models of 3 to 8 "
               "billion parameters.")
    has_passive = "passive" in res.conditions()
    share = passive_share_value(res.sync_table(), res.sync_table("passive")) if has_passive else math.nan
    if np.isfinite(share):
        two = (f"{'Much' if share >= 50 else 'Some'} of the synchrony is shared input: the passive reader, who reads "
               f"the same dialog without taking part, keeps {share:.0f} % of genuine SyncR².")
    elif has_passive:
        two = ("How much of the synchrony is shared input, what the passive reader keeps of genuine SyncR², cannot "
               "be said here: too few samples to fit the maps.")
    else:
        two = "This run has no passive reader, so it cannot say how much of the synchrony is shared input."
    sizes = dataset_sizes(res)
    paper_n = (published.get("fig9") or {}).get("n_samples", 6500)
    n_cannot = sum(c.verdict == CANNOT for c in evaluated)
    n_pairs = len(res.pair_names)
    size = ((f"{min(sizes.values())}" if len(set(sizes.values())) == 1 else
             f"{min(sizes.values())}-{max(sizes.values())}") + " samples per genuine dataset, training and test, the mean over directions and split seeds"
            if sizes else "no dataset split into training and test samples")
    three = (f"The run is small ({size}, against the paper's {paper_n:,}; {n_pairs} model "
             f"pair{'s' if n_pairs != 1 else ''} against {PAPER_PAIRS}), so {n_cannot} of the {len(evaluated)} claims "
             f"below read *{CANNOT}*.")
    return " ".join((one, two, three))


def overview_markdown(res, published: dict, image: str = "_generated/overview.png",
                      evaluated: list[Claim] | None = None, pages: str = "executed/") -> str:
    """Markdown for ``book/_generated/overview.md`` (included by the first page, book/intro.md):
    the caveats, the chart (``image``, relative to the including page) and the scorecard."""
    evaluated = evaluate(claims(), res, published) if evaluated is None else evaluated
    lines = [f"**Read this first.** {caveats(res, published, evaluated, pages)}", "",
             "```{figure} " + image, ":alt: Genuine SyncR² and every control, per ordered run", ":width: 100%", "",
             _caption(res, pages), "```", "",
             "**The paper's claims beside this run.** One row per claim: the paper's value where it prints one (else "
             "its statement), this run's number with the p that counts (the larger of two tests, described once on "
             f"the power page: {test_link('the test')}) and its 95 % interval over resampled episodes where it has "
             f"one. A verdict that rests on a test reads its p after Holm's adjustment across the "
             f"{n_claim_tests(evaluated)} claim tests of this table (given beside the p where it changes it), so that "
             "the chance of any false finding among them stays at 5 %. The verdict is the claim's own, worded in "
             "full under *This run* below and on the figure's page; *partly* means one part of the claim holds and "
             "another does not.",
             "", scorecard_table(res, published, evaluated, pages)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the README's image
def main(argv: list[str] | None = None) -> int:
    """``python -m synclib.figures.scorecard --results results/embedded --out book/_static/overview.png``:
    the overview chart as a PNG (the README's image)."""
    # lazy: xarray (through synclib.analysis.results) only when the command runs
    from synclib.analysis.results import load_results

    ap = argparse.ArgumentParser(prog="python -m synclib.figures.scorecard", description=main.__doc__)
    ap.add_argument("--results", default="results/embedded", help="a results directory with manifest.json")
    ap.add_argument("--out", default="book/_static/overview.png", help="the PNG to write")
    ap.add_argument("--width", type=int, default=CHART_WIDTH, help="the chart's width in pixels")
    ap.add_argument("--scale", type=float, default=1.0, help="the PNG's scale")
    args = ap.parse_args(argv)
    png = overview_png(load_results(Path(args.results)), args.width, args.scale)  # the README's: 1x, 800 wide
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    print(f"{out}: {len(png) / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
