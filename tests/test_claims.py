"""synclib.figures' claims: every claim of the paper has its line, worded from the tests it names."""
from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from book_fixtures import tiny_results
from synclib import figures, notebook, stats
from synclib.analysis import power, results
from synclib.analysis.synthetic import SYNTHETIC_PAIRS, build_synthetic_results
from synclib.figures import power as power_page
from synclib.figures import report, run_summary, scorecard
from synclib.figures import (
    fig02_heatmaps, fig03_04_controls, fig05_relationship, fig08_clipping, fig09_sample_size, table2_persona_disjoint,
    table5_nonlinear, verdicts,
)
from synclib.paths import PUBLISHED_NUMBERS, REPO_ROOT
from synclib.run import pipeline

VERDICT = re.compile(r": \*\*(agrees|differs|cannot test)\*\*: ")


@pytest.fixture(scope="session")
def res(tmp_path_factory):
    """The book's tiny synthetic results (every analysis block), shared with the notebook tests."""
    return results.load_results(tiny_results(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def published():
    return results.load_published()


def test_every_claim_of_the_paper_has_a_line():
    """Each figure and table entry of data/published.json is covered by a claim function."""
    entries = {k for k, v in json.loads(PUBLISHED_NUMBERS.read_text()).items()
               if k not in ("_about", "paper", "models") and not v.get("illustration")}
    assert entries == {key for _, key in figures.claims()}
    with pytest.raises(KeyError, match="no claim"):
        figures.claim("fig1", None, {})


def test_the_first_page_lists_every_claim_once(res, published):
    lines = figures.claims_summary(res, published)
    assert len(lines) == len(dict.fromkeys(f for f, _ in figures.claims())) == 14
    for line in lines:
        assert VERDICT.search(line), line
        assert "n/a" not in line and "nan" not in line.lower(), line
    summary = run_summary.run_summary_markdown(res)
    assert all(f"- {line}" in summary for line in lines)
    # a figure's page repeats the first page's lines for its claims
    for name in figures.FIGURES:
        fig = figures.module(name)
        if hasattr(fig, "CLAIMS"):
            text = notebook.claim_lines(fig, res, published)
            for key in {k for _, k in fig.CLAIMS}:
                assert all(c.line() in text for c in figures.claim(key, res, published))


def test_control_lines_are_worded_from_the_larger_p(res, published):
    """A control's line quotes the p that counts (the larger of the two tests) and links to the one
    description of the tests on the power page, with the gap's interval over episodes."""
    table = power.paired_control_tests(res)
    for fn, control in ((fig03_04_controls.passive, "passive"), (fig03_04_controls.shuffled, "shuffled")):
        r = table.set_index("control").loc[control]
        claim = fn(res, published, table=table)
        line = claim.line()
        assert r["p"] == max(r["p_corrected"], r["p_episodes"])
        assert f"{stats.p_clause(r['p'])} ([test](#{verdicts.TEST_LABEL}))" in line
        assert "split-seed values" not in line and "the larger of" not in line
        assert f"95 % interval {r['ci_lo']:.3f} to {r['ci_hi']:.3f} over episodes" in line
        (m,) = claim.measures
        assert (m.value, m.lo, m.hi, m.p) == (r["sync_diff"], r["ci_lo"], r["ci_hi"], r["p"])
        if r["p"] < 0.05 and r["sync_diff"] > 0:
            assert "**agrees**" in line and f"genuine above {control} by {r['sync_diff']:.3f}" in line
        else:
            assert f"about {r['mde_corrected']:.3f}" in line


def test_a_control_equal_to_genuine_in_every_value_allows_no_test(res, published):
    """The old default run clipped every R² to 0: genuine equals each control in every paired
    value, and the line says so instead of printing n/a."""
    table = power.paired_control_tests(res)
    flat = table.assign(mean_genuine=0.0, mean_control=0.0, mean_diff=0.0, sd_diff=0.0, mde=np.nan,
                        mde_corrected=np.nan, p_t=np.nan, p_perm=1.0, p_corrected=np.nan, p_episodes=1.0, p=1.0)
    line = fig03_04_controls.passive(res, published, table=flat).line()
    assert "**cannot test**" in line and "equal in all" in line and "no test or detectable size" in line
    assert fig03_04_controls.lags(res, published, table=flat).text.count("equal in all") == 2
    none = fig03_04_controls.passive(res, published, table=flat[flat["control"] != "passive"])
    assert none.verdict == "cannot test" and "no passive condition" in none.text


def test_relationships_confounded_with_scenario_cannot_be_spoken_to(res, published, monkeypatch):
    cls = type(res)
    monkeypatch.setattr(cls, "relationship_scenarios", lambda self: {"stranger": 2, "friend": 6, "acquaintance": 4})
    c = fig05_relationship.relationships(res, published)
    assert c.verdict == "cannot test" and "confounded with scenario: stranger come from fewer than 3" in c.text
    corr = fig05_relationship.relationship_closeness(res)
    assert corr.describe() in c.text and f"over the {corr.n} of them" in c.text
    # family_member (code 5) is listed apart and, kept out of the correlation, cannot make it untestable
    monkeypatch.setattr(cls, "relationship_scenarios", lambda self: {"stranger": 5, "friend": 5, "family_member": 1})
    c = fig05_relationship.relationships(res, published)
    assert "(outside the five codes, not in the correlation: family_member 1)" in c.text and "confounded" not in c.text
    monkeypatch.setattr(cls, "relationship_scenarios", lambda self: {k: 5 for k in ("stranger", "friend")})
    assert fig05_relationship.relationships(res, published).verdict in verdicts.VERDICTS
    assert "confounded" not in fig05_relationship.relationships(res, published).text


def test_relationship_closeness_is_over_the_papers_five_categories(res):
    """One point per category that every model pair has, codes 0-4, each the mean of the pairs' means;
    family_member (5) stays out of the correlation."""
    t = res.relationship_table()
    per = t[t["code"].between(0, 4)].groupby(["code", "pair"])["sync"].mean().unstack("pair").dropna()
    means = per.mean(axis=1)
    c = fig05_relationship.relationship_closeness(res, t)
    assert c.n == len(means)
    if c.ok:
        assert c.r == pytest.approx(np.corrcoef(means.index, means.to_numpy())[0, 1])
    with_family = pd.concat([t, t.assign(code=5, relationship="family_member", sync=99.0)])
    assert fig05_relationship.relationship_closeness(res, with_family).r == c.r or not c.ok


def test_relationship_closeness_does_not_mix_pairs(res):
    """A planted answer: closeness does nothing within either pair, but the pair with the higher SyncR²
    has only the distant categories. Pooling the samples would find a strong negative r (the issue's
    -0.86); over the categories both pairs have, each the mean of the pairs' means, r is undefined
    (every category the same), and within each pair it is 0 or undefined."""
    rows = []
    for pair, level, codes in (("P1", 0.5, (0, 1, 2)), ("P2", 0.1, (0, 1, 2, 3, 4))):
        for code in codes:
            rows += [{"pair": pair, "code": code, "relationship": str(code), "sync": level + d} for d in (-0.01, 0.01)]
    t = pd.DataFrame(rows)
    pooled = t.groupby("code")["sync"].mean()
    assert np.corrcoef(pooled.index, pooled.to_numpy())[0, 1] < -0.7
    c = fig05_relationship.relationship_closeness(res, t)
    assert c.n == 3 and not c.ok
    within = fig05_relationship.closeness_within_pairs(res, t)
    assert set(within) == {"P1", "P2"} and not any(w.ok for w in within.values())


@pytest.mark.parametrize("kept_paper, kept_run, verdict", [(-0.4, 0.3, "partly"), (-0.4, 0.2, "agrees"),
                                                           (0.3, 0.3, "differs"), (0.298, 0.2, "partly")])
def test_clipping_verdict_from_both_penalties(res, published, monkeypatch, kept_paper, kept_run, verdict):
    """Figure 8: the effect at the paper's λ = 0.1 and at the run's own penalty; "agrees" only where
    keeping negatives lowers SyncR² (by more than LOWERS_BY) at both, "partly" at one."""
    rows = []
    for penalty, kept in (("paper", kept_paper), ("run", kept_run)):
        for method, mean, se in (("clipped at 0", 0.3, 0.01), ("kept", kept, 0.05 if penalty == "paper" else 0.01)):
            rows.append({"pair": "S-S", "family": "x", "model_a": "a", "model_b": "b", "orders": 1,
                         "penalty": penalty, "method": method, "mean": mean, "se": se})
    monkeypatch.setattr(fig08_clipping, "clipping_table", lambda res: pd.DataFrame(rows))
    monkeypatch.setattr(type(res), "penalty_label", lambda self: "λ chosen by cross-validation")
    c = fig08_clipping.clipping(res, published)
    assert c.verdict == verdict and "λ = 0.1" in c.text and "no test" in c.text
    if kept_paper == -0.4:
        assert "from 0.30 to -0.40" in c.text and "by a factor of 5.0" in c.text
    assert f"At this run's own penalty (λ chosen by cross-validation) the two are 0.30 and {kept_run:.2f}" in c.text


def test_setting_and_tom_tests_by_hand(res):
    """Tables 2 and 5 and figure 11: the corrected re-split test on the paired differences."""
    diffs, ratios = [], []
    for name in res.run_names:
        ds = res.analysis(name)
        diffs.append((ds["persona_disjoint_sync_r2_per_seed"] - ds["sync_r2_per_seed"].sel(condition="genuine"))
                     .transpose("direction", "split_seed").values.ravel())
        a, b = ds["persona_disjoint_n_train"].values.ravel(), ds["persona_disjoint_n_test"].values.ravel()
        ratios += list(b[a > 0] / a[a > 0])
    ref = power.corrected_resampled_test(np.concatenate(diffs), np.mean(ratios))
    got = power.setting_test(res, "persona")
    assert got["p"] == pytest.approx(ref["p"], nan_ok=True) and got["n"] == ref["n"]
    nl = power.setting_test(res, "nonlinear")
    assert nl["n"] > 0 and nl["n_layer_pairs"] >= 1
    t = power.tom_tests(res)
    assert len(t) == 6 and set(t["target"]) == {"emotion", "action"}
    row = t[(t["target"] == "emotion") & (t["relation"] == "self current")].iloc[0]
    d = np.concatenate([(res.analysis(n)["tom_kl_baseline"] - res.analysis(n)["tom_kl_best"])
                        .sel(tom_target="emotion", tom_relation="self_current").values.ravel()
                        for n in res.runs_with("tom_kl_best")])
    assert row["mean"] == pytest.approx(np.nanmean(d))
    with pytest.raises(ValueError, match="setting"):
        power.setting_test(res, "lag")


def test_one_count_of_dataset_sizes_on_every_page(res, published):
    """The training samples per dataset used to read differently on five pages; every page now
    quotes Results.sample_counts, the analyses' own n_train / n_test."""
    counts = res.sample_counts()
    for name in res.run_names:
        ds = res.analysis(name)
        mine = counts[counts["run"] == name]
        assert len(mine) == int((ds["n_train"] > 0).sum())
        assert sorted(mine["n_train"]) == sorted(int(v) for v in ds["n_train"].values.ravel() if v > 0)
    text = report.sample_counts_text(res)
    for cond, t in counts.groupby("condition"):
        lo, hi = int(t["n_train"].min()), int(t["n_train"].max())
        assert (f"{lo}-{hi} for training" if lo != hi else f"{lo} for training") in text, cond
    gen = counts[counts["condition"] == "genuine"]
    summary = run_summary.run_summary_markdown(res)
    assert f"| training samples per genuine dataset | {int(gen['n_train'].min())}-{int(gen['n_train'].max())} |" in summary
    assert text in summary and text in run_summary.embedded_run_markdown(res)
    # figure 9's claim quotes each pair's size as the figure's last point does
    sizes = fig09_sample_size.dataset_sizes(res)
    pair_of = {r.name: r.pair for r in res.runs}
    for pair, n in sizes.items():
        mine = gen[gen["run"].map(pair_of) == pair]
        assert n == int(round((mine["n_train"] + mine["n_test"]).mean()))
    text = fig09_sample_size.sample_size(res, published).text
    assert "genuine datasets hold " + ", ".join(f"{p} {n}" for p, n in sizes.items()) in text
    full = fig09_sample_size.sample_size_table(res)
    full = full[full["point"] == "full run"]
    assert all(sizes[r.pair] == r.n_samples for r in full.itertuples())


def test_synchrony_is_tested_against_the_surrogates_not_zero(res, published, monkeypatch):
    """Figure 2's verdict reads genuine's place among its surrogate partners (power.surrogate_test)."""
    t = power.surrogate_test(res)
    c = fig02_heatmaps.synchrony(res, published)
    above = t["p"] < 0.05 and t["gap"] > 0
    assert t["n_surrogates"] == 20 and c.verdict == (("agrees" if fig02_heatmaps.generalises(res)[0] else "partly")
                                                      if above else "differs")
    assert f"against {t['n_surrogates']} surrogate partners" in c.text
    assert f"{stats.p_clause(t['p'])} ([test](#{verdicts.TEST_LABEL}))" in c.text and "the larger of" not in c.text
    assert c.measures[0].value == t["gap"] and (c.measures[0].lo, c.measures[0].hi) == (t["ci_lo"], t["ci_hi"])
    fake = {**t, "genuine": 0.2, "surrogate_mean": 0.25, "surrogate_max": 0.4, "gap": -0.05, "p_rank": 0.6,
            "p_episodes": 0.3, "p": 0.6}
    monkeypatch.setattr(power, "surrogate_test", lambda r: fake)
    assert fig02_heatmaps.synchrony(res, published).verdict == "differs"
    monkeypatch.setattr(power, "surrogate_test", lambda r: {**fake, "n_surrogates": 0})
    c = fig02_heatmaps.synchrony(res, published)
    assert c.verdict == "cannot test" and "no null" in c.text


@pytest.mark.parametrize("test_median, share, verdict", [(0.4, 0.9, "agrees"), (0.05, 0.9, "partly"),
                                                         (0.4, 0.6, "partly")])
def test_synchrony_above_surrogates_agrees_only_where_the_maps_generalise(res, published, monkeypatch,
                                                                          test_median, share, verdict):
    """Figure 2 claims high test R² that generalises: above the surrogates with maps that keep less than
    half their training R² (or with a quarter of the layer pairs negative) is "partly"."""
    t = power.surrogate_test(res)
    monkeypatch.setattr(power, "surrogate_test", lambda r: {**t, "gap": 0.1, "p": 0.001, "p_floor": 0.01})
    summary = pd.DataFrame([{"run": "S-S", "pair": "S-S", "family": "x", "layer_pairs": 40, "train_median": 0.6,
                             "test_median": test_median, "gap_median": 0.6 - test_median, "gap_mean": 0.5,
                             "share_positive": share, "n_train": 100.0, "n_test": 30.0}])
    monkeypatch.setattr(fig02_heatmaps, "generalisation_summary", lambda r: summary)
    c = fig02_heatmaps.synchrony(res, published)
    assert c.verdict == verdict and "the paper gives no number" in c.text
    assert f"median test R² {test_median:.3f} against training 0.600" in c.text


def test_table5_agrees_when_the_mlp_is_worse_and_differs_when_better(res, published, monkeypatch):
    base = {"n": 8, "t": 3.0, "mde": 0.04, "n_layer_pairs": 4}
    for mean, p, verdict in ((-0.09, 0.006, "agrees"), (0.09, 0.006, "differs"), (0.01, 0.6, "agrees")):
        monkeypatch.setattr(power, "setting_test", lambda r, s, m=mean, q=p: {**base, "mean": m, "p": q})
        assert table5_nonlinear.nonlinear(res, published).verdict == verdict, (mean, p)
        assert table2_persona_disjoint.persona(res, published).verdict == ("differs" if p < 0.05 else "agrees")
    monkeypatch.setattr(power, "setting_test", lambda r, s: {**base, "mean": 0.01, "p": 0.6, "mde": 0.2})
    assert table5_nonlinear.nonlinear(res, published).verdict == "cannot test"


def test_table5_reports_how_long_each_mlp_trained(res):
    """Every fitted MLP has its early-stopped epochs and steps (table 5's page states them)."""
    t = table5_nonlinear.mlp_training(res)
    fitted = sum(int((res.analysis(n)["nonlinear_epochs"] > 0).sum()) for n in res.runs_with("nonlinear_epochs"))
    assert len(t) == fitted > 0
    assert (t["epochs"] >= 1).all() and (t["epochs"] <= t["cap"]).all() and (t["steps"] >= t["epochs"]).all()
    text = table5_nonlinear.sentence_mlp_training(t)
    assert f"{int(t['epochs'].min())}-{int(t['epochs'].max())} epochs" in text and f"for the {len(t)} maps" in text


# --------------------------------------------------------------------------- the first page's overview
#: the full wording of the controls' test, which only the power page spells out
LONG_TEST = re.compile(r"the larger of the corrected re-split t-test over \d+ split-seed values and the bootstrap "
                       r"over \d+ episodes")


def test_the_scorecard_has_one_row_per_claim_with_its_verdict(res, published):
    """The first page's scorecard reads the claims' own evaluation: one row per claim, in order, each
    with the claim's verdict and a link to its figure's page."""
    every = figures.claims()
    evaluated = verdicts.evaluate(every, res, published)
    rows = scorecard.scorecard_rows(res, published)
    assert len(rows) == len(evaluated) == len(figures.claims_summary(res, published))
    assert list(rows["claim"]) == [c.what for c in evaluated]
    assert list(rows["verdict"]) == [c.verdict for c in evaluated]
    assert set(rows["verdict"]) <= set(verdicts.VERDICTS)
    table = scorecard.scorecard_table(res, published).splitlines()
    header, body = table[0], table[2:]
    assert "the paper (Mistral/Llama" in header and "this run (synthetic test data)" in header
    assert "95 % interval" in header and len(body) == len(evaluated)
    for line, r in zip(body, rows.itertuples()):
        assert line.endswith(f"| **{r.verdict}** |") and f"](executed/{r.module}.ipynb)" in line
        assert "nan" not in line.lower() and "n/a" not in line


def test_the_scorecards_numbers_are_the_claims(res, published):
    """This run's values and intervals are the evaluated claims' (the episode bootstrap of the gaps),
    and the paper's come from data/published.json."""
    rows = scorecard.scorecard_rows(res, published).set_index("claim")
    table = power.paired_control_tests(res).set_index("control")
    passive = fig03_04_controls.passive(res, published)
    r = table.loc["passive"]
    row = rows.loc[passive.what]
    assert f"{r['sync_diff']:.3f}" in row["run"] and stats.p_clause(r["p"]) in row["run"]
    assert row["interval"] == f"{r['ci_lo']:.3f} to {r['ci_hi']:.3f}"
    assert row["paper"] == published["fig3_4"]["claim_passive"]
    lags = rows.loc[fig03_04_controls.lags(res, published).what]
    for c in (c for c in table.index if c.startswith("lag")):
        assert f"{c}: {table.loc[c, 'ci_lo']:.3f} to {table.loc[c, 'ci_hi']:.3f}" in lags["interval"]
    t = power.surrogate_test(res)
    syn = rows.loc[fig02_heatmaps.synchrony(res, published).what]
    assert f"{t['gap']:.3f}" in syn["run"] and syn["interval"] == f"{t['ci_lo']:.3f} to {t['ci_hi']:.3f}"
    social = rows.loc[[w for w in rows.index if "social performance" in w][0]]
    assert all(f"{x['r']:.2f}" in social["paper"] for x in published["fig6"]["pearson"])
    assert all(f"{x['musr']:.2f}" in social["paper"] for x in published["table1"]["partial_r"])
    persona = rows.loc[table2_persona_disjoint.persona(res, published).what]
    d = power.setting_test(res, "persona")
    assert f"{d['mean']:.3f}" in persona["run"] and persona["interval"] == "—"
    assert all(f"{x['original'][0]:.2f} → {x['persona-disjoint'][0]:.2f}" in persona["paper"]
               for x in published["table2"]["rows"])


def test_the_overview_names_its_caveats_and_chart(res, published):
    """Three sentences of caveats from the run (the passive reader's share, the sizes, how many claims
    cannot be tested), the chart with its caption, then the scorecard."""
    text = scorecard.overview_markdown(res, published)
    evaluated = verdicts.evaluate(figures.claims(), res, published)
    share = report.passive_share_value(res.sync_table(), res.sync_table("passive"))
    assert f"keeps {share:.0f} % of genuine SyncR²" in text
    n_cannot = sum(c.verdict == verdicts.CANNOT for c in evaluated)
    assert f"so {n_cannot} of the {len(evaluated)} claims below read *cannot test*" in text
    assert "against the paper's 6,500" in text
    assert text.index("Read this first") < text.index("```{figure} _generated/overview.png") < text.index("| claim")
    frame = scorecard.overview_frame(res)
    assert {"genuine", "passive", "shuffled", "pseudo", "surrogates"} <= set(frame["condition"])
    assert set(frame["run"]) == set(res.run_names) and (frame["lo"] <= frame["hi"]).all()
    gen = frame[frame["condition"] == "genuine"].set_index("run")["mean"]
    by_run = res.sync_table(separate=True).set_index("pair")["mean"]
    assert np.allclose(gen.loc[by_run.index], by_run)


def test_a_colour_means_a_condition_on_every_page(res):
    """Conditions take their own colours (CONDITION_COLOURS); whatever else a chart colours (the
    first page's ordered runs, families, settings) takes none of them: the overview's second run
    was orange, the passive reader's colour on the controls page."""
    from synclib.figures import charts

    conditions = ["genuine", "passive", "lag1"]
    assert charts.colour_scale(conditions).range == [charts.CONDITION_COLOURS[c] for c in conditions]
    assert not set(charts.OTHER_COLOURS) & set(charts.CONDITION_COLOURS.values())
    spec = scorecard.overview_chart(res).to_dict()
    runs = [layer["encoding"]["color"] for layer in spec["layer"] if "color" in layer.get("encoding", {})]
    assert runs and all(c["field"] == "run" and c["scale"]["range"] == list(charts.OTHER_COLOURS) for c in runs)


def test_the_pages_step_writes_the_overview_and_its_chart(res, tmp_path, monkeypatch):
    """The pipeline's pages step writes the chart (a PNG) and the overview that shows it."""
    monkeypatch.setattr(pipeline, "GENERATED_DIR", tmp_path / "_generated")
    pipeline.step_pages({}, tmp_path / "_generated" / "run_summary.md", str(res.root / "manifest.json"))
    png = tmp_path / "_generated" / "overview.png"
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "_generated/overview.png" in (tmp_path / "_generated" / "overview.md").read_text()
    assert "{include} _generated/overview.md" in (REPO_ROOT / "book" / "intro.md").read_text()


def test_the_tests_full_wording_is_on_the_power_page_only(res, published):
    """The claims say "p = ... (test)" and link to the power page's section, the one place that spells
    out the test in full."""
    table = power.paired_control_tests(res)
    description = power_page.test_description(table, power.surrogate_test(res))
    assert len(LONG_TEST.findall(description)) == 1
    pages = [scorecard.overview_markdown(res, published), run_summary.run_summary_markdown(res)]
    pages += [notebook.claim_lines(figures.module(n), res, published) for n in figures.FIGURES
              if hasattr(figures.module(n), "CLAIMS")]
    assert not any(LONG_TEST.search(p) for p in pages)
    assert all("the larger of" not in line for line in figures.claims_summary(res, published))
    assert f"(#{verdicts.TEST_LABEL})" in pages[1]
    nb = (REPO_ROOT / "notebooks" / "power.md").read_text()
    assert f"({verdicts.TEST_LABEL})=\n## " in nb and "fig.test_description(" in nb


def test_the_overview_of_a_run_without_a_fitted_map(tmp_path, published):
    """Every grid NaN (the paper's 6,500 samples on a tiny run): the overview says so, in words, and
    its chart is empty, not broken."""
    root = build_synthetic_results(tmp_path / "r", pairs=SYNTHETIC_PAIRS[:1], n_seeds=1, n_episodes=4, n_rounds=2,
                                   analyze_kwargs=dict(lags=(), n_samples=6500))
    res = results.load_results(root)
    text = scorecard.overview_markdown(res, published)
    assert not re.search(r"(?<![\w.])(nan|NaN|inf|None)(?![\w])", text), text
    assert "no dataset split into training and test samples" in text and "the chart is empty" in text
    assert scorecard.overview_frame(res).empty and len(scorecard.overview_png(res)) > 1000


def test_claim_verdicts_read_holm_adjusted_p_across_every_claim(res, published, monkeypatch):
    """A planted p: table 2's difference at p = 0.033 (the issue's) with a minimum detectable difference
    of 0.108 is a finding alone, but not after Holm's adjustment across the tests of every claim; the
    first page's list and table 2's page judge it alike and quote the adjusted p."""
    monkeypatch.setattr(power, "setting_test", lambda r, s: {"n": 8, "t": 2.6, "mde": 0.108, "n_layer_pairs": 0,
                                                             "mean": 0.04, "p": 0.033})
    alone = table2_persona_disjoint.persona(res, published)
    assert alone.verdict == "differs" and ", Holm-adjusted" not in alone.text
    every = verdicts.evaluate(figures.claims(), res, published)
    n = verdicts.n_claim_tests(every)
    assert n >= 3
    page = verdicts.evaluate(table2_persona_disjoint.CLAIMS, res, published)[0]
    first = next(c for c in every if c.key == "table2")
    assert page.verdict == first.verdict == "cannot test" and page.text == first.text
    ps = np.array([m.p for c in every for m in c.measures if np.isfinite(m.p)])
    assert first.measures[0].p_holm == pytest.approx(stats.holm(ps)[np.flatnonzero(ps == 0.033)].max())
    assert f"Holm-adjusted {first.measures[0].p_holm:.2f}" in first.text
