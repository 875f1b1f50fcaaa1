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
from synclib.figures import report, run_summary
from synclib.figures import (
    fig02_heatmaps, fig03_04_controls, fig05_relationship, fig08_clipping, fig09_sample_size, table2_persona_disjoint,
    table5_nonlinear, verdicts,
)
from synclib.paths import PUBLISHED_NUMBERS

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
    table = power.paired_control_tests(res)
    for fn, control in ((fig03_04_controls.passive, "passive"), (fig03_04_controls.shuffled, "shuffled")):
        r = table.set_index("control").loc[control]
        line = fn(res, published, table=table).line()
        assert r["p"] == max(r["p_corrected"], r["p_episodes"])
        for p in (r["p"], r["p_corrected"], r["p_episodes"]):
            assert stats.p_clause(p) in line
        assert f"over {int(r['n_pairs'])} split-seed values" in line and f"{int(r['n_episodes'])} episodes" in line
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
    """One point per category, codes 0-4; family_member (5) stays out of the correlation."""
    t = res.relationship_table()
    means = t[t["code"].between(0, 4)].groupby("code")["sync"].mean()
    c = fig05_relationship.relationship_closeness(res, t)
    assert c.n == len(means)
    if c.ok:
        assert c.r == pytest.approx(np.corrcoef(means.index, means.to_numpy())[0, 1])
    with_family = pd.concat([t, t.assign(code=5, relationship="family_member", sync=99.0)])
    assert fig05_relationship.relationship_closeness(res, with_family).r == c.r or not c.ok


def test_clipping_line_at_the_papers_penalty(res, published, monkeypatch):
    rows = []
    for penalty, kept in (("paper", -0.4), ("run", 0.3)):
        for method, mean, se in (("clipped at 0", 0.3, 0.01), ("kept", kept, 0.05 if penalty == "paper" else 0.01)):
            rows.append({"pair": "S-S", "family": "x", "model_a": "a", "model_b": "b", "orders": 1,
                         "penalty": penalty, "method": method, "mean": mean, "se": se})
    monkeypatch.setattr(fig08_clipping, "clipping_table", lambda res: pd.DataFrame(rows))
    monkeypatch.setattr(type(res), "penalty_label", lambda self: "λ chosen by cross-validation")
    c = fig08_clipping.clipping(res, published)
    assert c.verdict == "agrees" and "λ = 0.1" in c.text and "from 0.30 to -0.40" in c.text
    assert "by a factor of 5.0" in c.text and "no test" in c.text
    assert "At this run's own penalty (λ chosen by cross-validation) the two are 0.30 and 0.30" in c.text


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
    assert t["n_surrogates"] == 20 and c.verdict == ("agrees" if t["p"] < 0.05 and t["gap"] > 0 else "differs")
    assert f"against {t['n_surrogates']} surrogate partners" in c.text and stats.p_clause(t["p_rank"]) in c.text
    fake = {**t, "genuine": 0.2, "surrogate_mean": 0.25, "surrogate_max": 0.4, "gap": -0.05, "p_rank": 0.6,
            "p_episodes": 0.3, "p": 0.6}
    monkeypatch.setattr(power, "surrogate_test", lambda r: fake)
    assert fig02_heatmaps.synchrony(res, published).verdict == "differs"
    monkeypatch.setattr(power, "surrogate_test", lambda r: {**fake, "n_surrogates": 0})
    c = fig02_heatmaps.synchrony(res, published)
    assert c.verdict == "cannot test" and "no null" in c.text


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
