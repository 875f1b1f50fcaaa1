"""synclib.analysis.claims: every claim of the paper judged once, from the tests it names, written to
``claims.json`` and worded from there on the first page and on the claim's own page."""
from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from book_fixtures import executed_notebooks, tiny_results
from pages import copy_results, executed_charts, executed_text, rewrite_claims, run_page
from synclib import notebook, stats, theme
from synclib.analysis import claims, power, results
from synclib.analysis.claims import AGREES, CANNOT, DIFFERS, PARTLY, RunTests
from synclib.paths import NOTEBOOK_DIR, PUBLISHED_NUMBERS, REPO_ROOT
from synclib.penalty import PAPER_ALPHA
from synclib.stats import fmt
from synthetic import SYNTHETIC_PAIRS, build_synthetic_results

VERDICT = re.compile(r": \*\*(agrees|partly|differs|cannot test)\*\*: ")
ABILITIES = "data/ability_scores.csv"
#: the tests a RunTests computes once (cached properties), shared by the tests below
CACHED = ("controls", "controls_seed_average", "surrogates", "pairs", "topk_correlations", "abilities", "tom")


@pytest.fixture(scope="session")
def res(tmp_path_factory):
    """The book's tiny synthetic results (every analysis block, claims.json written), shared with the
    notebook tests."""
    return results.load_results(tiny_results(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def published():
    return results.load_published()


@pytest.fixture(scope="module")
def computed(res, published):
    """The run's tests, computed once for the module."""
    t = RunTests(res, published, ability_scores=ABILITIES)
    for name in CACHED:
        getattr(t, name)
    return t


@pytest.fixture
def t(computed, res, published):
    """A RunTests with the module's tests in it: a test may replace one (``t.controls = ...``)."""
    fresh = RunTests(res, published, ability_scores=ABILITIES)
    fresh.__dict__.update({k: computed.__dict__[k] for k in CACHED})
    return fresh


@pytest.fixture(scope="session")
def executed(tmp_path_factory):
    """Every notebook executed on the tiny results, as the main job runs them (shared with the notebook tests)."""
    return executed_notebooks(tmp_path_factory.getbasetemp())


def page(executed, stem: str) -> str:
    path, proc = executed[stem]
    assert proc.returncode == 0, f"{stem}:\n{proc.stderr[-3000:]}"
    return executed_text(path)


def claim_line(text: str, what: str) -> str:
    """The paragraph of a page that states claim ``what``'s verdict (up to the next claim's, if any)."""
    start = text.index(f"{what}: **")
    nxt = VERDICT.search(text, start + len(what) + 5)
    end = text.find("\n", start)
    cut = [i for i in (end, nxt.start() if nxt else -1) if i > 0]
    line = text[start:min(cut)] if cut else text[start:]
    if nxt and nxt.start() < (end if end > 0 else len(text)):  # several claims in one paragraph: back to the ". "
        line = text[start:text.rfind(". ", start, nxt.start()) + 1]
    return line


def scorecard(text: str) -> list[str]:
    """The first page's scorecard: its header line and its rows."""
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("| claim of the paper"))
    out = [lines[i]]
    for line in lines[i + 2:]:
        if not line.startswith("| "):
            break
        out.append(line)
    return out


def cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


# --------------------------------------------------------------------------- every claim, once
def test_every_claim_of_the_paper_is_judged(res):
    """Each figure and table entry of data/published.json is a claim of claims.CLAIMS; the run's
    claims.json has one record per claim, in the paper's order, and no other."""
    entries = {k for k, v in json.loads(PUBLISHED_NUMBERS.read_text()).items()
               if k not in ("_about", "paper", "models") and not v.get("illustration")}
    assert entries == {key for _, _, keys, _ in claims.CLAIMS for key in keys}
    ids = [fn.__name__ for fn, *_ in claims.CLAIMS]
    assert len(ids) == len(set(ids)) == 15
    assert [c["id"] for c in res.claims()] == ids
    assert all((NOTEBOOK_DIR / f"{page}.md").is_file() for _, page, _, _ in claims.CLAIMS)
    with pytest.raises(KeyError, match="no claim"):
        res.claim("fig1")


@pytest.mark.slow
def test_the_first_page_lists_every_claim_once_and_each_page_states_its_own(res, executed):
    """The first page's scorecard has one row per claim with the claim's verdict; each claim's page states
    the same verdict for it, worded from the same claims.json (so the two cannot disagree)."""
    rows = scorecard(page(executed, "intro"))[1:]
    records = res.claims()
    assert len(rows) == len(records) == 15
    for row, c in zip(rows, records):
        assert row.endswith(f"| **{c['verdict']}** |"), row
        assert f"]({c['page']}.ipynb)" in row and "n/a" not in row and "nan" not in row.lower(), row
    for c in records:
        text = page(executed, c["page"])
        what = c["what"]
        assert f"{what}: **{c['verdict']}**: " in text, (c["id"], c["page"])
        line = claim_line(text, what)
        assert "n/a" not in line and not re.search(r"\bnan\b", line.lower()), line


# --------------------------------------------------------------------------- the controls (figures 3-4)
def test_control_claims_read_the_larger_p(t, res, published):
    """A control's measure is the gap of the reported SyncR² with its 95 % interval over episodes, and its p
    the controls table's p: the larger of the corrected re-split test and the episode bootstrap."""
    table = t.controls.set_index("control")
    null = np.nanquantile(t.surrogates["surrogates"], claims.COLLAPSES)
    for fn, control in ((claims.passive, "passive"), (claims.shuffled, "shuffled"), (claims.pseudo, "pseudo")):
        r = table.loc[control]
        c = fn(t)
        assert r["p"] == max(r["p_corrected"], r["p_episodes"])
        (m,) = c.measures
        assert (m.value, m.lo, m.hi, m.p) == (r["sync_diff"], r["ci_lo"], r["ci_hi"], r["p"])
        assert m.label == control and m.unit == "SyncR²" and c.numbers["difference"] == r["sync_diff"]
        if r["p"] < claims.LEVEL and r["sync_diff"] > 0 and control == "passive":
            # "crucially depends": the reader falls to the surrogate null (COLLAPSES), else partly
            assert c.numbers["null_quantile"] == pytest.approx(null)
            into = r["sync_control"] <= null
            assert (c.verdict, c.reason) == ((AGREES, "collapses") if into else (PARTLY, "above-null"))
        elif r["p"] < claims.LEVEL and r["sync_diff"] > 0:
            assert (c.verdict, c.reason) == (AGREES, "above")
        elif r["p"] < claims.LEVEL:
            assert (c.verdict, c.reason) == (DIFFERS, "below")
        else:
            assert c.reason in ("not-detected", "not-found-powered") and c.numbers["mde_corrected"] > 0
    # the passive reader against the paper's difference, an assumption: the paired values it needs
    p = claims.passive(t).numbers
    assert p["paper_difference"] == claims.ASSUMED_PAPER_DIFFERENCE
    assert p["n_needed"] == power.n_pairs_needed(claims.ASSUMED_PAPER_DIFFERENCE, table.loc["passive", "sd_diff"])
    lags = claims.lags(t)
    names = [c for c in table.index if c.startswith("lag")]
    assert [m.label for m in lags.measures] == names and [g["control"] for g in lags.numbers["lags"]] == names
    verdicts = [g["verdict"] for g in lags.numbers["lags"]]
    assert lags.verdict == (AGREES if all(v == AGREES for v in verdicts) else
                            DIFFERS if DIFFERS in verdicts else
                            PARTLY if set(verdicts) <= {AGREES, PARTLY} else CANNOT)
    for g in lags.numbers["lags"]:  # "collapses": below genuine and into the surrogate null
        if g["reason"] in ("collapses", "above-null"):
            assert (g["control_value"] <= g["null_quantile"]) == (g["reason"] == "collapses")


@pytest.mark.slow
def test_control_lines_are_worded_from_the_larger_p(res, executed):
    """The controls page quotes the p that counts (p_text: with the Holm-adjusted one, linked to the one
    description of the tests on the power page) and the gap's interval over episodes."""
    text = page(executed, "fig03_04_controls")
    table = res.tests("controls").set_index("control")
    for control in ("passive", "shuffled"):
        c = res.claim(control)
        line = claim_line(text, c["what"])
        (m,) = c["measures"]
        r = table.loc[control]
        assert notebook.p_text(m) in line and "([test](#claims-test))" in line
        assert "split-seed values" not in line and "the larger of" not in line
        assert f"95 % interval {r['ci_lo']:.3f} to {r['ci_hi']:.3f} over episodes" in line
        if c["reason"] == "above":
            assert f"**agrees**: the embedded models show genuine above {control} by {r['sync_diff']:.3f}" in line \
                or f"**agrees**: this run shows genuine above {control} by {r['sync_diff']:.3f}" in line
        elif c["reason"] in ("collapses", "above-null"):  # the rule's numbers, as the claim has them
            n = c["numbers"]
            assert f"genuine above {control} by {r['sync_diff']:.3f}" in line
            assert f"{n['control_value']:.3f}" in line and f"95th percentile ({n['null_quantile']:.3f}" in line
        else:
            assert f"about {r['mde_corrected']:.3f}" in line


def test_a_control_equal_to_genuine_in_every_value_allows_no_test(t, res, published, tmp_path):
    """The old default run clipped every R² to 0: genuine equals each control in every paired value, and
    the claim says so (no measure, no test) instead of printing n/a; without the condition, "absent"."""
    flat = t.controls.assign(mean_genuine=0.0, mean_control=0.0, mean_diff=0.0, sd_diff=0.0, mde=np.nan,
                             mde_corrected=np.nan, p_t=np.nan, p_perm=1.0, p_corrected=np.nan, p_episodes=1.0, p=1.0)
    t.controls = flat
    c = claims.passive(t)
    assert (c.verdict, c.reason, c.measures) == (CANNOT, "equal", ())
    lags = claims.lags(t)
    assert lags.verdict == CANNOT and [g["reason"] for g in lags.numbers["lags"]].count("equal") == 2
    # the page words the branch from the claim's reason and numbers
    root = copy_results(res.root, tmp_path / "flat")
    rewrite_claims(root, t)
    text = run_page("fig03_04_controls", results_dir=str(root)).text
    line = claim_line(text, res.claim("passive")["what"])
    assert "**cannot test**" in line and "equal in all" in line and "no test or detectable size" in line
    assert claim_line(text, res.claim("lags")["what"]).count("equal in all") == 2
    t.controls = flat[flat["control"] != "passive"]
    none = claims.passive(t)
    assert (none.verdict, none.reason) == (CANNOT, "absent")


# --------------------------------------------------------------------------- relationships (figure 5)
def _scenarios(table):
    return lambda self, with_values=True: dict(table)


def test_relationships_confounded_with_scenario_cannot_be_spoken_to(t, res, monkeypatch):
    cls = type(res)
    monkeypatch.setattr(cls, "relationship_scenarios", _scenarios({"stranger": 2, "friend": 6, "acquaintance": 4}))
    c = claims.relationships(t)
    assert (c.verdict, c.reason) == (CANNOT, "confounded")
    assert c.numbers["scenarios"] == {"stranger": 2, "friend": 6, "acquaintance": 4}
    means = res.closeness_means().dropna().mean(axis=1)
    corr = stats.pearson(means.index.to_numpy(float), means.to_numpy(float))
    assert c.numbers["n"] == corr.n and (c.numbers["r"] == corr.r or not corr.ok)
    # family_member (code 5) is listed apart and, kept out of the correlation, cannot make it untestable
    monkeypatch.setattr(cls, "relationship_scenarios", _scenarios({"stranger": 5, "friend": 5, "family_member": 1}))
    c = claims.relationships(t)
    assert c.numbers["other_scenarios"] == {"family_member": 1} and c.reason != "confounded"
    monkeypatch.setattr(cls, "relationship_scenarios", _scenarios({k: 5 for k in ("stranger", "friend")}))
    c = claims.relationships(t)
    assert c.verdict in claims.VERDICTS and c.reason != "confounded"


@pytest.mark.slow
def test_the_relationship_page_says_why_it_cannot_be_spoken_to(res, executed):
    """The tiny results' categories come from one scenario each: the page names them and the correlation."""
    c = res.claim("relationships")
    n = c["numbers"]
    line = claim_line(page(executed, "fig05_relationship"), c["what"])
    r = stats.Correlation(r=n["r"], p=n["p"], n=n["n"], reason=n["reason_r"])
    assert r.describe() in line and f"over the {r.n} of them" in line
    if c["reason"] == "confounded":
        few = [k for k, v in n["scenarios"].items() if v < 3]
        assert f"confounded with scenario: {', '.join(few)} come from fewer than 3" in line
    if n["other_scenarios"]:
        other = ", ".join(f"{k} {v}" for k, v in n["other_scenarios"].items())
        assert f"(outside the five codes, not in the correlation: {other})" in line


def test_relationship_closeness_is_over_the_papers_five_categories(t, res, monkeypatch):
    """One point per category that every model pair has, codes 0-4, each the mean of the pairs' means;
    family_member (5) stays out of the correlation."""
    table = res.relationship_table()
    per = table[table["code"].between(0, 4)].groupby(["code", "pair"])["sync"].mean().unstack("pair").dropna()
    means = per.mean(axis=1)
    c = claims.relationships(t)
    assert c.numbers["n"] == len(means)
    if np.isfinite(c.numbers["r"]):
        assert c.numbers["r"] == pytest.approx(np.corrcoef(means.index, means.to_numpy())[0, 1])
    with_family = pd.concat([table, table.assign(code=5, relationship="family_member", sync=99.0)])
    with_family.attrs["present"] = True
    monkeypatch.setattr(type(res), "relationship_table", lambda self: with_family)
    again = claims.relationships(t)
    assert again.numbers["n"] == c.numbers["n"]
    assert again.numbers["r"] == c.numbers["r"] or not np.isfinite(c.numbers["r"])


def test_relationship_closeness_does_not_mix_pairs(t, res, monkeypatch):
    """A planted answer: closeness does nothing within either pair, but the pair with the higher SyncR²
    has only the distant categories. Pooling the samples would find a strong negative r (the issue's
    -0.86); over the categories both pairs have, each the mean of the pairs' means, r is undefined
    (every category the same), and within each pair it is undefined."""
    rows = []
    for pair, level, codes in (("P1", 0.5, (0, 1, 2)), ("P2", 0.1, (0, 1, 2, 3, 4))):
        for code in codes:
            rows += [{"pair": pair, "code": code, "relationship": str(code), "sync": level + d} for d in (-0.01, 0.01)]
    planted = pd.DataFrame(rows)
    planted.attrs["present"] = True
    pooled = planted.groupby("code")["sync"].mean()
    assert np.corrcoef(pooled.index, pooled.to_numpy())[0, 1] < -0.7
    monkeypatch.setattr(type(res), "relationship_table", lambda self: planted)
    monkeypatch.setattr(type(res), "relationship_scenarios", _scenarios({}))
    c = claims.relationships(t)
    assert c.numbers["n"] == 3 and not np.isfinite(c.numbers["r"]) and c.measures == ()
    assert set(c.numbers["within"]) == {"P1", "P2"}
    assert not any(np.isfinite(w["r"]) for w in c.numbers["within"].values())
    assert (c.verdict, c.reason) == (CANNOT, "few-categories")


# --------------------------------------------------------------------------- clipping (figure 8)
@pytest.mark.parametrize("kept_paper, kept_run, verdict, reason", [
    (-0.4, 0.3, PARTLY, "paper-penalty-only"), (-0.4, 0.2, AGREES, "lowers"), (0.3, 0.3, DIFFERS, "not-lowers"),
    (0.298, 0.2, PARTLY, "run-penalty-only")])
def test_clipping_verdict_from_both_penalties(t, res, monkeypatch, tmp_path, kept_paper, kept_run, verdict, reason):
    """Figure 8: the effect at the paper's λ = 0.1 and at the run's own penalty; "agrees" only where
    keeping negatives lowers SyncR² (by more than LOWERS_BY) at both, "partly" at one; no test."""
    rows = []
    for penalty, kept in (("paper", kept_paper), ("run", kept_run)):
        for method, mean, se in (("clipped at 0", 0.3, 0.01), ("kept", kept, 0.05 if penalty == "paper" else 0.01)):
            rows.append({"pair": "S-S", "family": "x", "model_a": "a", "model_b": "b", "orders": 1,
                         "penalty": penalty, "method": method, "mean": mean, "se": se})
    monkeypatch.setattr(type(res), "clipping_table", lambda self: pd.DataFrame(rows))
    monkeypatch.setattr(type(res), "penalty_label", lambda self: "λ chosen by cross-validation")
    c = claims.clipping(t)
    assert (c.verdict, c.reason, c.measures) == (verdict, reason, ())
    p, o = c.numbers["paper"], c.numbers["run"]
    assert (p["clipped"], p["kept"], p["n_pairs"], p["alpha"]) == (0.3, kept_paper, 1, PAPER_ALPHA)
    assert p["se_ratio"] == pytest.approx(5.0) and (o["clipped"], o["kept"]) == (0.3, kept_run)
    # the page, from the claim's numbers
    root = copy_results(res.root, tmp_path / "clip")
    rewrite_claims(root, t)
    line = claim_line(run_page("fig08_clipping", results_dir=str(root)).text, res.claim("clipping")["what"])
    assert f"**{verdict}**" in line and "λ = 0.1" in line and "no test" in line
    if kept_paper == -0.4:
        assert "from 0.30 to -0.40" in line and "by a factor of 5.0" in line
    assert f"At this run's own penalty (λ chosen by cross-validation) the two are 0.30 and {kept_run:.2f}" in line


# --------------------------------------------------------------------------- settings, ToM (tables 2, 5, figure 11)
def test_setting_and_tom_tests_by_hand(res):
    """Table 2 like with like (issue 74, item 2): a persona split and an episode split of one seed are unrelated
    partitions, so each side is averaged over its own seeds and the runs x directions get a paired t-test, beside
    the episode bootstrap of the difference on the surrogate test's rows (the same draws), the larger p.  Table 5:
    the episode bootstrap, and with two or more split seeds the corrected re-split test, the larger p.  Figure 11
    per decoder."""
    units, draws = [], []
    for name in res.run_names:
        ds = res.analysis(name)
        a = ds["persona_disjoint_sync_r2_per_seed"].transpose("direction", "split_seed").values
        b = ds["sync_r2_per_seed"].sel(condition="genuine").transpose("direction", "split_seed").values
        units += list(np.nanmean(a, 1) - np.nanmean(b, 1))
        draws.append((ds["persona_disjoint_surrogate_genuine_boot"] - ds["surrogate_genuine_boot"]).values)
    ref = power.corrected_resampled_test(np.array(units), 0.0)
    got = power.setting_test(res, "persona")
    gb = np.nanmean(np.concatenate(draws), axis=0)
    assert got["p_units"] == pytest.approx(ref["p"], nan_ok=True) and got["n"] == ref["n"] == 2 * len(res.run_names)
    assert got["p_episodes"] == pytest.approx(stats.bootstrap_p(gb[np.isfinite(gb)]))
    assert got["p"] == pytest.approx(max(got["p_units"], got["p_episodes"]), nan_ok=True)
    assert got["n_boot"] > 0 and got["ci_lo"] <= got["ci_hi"]
    nl = power.setting_test(res, "nonlinear")
    assert nl["n"] > 0 and nl["n_layer_pairs"] >= 1
    nl_draws = [res.analysis(n)["nonlinear_gap_boot"].values for n in res.runs_with("nonlinear_gap_boot")]
    if nl_draws:  # the episode bootstrap of the same difference: with one split seed the test alone
        gb = np.nanmean(np.concatenate(nl_draws), axis=0)
        assert nl["p_episodes"] == pytest.approx(stats.bootstrap_p(gb[np.isfinite(gb)])) and nl["n_boot"] > 0
        assert nl["p"] == (nl["p_episodes"] if nl["n_seeds"] < 2 else max(nl["p_corrected"], nl["p_episodes"]))
        assert nl["ci_lo"] <= nl["mean"] <= nl["ci_hi"] or nl["n_boot"] < 20
        assert claims.nonlinear(RunTests(res, {})).reason != "one-seed"
    elif nl["n_seeds"] < 2:
        assert np.isnan(nl["p"]) and claims.nonlinear(RunTests(res, {})).reason == "one-seed"
    t = power.tom_tests(res)
    assert len(t) == 6 and set(t["target"]) == {"emotion", "action"}
    row = t[(t["target"] == "emotion") & (t["relation"] == "self current")].iloc[0]
    d = np.concatenate([(res.analysis(n)["tom_kl_baseline"] - res.analysis(n)["tom_kl_best"])
                        .sel(tom_target="emotion", tom_relation="self_current").values.ravel()
                        for n in res.runs_with("tom_kl_best")])
    assert row["mean"] == pytest.approx(np.nanmean(d))
    with pytest.raises(ValueError, match="setting"):
        power.setting_test(res, "lag")
    # the claims' ToM test is this table: decoders above the baseline at p < 0.05, unadjusted
    pd.testing.assert_frame_equal(res.tests("tom").reset_index(drop=True), t.reset_index(drop=True),
                                  check_dtype=False)


def test_table5_agrees_when_the_mlp_is_worse_and_differs_when_better(t, monkeypatch):
    base = {"n": 8, "t": 3.0, "mde": 0.04, "n_layer_pairs": 4, "n_runs": 2, "n_seeds": 2}
    for mean, p, verdict in ((-0.09, 0.006, AGREES), (0.09, 0.006, DIFFERS), (0.01, 0.6, AGREES)):
        monkeypatch.setattr(power, "setting_test", lambda r, s, m=mean, q=p: {**base, "mean": m, "p": q})
        assert claims.nonlinear(t).verdict == verdict, (mean, p)
        assert claims.persona(t).verdict == (DIFFERS if p < 0.05 else AGREES)
        assert claims.nonlinear(t).measures[0].p == p
    monkeypatch.setattr(power, "setting_test", lambda r, s: {**base, "mean": 0.01, "p": 0.6, "mde": 0.2})
    assert (claims.nonlinear(t).verdict, claims.nonlinear(t).reason) == (CANNOT, "underpowered")
    monkeypatch.setattr(power, "setting_test", lambda r, s: {**base, "n": 1, "mean": 0.01, "p": np.nan})
    assert (claims.persona(t).verdict, claims.persona(t).reason) == (CANNOT, "few-values")


@pytest.mark.slow
def test_table5_reports_how_long_each_mlp_trained(res, executed):
    """Every fitted MLP has its early-stopped epochs and steps (table 5's page states them)."""
    training = res.mlp_training()
    fitted = sum(int((res.analysis(n)["nonlinear_epochs"] > 0).sum()) for n in res.runs_with("nonlinear_epochs"))
    assert len(training) == fitted > 0
    assert (training["epochs"] >= 1).all() and (training["epochs"] <= training["cap"]).all()
    assert (training["steps"] >= training["epochs"]).all()
    text = page(executed, "table5_nonlinear")
    assert (f"{int(training['epochs'].min())}-{int(training['epochs'].max())} epochs" in text
            and f"for the {len(training)} maps" in text)


# --------------------------------------------------------------------------- dataset sizes (figure 9)
@pytest.mark.slow
def test_one_count_of_dataset_sizes_on_every_page(res, executed):
    """The training samples per dataset used to read differently on five pages; every page now
    quotes Results.sample_counts, the analyses' own n_train / n_test."""
    counts = res.sample_counts()
    for name in res.run_names:
        ds = res.analysis(name)
        mine = counts[counts["run"] == name]
        assert len(mine) == int((ds["n_train"] > 0).sum())
        assert sorted(mine["n_train"]) == sorted(int(v) for v in ds["n_train"].values.ravel() if v > 0)
    pages = {stem: page(executed, stem) for stem in ("intro", "embedded_models", "power")}
    for cond, c in counts.groupby("condition"):
        lo, hi = int(c["n_train"].min()), int(c["n_train"].max())
        want = f"{lo}-{hi} for training" if lo != hi else f"{lo} for training"
        assert all(want in text for text in pages.values()), cond
    sentence = re.search(r"Samples per dataset, as the analysis split them[^.]*\.", pages["intro"])[0]
    assert all(sentence in text for text in pages.values())
    gen = counts[counts["condition"] == "genuine"]
    assert (f"| training samples per genuine dataset | {int(gen['n_train'].min())}-{int(gen['n_train'].max())} |"
            in pages["intro"])
    # figure 9's claim quotes each pair's size as the figure's last point does
    sizes = res.dataset_sizes()
    pair_of = {r.name: r.pair for r in res.runs}
    for pair, n in sizes.items():
        mine = gen[gen["run"].map(pair_of) == pair]
        assert n == int(round((mine["n_train"] + mine["n_test"]).mean()))
    c = res.claim("sample_size")
    assert c["numbers"]["sizes"] == sizes
    line = claim_line(page(executed, "fig09_sample_size"), c["what"])
    assert "genuine datasets hold " + ", ".join(f"{p} {n}" for p, n in sizes.items()) in line
    full = res.sample_size_table()
    full = full[full["point"] == "full run"]
    assert all(sizes[r.pair] == r.n_samples for r in full.itertuples())


# --------------------------------------------------------------------------- synchrony (figure 2)
def test_synchrony_is_tested_against_the_surrogates_not_zero(t, res, monkeypatch):
    """Figure 2's verdict reads genuine's place among its surrogate partners (power.surrogate_test)."""
    s = t.surrogates
    c = claims.synchrony(t)
    assert s["n_surrogates"] == 20 and s["p"] == max(s["p_rank"], s["p_episodes"])
    (m,) = c.measures
    assert (m.value, m.lo, m.hi, m.p) == (s["gap"], s["ci_lo"], s["ci_hi"], s["p"])
    above = s["p"] < claims.LEVEL and s["gap"] > 0
    assert c.verdict == ((AGREES if c.reason == "generalises" else PARTLY) if above else
                         CANNOT if s["p_floor"] >= claims.LEVEL else DIFFERS)
    t.surrogates = {**s, "genuine": 0.2, "surrogate_mean": 0.25, "surrogate_max": 0.4, "gap": -0.05, "p_rank": 0.6,
                    "p_episodes": 0.3, "p": 0.6, "p_floor": 0.01}
    assert (claims.synchrony(t).verdict, claims.synchrony(t).reason) == (DIFFERS, "not-above")
    t.surrogates = {**s, "gap": 0.01, "p": 0.2, "p_floor": 0.2}
    assert (claims.synchrony(t).verdict, claims.synchrony(t).reason) == (CANNOT, "floor")
    t.surrogates = {**s, "n_surrogates": 0}
    c = claims.synchrony(t)
    assert (c.verdict, c.reason, c.measures) == (CANNOT, "no-surrogates", ())
    monkeypatch.setattr(type(res), "sync_table", lambda self, *a, **k: pd.DataFrame({"pair": ["S-S"], "mean": [np.nan]}))
    assert claims.synchrony(t).reason == "no-genuine"


@pytest.mark.slow
def test_the_synchrony_page_quotes_the_surrogate_test(res, executed):
    c = res.claim("synchrony")
    s = c["numbers"]["surrogates"]
    line = claim_line(page(executed, "fig02_heatmaps"), c["what"])
    assert f"against {s['n_surrogates']} surrogate partners" in line
    assert notebook.p_text(c["measures"][0]) in line and "the larger of" not in line
    assert f"gap {fmt(s['gap'], 3)}, 95 % interval {fmt(s['ci_lo'], 3)} to {fmt(s['ci_hi'], 3)}" in line


@pytest.mark.parametrize("test_median, share, verdict", [(0.4, 0.9, AGREES), (0.05, 0.9, PARTLY),
                                                         (0.4, 0.6, PARTLY)])
def test_synchrony_above_surrogates_agrees_only_where_the_maps_generalise(t, res, monkeypatch, tmp_path,
                                                                          test_median, share, verdict):
    """Figure 2 claims high test R² that generalises: above the surrogates with maps that keep less than
    half their training R² (or with a quarter of the layer pairs negative) is "partly"."""
    t.surrogates = {**t.surrogates, "gap": 0.1, "p": 0.001, "p_floor": 0.01}
    summary = pd.DataFrame([{"run": "S-S", "pair": "S-S", "family": "x", "layer_pairs": 40, "train_median": 0.6,
                             "test_median": test_median, "gap_median": 0.6 - test_median, "gap_mean": 0.5,
                             "share_positive": share, "n_train": 100.0, "n_test": 30.0}])
    monkeypatch.setattr(type(res), "generalisation_summary", lambda self, table=None: summary)
    c = claims.synchrony(t)
    assert c.verdict == verdict and c.reason == ("generalises" if verdict == AGREES else "not-generalise")
    (g,) = c.numbers["generalisation"]
    assert g["kept"] == pytest.approx(test_median / 0.6) and g["share_positive"] == share
    root = copy_results(res.root, tmp_path / "gen")
    rewrite_claims(root, t)
    line = claim_line(run_page("fig02_heatmaps", results_dir=str(root)).text, res.claim("synchrony")["what"])
    assert f"**{verdict}**" in line and "the paper gives no number" in line
    assert f"median test R² {test_median:.3f} against training 0.600" in line
    monkeypatch.setattr(type(res), "generalisation_summary", lambda self, table=None: summary.iloc[:0])
    assert (claims.synchrony(t).verdict, claims.synchrony(t).reason) == (PARTLY, "generalisation-untested")


# --------------------------------------------------------------------------- the first page's scorecard
#: the full wording of the controls' test, which only the power page spells out
LONG_TEST = re.compile(r"the larger of the corrected re-split t-test over \d+ split-seed values and the bootstrap "
                       r"over \d+ episodes")


@pytest.mark.slow
def test_the_scorecard_has_one_row_per_claim_with_its_verdict(res, executed):
    """The first page's scorecard reads the claims' own evaluation: one row per claim, in order, each with
    the claim's verdict and a link to its figure's page."""
    header, *rows = scorecard(page(executed, "intro"))
    records = res.claims()
    assert "the paper (Mistral/Llama" in header and "this run (synthetic test data)" in header
    assert "95 % interval" in header and len(rows) == len(records)
    for row, c in zip(rows, records):
        assert cells(row)[-1] == f"**{c['verdict']}**" and c["verdict"].split(",")[0] in claims.VERDICTS
        assert f"]({c['page']}.ipynb)" in cells(row)[0] and c["what"].rsplit(" (", 1)[0] in cells(row)[0]
        assert "nan" not in row.lower() and "n/a" not in row


@pytest.mark.slow
def test_the_scorecards_numbers_are_the_claims(res, published, executed):
    """This run's values and intervals are the evaluated claims' (the episode bootstrap of the gaps), and
    the paper's come from data/published.json."""
    rows = {c["id"]: cells(r) for c, r in zip(res.claims(), scorecard(page(executed, "intro"))[1:])}
    table = res.tests("controls").set_index("control")
    r = table.loc["passive"]
    _, paper, run, interval, _ = rows["passive"]
    assert f"{r['sync_diff']:.3f}" in run and stats.p_clause(r["p"]) in run
    # the interval over resampled episodes (maps fixed) and the corrected re-split one (maps refitted), each named
    assert interval == (f"{r['ci_lo']:.3f} to {r['ci_hi']:.3f} (episodes), {r['ci_split_lo']:.3f} to "
                        f"{r['ci_split_hi']:.3f} (re-splits)") and paper == published["fig3_4"]["claim_passive"]
    for c in (c for c in table.index if c.startswith("lag")):
        assert f"{c}: {table.loc[c, 'ci_lo']:.3f} to {table.loc[c, 'ci_hi']:.3f}" in rows["lags"][3]
    s = res.claim("synchrony")["numbers"]["surrogates"]
    assert f"{s['gap']:.3f}" in rows["synchrony"][2] and rows["synchrony"][3] == f"{s['ci_lo']:.3f} to {s['ci_hi']:.3f}"
    social = rows["social"][1]
    assert all(f"{x['r']:.2f}" in social for x in published["fig6"]["pearson"])
    assert all(f"{x['musr']:.2f}" in social for x in published["table1"]["partial_r"])
    (m,) = res.claim("persona")["measures"]
    assert f"{m['value']:.3f}" in rows["persona"][2] and rows["persona"][3] == "—"
    d = power.setting_test(res, "persona")
    assert m["value"] == pytest.approx(d["mean"]) and m["p"] == pytest.approx(d["p"], nan_ok=True)
    assert all(f"{x['original'][0]:.2f} → {x['persona-disjoint'][0]:.2f}" in rows["persona"][1]
               for x in published["table2"]["rows"])


def _overview_data(spec: dict) -> pd.DataFrame:
    (rows,) = [v for v in spec["datasets"].values()]
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_the_overview_names_its_caveats_and_chart(res, executed):
    """Three sentences of caveats from the run (the passive reader's share, the sizes, how many claims
    cannot be tested), the chart with its caption, then the scorecard."""
    path, _ = executed["intro"]
    text = page(executed, "intro")
    g, p = res.sync_table(), res.sync_table("passive")
    both = g.merge(p, on="pair", suffixes=("_g", "_p"))
    both = both[np.isfinite(both["mean_g"]) & np.isfinite(both["mean_p"]) & (both["mean_g"] > 0)]
    share = 100 * (both["mean_p"] / both["mean_g"]).mean()
    assert f"keeps {share:.0f} % of genuine SyncR²" in text
    records = res.claims()
    n_cannot = sum(c["verdict"] == CANNOT for c in records)
    assert f"so {n_cannot} of the {len(records)} claims below read *cannot test*" in text
    assert "against the paper's 6,500" in text
    assert text.index("Read this first") < text.index("Genuine SyncR² and every control for each ordered run") \
        < text.index("| claim")
    (spec,) = [s for s in executed_charts(path) if "per ordered run" in json.dumps(s.get("title"))]
    frame = _overview_data(spec)
    assert {"genuine", "passive", "shuffled", "pseudo", "surrogates"} <= set(frame["condition"])
    assert set(frame["run"]) == set(res.run_names) and (frame["lo"] <= frame["hi"]).all()
    gen = frame[frame["condition"] == "genuine"].set_index("run")["mean"]
    by_run = res.sync_table(separate=True).set_index("pair")["mean"]
    assert np.allclose(gen.loc[by_run.index], by_run)


def _colour_encodings(spec):
    """Every colour encoding (color, fill, stroke, and their conditions' values) of a spec, at any depth."""
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key in ("color", "fill", "stroke") and isinstance(value, dict):
                yield value
                if isinstance(value.get("condition"), dict):
                    yield value["condition"]
            yield from _colour_encodings(value)
    elif isinstance(spec, list):
        for v in spec:
            yield from _colour_encodings(v)


@pytest.mark.slow
def test_a_colour_means_a_condition_on_every_page(res, executed):
    """Conditions take their own colours (theme.CONDITION_COLOURS); whatever else a chart colours (the
    first page's ordered runs, families, settings) takes none of them: the overview's second run was
    orange, the passive reader's colour on the controls page."""
    conditions = ["genuine", "passive", "lag1"]
    assert theme.colour_scale(conditions).range == [theme.CONDITION_COLOURS[c] for c in conditions]
    assert not set(theme.OTHER_COLOURS) & set(theme.CONDITION_COLOURS.values())
    assert theme.colour_scale(["S-S", "G-G", "S-S"]).to_dict() == {"domain": ["S-S", "G-G"],
                                                                   "range": list(theme.OTHER_COLOURS[:2])}
    assert theme.colour_scale(["G-G"], ["S-S", "S-G", "G-S", "G-G"]).to_dict() == {
        "domain": ["G-G"], "range": [theme.OTHER_COLOURS[3]]}  # a pair's colour is its first ordered run's
    (spec,) = [s for s in executed_charts(executed["intro"][0]) if "per ordered run" in json.dumps(s.get("title"))]
    runs = [c for c in _colour_encodings(spec) if c.get("field") == "run"]
    assert runs and all(set(c["scale"]["range"]) <= set(theme.OTHER_COLOURS) for c in runs)
    checked = 0
    colour_of: dict[str, set[tuple[str, str]]] = {}  # a run's or pair's colour on every page (they share names)
    for stem, (path, proc) in executed.items():
        assert proc.returncode == 0, stem
        for spec in executed_charts(path):
            for enc in _colour_encodings(spec):
                scale = enc.get("scale") or {}
                if "field" not in enc or not isinstance(scale.get("range"), list):
                    continue
                checked += 1
                domain = scale.get("domain")
                if domain and all(v in theme.CONDITION_COLOURS for v in domain):
                    assert scale["range"] == [theme.CONDITION_COLOURS[v] for v in domain], (stem, enc)
                else:
                    assert not set(scale["range"]) & set(theme.CONDITION_COLOURS.values()), (stem, enc)
                if enc["field"] in ("run", "pair") and domain:
                    for name, colour in zip(domain, scale["range"]):
                        colour_of.setdefault(name, set()).add((colour, stem))
    assert checked > 10
    # a pair or ordered run is drawn in one colour on every page (figure 2's scatter had S-S and G-G swapped)
    assert colour_of and all(len({c for c, _ in seen}) == 1 for seen in colour_of.values()), colour_of


def test_the_first_page_writes_the_readmes_overview_chart(tmp_path, res):
    """The first page draws the overview and, asked to (``overview_png``), writes it as a PNG for the README;
    it is the book's root page."""
    png = tmp_path / "overview.png"
    shown = run_page("intro", results_dir=str(res.root), overview_png=str(png))
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert any("per ordered run" in json.dumps(s.get("title")) for s in shown.charts)
    assert "root: book/executed/intro" in (REPO_ROOT / "_toc.yml").read_text()


@pytest.mark.slow
def test_the_tests_full_wording_is_on_the_power_page_only(executed):
    """The claims say "p = ... (test)" and link to the power page's section, the one place that spells
    out the test in full."""
    assert len(LONG_TEST.findall(page(executed, "power"))) == 1
    others = ["intro"] + sorted({p for _, p, _, _ in claims.CLAIMS})
    assert not any(LONG_TEST.search(page(executed, stem)) for stem in others)
    rows = scorecard(page(executed, "intro"))[1:]
    assert rows and all("the larger of" not in row for row in rows)
    assert "(#claims-test)" in page(executed, "intro")
    nb = (NOTEBOOK_DIR / "power.md").read_text()
    assert "(claims-test)=\n## " in nb


def test_the_overview_of_a_run_without_a_fitted_map(tmp_path, published):
    """Every grid NaN (the paper's 6,500 samples on a tiny run): the claims are judged without raising, the
    overview says so, in words, and its chart has nothing to draw (the renderer writes a sentence)."""
    root = build_synthetic_results(tmp_path / "r", pairs=SYNTHETIC_PAIRS[:1], n_seeds=1, n_episodes=4, n_rounds=2,
                                   analyze_kwargs=dict(lags=(), n_samples=6500))
    claims.write(results.load_results(root), published)
    shown = run_page("intro", results_dir=str(root), overview_png=str(tmp_path / "overview.png"))
    text = shown.text
    assert not re.search(r"(?<![\w.])(nan|NaN|inf|None)(?![\w])", text), text
    assert "no dataset split into training and test samples" in text and "the chart is empty" in text
    (spec,) = [s for s in shown.charts if "per ordered run" in json.dumps(s.get("title"))]
    assert notebook.nothing_to_draw(spec) and (tmp_path / "overview.png").stat().st_size > 0


def test_claim_verdicts_read_holm_adjusted_p_across_every_claim(t, res, monkeypatch, tmp_path):
    """A planted p: table 2's difference at p = 0.033 (the issue's) with a minimum detectable difference
    of 0.108 is a finding alone, but not after Holm's adjustment across the tests of every claim: the claim
    reads "inconclusive, leaning differs" (issue 74: not a plain "cannot test"); the first page's scorecard
    and table 2's page judge it alike and quote both p."""
    monkeypatch.setattr(power, "setting_test", lambda r, s: {"n": 8, "t": 2.6, "mde": 0.108, "n_layer_pairs": 0,
                                                             "n_runs": 2, "n_seeds": 2, "mean": 0.04, "p": 0.033})
    alone = claims.persona(t)
    assert (alone.verdict, alone.reason) == (DIFFERS, "difference")
    every = claims.evaluate(t)
    ps = np.array([m.p for c in every for m in c.measures if np.isfinite(m.p)])
    assert len(ps) >= 3
    first = every[[fn for fn, *_ in claims.CLAIMS].index(claims.persona)]
    assert (first.verdict, first.leaning, first.reason) == (claims.INCONCLUSIVE, DIFFERS, "underpowered")
    assert first.shown == "inconclusive, leaning differs"
    assert first.measures[0].p_holm == pytest.approx(stats.holm(ps)[np.flatnonzero(ps == 0.033)].max())
    assert claims.persona(t).verdict == CANNOT  # t now reads the adjusted p
    root = copy_results(res.root, tmp_path / "holm")
    rewrite_claims(root, t)
    planted = results.load_results(root)
    assert planted.n_claim_tests == len(ps)
    m = planted.claim("persona")["measures"][0]
    assert f"Holm-adjusted {m['p_holm']:.2f}" in notebook.p_text(m)
    line = claim_line(run_page("table2_persona_disjoint", results_dir=str(root)).text, planted.claim("persona")["what"])
    assert "**inconclusive, leaning differs**" in line and f"Holm-adjusted {m['p_holm']:.2f}" in line
    assert "p = 0.033" in line
    intro = run_page("intro", results_dir=str(root)).text
    rows = {c["id"]: cells(r) for c, r in zip(planted.claims(), scorecard(intro)[1:])}
    assert rows["persona"][-1] == "**inconclusive, leaning differs**"
    assert f"Holm-adjusted {m['p_holm']:.2f}" in rows["persona"][2] and "p = 0.033" in rows["persona"][2]


# --------------------------------------------------------------------------- claims.json
def _same(a, b) -> bool:
    """Two JSON values equal, NaN equal to NaN."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def test_claims_json_round_trip(res, published, tmp_path):
    """What claims.write writes, Results.claims / claim / tests read back: the same verdicts, reasons,
    measures (with their Holm-adjusted p), numbers and tables of tests as evaluated on the run."""
    root = copy_results(res.root, tmp_path / "r")
    (root / "claims.json").unlink()
    fresh = results.load_results(root)
    with pytest.raises(results.ResultsError, match="claims.json is missing"):
        fresh.claims()
    path = claims.write(fresh, published, ability_scores=ABILITIES)
    assert path == root / "claims.json" and not (root / "claims.tmp").exists()
    back = results.load_results(root)
    t = RunTests(results.load_results(root), published, ability_scores=ABILITIES)
    evaluated = claims.evaluate(t)
    assert len(back.claims()) == len(evaluated) == len(claims.CLAIMS)
    for record, c, (fn, page, keys, what) in zip(back.claims(), evaluated, claims.CLAIMS):
        assert record["id"] == fn.__name__ and back.claim(fn.__name__) == record
        assert (record["page"], record["keys"], record["verdict"], record["reason"]) == (page, list(keys), c.shown,
                                                                                          c.reason)
        assert record["leaning"] == c.leaning and (c.verdict == claims.INCONCLUSIVE) == bool(c.leaning)
        assert record["what"] == what.format(n=published["fig9"]["n_samples"])
        assert _same(record["measures"], claims._plain([dataclasses.asdict(m) for m in c.measures])), fn.__name__
        assert _same(record["numbers"], json.loads(json.dumps(claims._plain(c.numbers)))), fn.__name__
        for m in record["measures"]:
            assert set(m) == {f.name for f in dataclasses.fields(claims.Measure)}
    assert back.n_claim_tests == sum(np.isfinite(m.p) for c in evaluated for m in c.measures)
    assert back.claim_inputs() == {"ability_scores": ABILITIES, "ratings": None, "judge_scores": None}
    tables = claims.test_tables(t)
    assert tables.keys() >= {"controls", "controls_seed_average", "controls_by_run", "surrogates", "surrogate_values",
                             "intervals", "trends", "social_correlations", "judged_runs", "partial", "abilities",
                             "topk_correlations", "tom", "planted", "cka_null"}
    for name, frame in tables.items():
        got = back.tests(name)
        assert list(got.columns) == [str(c) for c in frame.columns], name
        assert len(got) == len(frame), name
        want = pd.DataFrame(json.loads(json.dumps(claims._plain(frame)))["rows"], columns=got.columns)
        pd.testing.assert_frame_equal(got, want, check_dtype=False, obj=name)
        for col in frame.select_dtypes("number").columns:
            np.testing.assert_allclose(got[str(col)].to_numpy(float), frame[col].to_numpy(float), err_msg=name)
        assert _same(dict(got.attrs), json.loads(json.dumps(claims._plain(dict(frame.attrs))))), name
    assert back.tests("planted").attrs.get("runs") == [r.name for r in res.runs] or back.tests("planted").empty
    with pytest.raises(KeyError, match="no table of tests"):
        back.tests("nothing")
    copy = back.tests("controls")
    copy.loc[:, "p"] = -1.0
    assert (back.tests("controls")["p"] != -1.0).all()  # each call a copy: a page cannot change the run's tests


@pytest.mark.slow
def test_the_first_page_says_which_bars_rest_on_fewer_samples(res, executed):
    """Issue 74: the overview draws each condition on its own samples; where a control has fewer training
    samples than genuine (the lags), its caption gives both counts (the mean over directions and split seeds, per
    ordered run), so that a bar's distance from genuine is not read as the tested gap."""
    n = {c: [float(res.analysis(r.name)["n_train"].sel(condition=c).mean()) for r in res.runs]
         for c in ("genuine", "lag1")}
    assert any(a < g - 0.5 for a, g in zip(n["lag1"], n["genuine"])), "the tiny results' lags have fewer rows"
    text = " ".join(page(executed, "intro").split())
    span = {c: fmt(min(v), 0) if round(min(v)) == round(max(v)) else f"{fmt(min(v), 0)}-{fmt(max(v), 0)}"
            for c, v in n.items()}
    assert "Each bar is fitted on its condition's own samples" in text
    said = text[text.index("Each bar is fitted"):][:400]
    assert f"genuine {span['genuine']}, lag 1 {span['lag1']}" in said, said  # split() takes the no-break space


@pytest.mark.slow
def test_figure_2_says_the_surrogate_tests_genuine_is_on_other_rows(res, executed):
    """Issue 74: the surrogate test's genuine (its rows, its first split seeds) beside the headline per pair is
    named as such."""
    s = res.claim("synchrony")["numbers"]["surrogates"]
    line = claim_line(page(executed, "fig02_heatmaps"), res.claim("synchrony")["what"])
    assert f"genuine {fmt(s['genuine'])} on the surrogates' rows and first" in line
