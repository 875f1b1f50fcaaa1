"""The run's own pages: the run summary and the account of the run on the embedded models page.

:func:`run_summary_markdown` writes the run summary that the book's first page includes
(``book/_generated/run_summary.md``): the run's settings, its models (the paper's table 3),
its size against the measured sample curves, its headline SyncR² per model pair and the line
of every claim of the paper (:func:`synclib.figures.claims_summary`).
The first page's overview above it (caveats, chart and scorecard) is :mod:`synclib.figures.scorecard`'s.
:func:`embedded_run_markdown` writes ``book/_generated/embedded_run.md``: what the run being
read has, for the *embedded models* page.  Both are written by the pipeline's pages step
(:func:`synclib.run.pipeline.step_pages`); the sentences shared with the figure pages (the
banner of synthetic data, the sample counts) come from :mod:`synclib.figures.report`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from synclib import stats
from synclib.analysis import power
from synclib.analysis.sizing import clip_size, leaves_zero_text, load_curves
from synclib.figures import claims_summary
from synclib.figures.report import banner, join_words, passive_share, sample_counts_text
from synclib.figures.verdicts import test_link
from synclib.penalty import PAPER_ALPHA, Penalty
from synclib.stats import fmt as _f

__all__ = ["run_summary_markdown", "embedded_run_markdown", "penalty_table", "penalty_markdown"]


def _judge_line(judge: dict) -> str:
    """Which judge scored social performance, in which mode, on how many dialogs."""
    if not judge.get("model"):
        return "n/a"
    where = f"endpoint {judge['url']}" if judge.get("url") else "local model"
    mode = judge.get("mode") or ("json" if judge.get("url") else "constrained")
    how = {"constrained": "constrained scoring (score read from the judge's distribution over "
                          "the allowed integers, one agent and dimension at a time)",
           "json": "JSON mode (the judge writes the whole evaluation)"}.get(mode, mode)
    n = judge.get("sample")
    scope = (f"a random sample of {n} dialogs per ordered run (sample seed {judge.get('sample_seed', 0)})"
             if n else "every dialog")
    return f"`{judge['model']}` ({where}), {how}; {scope}"


def _size_lines(res) -> list[str]:
    """Why the run has the size it has: its training samples against the measured curves."""
    counts = res.sample_counts()
    gen = counts[counts["condition"] == "genuine"]["n_train"]
    dims = power.run_sample_sizes(res).get("dims") or []
    got = clip_size(max(dims), load_curves()) if len(gen) and dims else None
    if got is None:
        return ["", sample_counts_text(res)] if len(gen) else []
    n, how = got
    verdict = "above" if gen.min() > n else "below"
    measured = any(c.width == max(dims) for c in load_curves())  # else the point is scaled: say how
    return ["", f"**The run's size.** SyncR² clips each layer's test R² at 0, so with too few training samples "
            f"it is 0 whatever the models do. {leaves_zero_text()} For models {max(dims)} wide that point is about "
            f"{n:.0f}{'' if measured else f' ({how})'}; every genuine dataset of this run has {int(gen.min())} or "
            f"more, {verdict} it. "
            f"{sample_counts_text(res)} `synclib run --dry-run` prints every dataset's count before a run (an upper "
            "bound: dialogs that end early give fewer) and warns below the curve."]


def embedded_run_markdown(res) -> str:
    """Markdown for ``book/_generated/embedded_run.md``: what the run being read has, for the
    *embedded models* page (everything there that depends on the run comes from here)."""
    cfg = res.config
    sim = cfg.get("simulate") or {}
    counts = res.sample_counts()
    lines = [f"**This run** (`{res.manifest.get('name', 'unnamed')}`"
             + (", the embedded tiny models" if res.embedded else ", not the embedded models") + f"): "
             f"{len(res.pair_names)} model pair{'s' if len(res.pair_names) != 1 else ''} "
             f"({', '.join(res.pair_names)}; ordered runs {', '.join(res.run_names)}), "
             f"{sim.get('episodes', '?')} tasks x {len(sim.get('seeds') or [0])} simulation seed(s), at most "
             f"{sim.get('max_utterances', '?')} utterances per dialog.", ""]
    if len(counts):
        lines += [sample_counts_text(res) + " " + leaves_zero_text(), ""]
    n_pairs = len(res.pair_names)
    lines += [f"- **Social performance (figure 6, table 1, figure 7).** {n_pairs} model pair"
              f"{'s' if n_pairs != 1 else ''}: a correlation across pairs needs at least {stats.MIN_N_CORR} "
              "(and many more to be evidence); the pages say so instead of printing an r."]
    judged = res.judged_table()
    if len(judged):
        lines += [f"- **The judge.** {join_words([f'{r.judged} of {int(r.dialogs) if np.isfinite(r.dialogs) else chr(63)} dialogs of {r.run}' for r in judged.itertuples()])} "
                  "were judged (figure 6 gives each run's interval)."]
    scen = res.relationship_scenarios() if res.runs_with("relationship_sync_r2") else {}
    if scen:
        lines += ["- **Relationships (figure 5).** Scenarios per category among the everyday-encounter sources: "
                  + ", ".join(f"{k} {v}" for k, v in scen.items())
                  + (": a category from one or two scenarios cannot be told apart from its scenario."
                     if min(scen.values()) < 3 else ".")]
    tom = res.tom_table()
    if len(tom):
        dec = tom[tom["decoder_or_baseline"] == "decoder"]
        kept, dropped = int(dec["n_kept"].sum()), int(dec["n_dropped"].sum())
        if kept + dropped:
            lines += [f"- **Theory of Mind (figure 11).** {kept} of {kept + dropped} decoded samples' replies followed "
                      "the instructed \"Emotion. Action type.\" format; the format filter was "
                      + ("on: only those are decoded." if bool(dec["filtered"].all()) else
                         "off (`analysis.tom_format_filter: false`): every reply is decoded, which the paper does not do.")]
    return "\n".join(lines) + "\n"


def _penalty_cell(alpha) -> str:
    """The run summary's ridge penalty (the config's ``analysis.alpha``), with the paper's beside it."""
    if alpha is None:
        return "n/a"
    penalty = Penalty(alpha)
    if penalty.cv:
        return (f"chosen per source layer by cross-validation over whole episodes (the paper: {PAPER_ALPHA}; "
                f"figure 8 also refits at {PAPER_ALPHA})")
    return f"{alpha}" + (" (the paper's)" if penalty.is_paper() else f" (the paper: {PAPER_ALPHA})")


def run_summary_markdown(res) -> str:
    """Markdown for ``book/_generated/run_summary.md``: models, sizes and the headline numbers.

    Parameters
    ----------
    res : synclib.analysis.results.Results
    """
    cfg = res.config
    sim = cfg.get("simulate") or {}
    ana = cfg.get("analysis") or {}
    lines = [banner(res).strip()] if res.synthetic else []
    models = {}
    for p in res.runs:
        models.setdefault(p.model_a, None)
        models.setdefault(p.model_b, None)
    episodes = sim.get("episodes")
    if isinstance(episodes, list):
        episodes = f"{len(episodes)} listed"
    lines += [
        f"**Run `{res.manifest.get('name', 'unnamed')}`** "
        f"({'embedded tiny models' if res.embedded else 'configured models'}"
        f"{', created ' + res.manifest['created'] if res.manifest.get('created') else ''}).",
        "",
        "| setting | value |", "| --- | --- |",
        f"| models | {', '.join(models)} |",
        f"| pairs | {', '.join(res.pair_names)} |",
        f"| ordered runs | {', '.join(res.run_names)} (speaking orders: {res.orders_played()}) |",
        f"| scenarios | {cfg.get('scenarios', 'n/a')} |",
        f"| tasks (episodes) | {episodes if episodes is not None else 'n/a'} |",
        f"| simulation seeds | {sim.get('seeds', 'n/a')} |",
        f"| max utterances | {sim.get('max_utterances', 'n/a')} |",
        f"| max new tokens | {sim.get('max_new_tokens', 'n/a')} |",
        f"| judge | {_judge_line(cfg.get('judge') or {})} |",
        f"| ridge λ | {_penalty_cell(ana.get('alpha'))} |",
        f"| split seeds | {ana.get('split_seeds', 'n/a')} |",
    ]
    sync = res.sync_table()
    conds = res.conditions()
    passive = res.sync_table("passive") if "passive" in conds else None
    counts = res.sample_counts()
    gen = counts[counts["condition"] == "genuine"]["n_train"]
    if len(gen):
        lo, hi = int(gen.min()), int(gen.max())
        lines.append(f"| training samples per genuine dataset | {lo}-{hi} |" if lo != hi else
                     f"| training samples per genuine dataset | {lo} |")
    lines += _size_lines(res)
    models = res.model_table()
    if len(models):
        lines += ["", "**Table 3** (the paper's appendix F: abbreviations and full model names), for this run's "
                  "models; layers and width as the cubes record them:", "",
                  "| abbreviation | model | spec | family | layers | width |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r.abbreviation} | {r.model} | `{r.spec}` | {r.family} | "
                  f"{'—' if not np.isfinite(r.layers) else int(r.layers)} | "
                  f"{'—' if not np.isfinite(r.width) else int(r.width)} |" for r in models.itertuples()]
    lines += ["", "**Headline numbers of this run** (per model pair: the mean of its directional SyncR² "
              "values, both directions of every speaking order played, with its 95 % interval over resampled "
              "episodes; the standard error over split seeds that the paper's code reports is given beside it, "
              "and is smaller: re-splitting the same dialogs leaves out how much the dialogs themselves vary):", ""]
    intervals = {c: episode_intervals(res, c) for c in ("genuine", "passive") if c in conds}
    for _, r in sync.iterrows():
        extra = ""
        if passive is not None:
            pr = passive.set_index("pair").loc[r["pair"]]
            extra = f"; passive reader {_value_text(pr, intervals.get('passive', {}).get(r['pair']))}"
        lines.append(f"- {r['pair']} ({r['model_a']} & {r['model_b']}): SyncR² "
                     f"{_value_text(r, intervals.get('genuine', {}).get(r['pair']))}{extra}")
    if share := passive_share(sync, passive):
        lines += ["", f"{share[0].upper()}{share[1:]}: that part of what the maps predict comes from the input "
                  "the two agents share, not from taking part; the controls page tests the rest."]
    # lazy: xarray (through synclib.analysis.results) only when the summary is written
    from synclib.analysis.results import load_published

    lines += ["", "**Every claim of the paper, and what this run finds** (agrees, partly, differs, or cannot test, with the "
              "reason; the first page's scorecard sums them up, each figure's page repeats its line, and each p is "
              f"the one that counts, its {test_link()} described once on the page *Statistical power*):", ""]
    lines += [f"- {s}" for s in claims_summary(res, load_published())]
    return "\n".join(lines) + "\n"


def episode_intervals(res, condition: str = "genuine") -> dict:
    """Per model pair, the 95 % interval of its SyncR² over resampled episodes
    (:func:`synclib.analysis.power.episode_interval` of the pair's ordered runs): pair -> (lo, hi);
    pairs whose analyses have no resamples are left out."""
    out = {}
    for pair, runs in res.units():
        t = power.episode_interval(res, condition, runs=[r.name for r in runs])
        if t["n_boot"]:
            out[pair] = (t["ci_lo"], t["ci_hi"])
    return out


def _value_text(row, interval) -> str:
    """``"0.30 (95 % interval 0.22 to 0.37 over episodes; SE over split seeds 0.01)"``."""
    se = f"SE over split seeds {_f(row['se'])}"
    if interval is None or not np.all(np.isfinite(interval)):
        return f"{_f(row['mean'])} ({se})"
    return f"{_f(row['mean'])} (95 % interval {_f(interval[0])} to {_f(interval[1])} over episodes; {se})"


def penalty_table(res) -> pd.DataFrame:
    """Where the cross-validated penalties fell on their grid (``alpha_relative`` over the
    analysis' ``cv_alphas``): per ordered run and condition, ``fits`` (source layers x
    split seeds x directions), ``at_top`` and ``at_bottom`` (shares of the fits at the grid's
    ends, where the search may have wanted to go further), ``median`` (the median relative
    penalty), ``grid_lo``, ``grid_hi``.  Empty for runs with a fixed penalty."""
    cols = ["run", "pair", "condition", "fits", "at_top", "at_bottom", "median", "grid_lo", "grid_hi"]
    rows = []
    for r in res.runs:
        ds = res.analysis(r.name)
        penalty = Penalty.from_attrs(ds.attrs)
        if "alpha_relative" not in ds or not penalty.cv:
            continue
        grid = np.asarray(penalty.cv_alphas)
        for c in ds["condition"].values:
            v = ds["alpha_relative"].sel(condition=c).to_numpy().ravel()
            v = v[np.isfinite(v)]
            if v.size:
                rows.append({"run": r.name, "pair": r.pair, "condition": str(c), "fits": int(v.size),
                             "at_top": float(np.isclose(v, grid.max(), rtol=1e-6).mean()),
                             "at_bottom": float(np.isclose(v, grid.min(), rtol=1e-6).mean()),
                             "median": float(np.median(v)), "grid_lo": float(grid.min()),
                             "grid_hi": float(grid.max())})
    return pd.DataFrame(rows, columns=cols)


def penalty_markdown(res) -> str:
    """The method page's account of the run's ridge penalties (``book/_generated/penalty.md``):
    where the cross-validated choices fell on their grid, per ordered run (genuine and all
    conditions), from :func:`penalty_table`."""
    t = penalty_table(res)
    if t.empty:
        return (f"*This run:* {res.penalty_label()} for every map; nothing is searched, so no choice can sit at "
                "the end of a grid.\n")
    lo, hi = t["grid_lo"].min(), t["grid_hi"].max()
    lines = [f"*This run* searched λ from {lo:g} to {hi:g} times each source layer's scale (half decades). Where "
             "the choices fell, per ordered run (shares of the fits, source layers x split seeds x directions):", "",
             "| run | condition | fits | at the grid's top | at its bottom | median λ / scale |",
             "| --- | --- | --- | --- | --- | --- |"]
    for _, r in t.iterrows():
        if r["condition"] == "genuine" or r["at_top"] > 0 or r["at_bottom"] > 0:
            lines.append(f"| {r['run']} | {r['condition']} | {r['fits']} | {100 * r['at_top']:.1f} % | "
                         f"{100 * r['at_bottom']:.1f} % | {r['median']:.2g} |")
    rest = t[(t["condition"] != "genuine") & (t["at_top"] == 0) & (t["at_bottom"] == 0)]
    if len(rest):
        lines += ["", f"The other {len(rest)} condition(s) of the runs have no fit at either end."]
    return "\n".join(lines) + "\n"
