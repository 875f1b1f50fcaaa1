"""synclib.analysis.power (paired control tests, minimum detectable differences, the planted differences'
power curve), synclib.analysis.planted and the pages' tables and sentences of the tests (notebooks/power.md,
notebooks/fig03_04_controls.md, run here on the tests the claims step keeps in claims.json)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from pages import copy_results, plant_test, rewrite_claims, run_page
from synclib.analysis import claims, power, results
from synthetic import SYNTHETIC_PAIRS, build_synthetic_results


def brute_force_sign_flip(d) -> float:
    """Every sign vector, one at a time."""
    d = np.asarray(d, dtype=float)
    obs = abs(d.mean())
    hits = total = 0
    for signs in itertools.product((1.0, -1.0), repeat=len(d)):
        total += 1
        hits += abs(np.mean(np.array(signs) * d)) >= obs - 1e-12
    return hits / total


# --------------------------------------------------------------------------- sign flips
@pytest.mark.parametrize("d", [
    [0.3, -0.1, 0.25, 0.4, 0.05],
    [0.02, 0.01, 0.03, 0.015, -0.005, 0.04, 0.0, 0.022],  # a zero difference and a negative one
    [1.0, 1.0, 1.0, -1.0],  # ties in |d|
    [0.5],
])
def test_sign_flip_equals_brute_force(d):
    assert power.sign_flip_pvalue(d) == pytest.approx(brute_force_sign_flip(d), abs=1e-15)


def test_sign_flip_exact_values_and_edges():
    # all 5 positive: only the observed and the all-flipped vectors reach |mean|
    assert power.sign_flip_pvalue([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)
    assert power.sign_flip_pvalue([0.0, 0.0, 0.0]) == 1.0
    assert math.isnan(power.sign_flip_pvalue([]))
    assert power.sign_flip_pvalue([1.0, np.nan, 2.0]) == power.sign_flip_pvalue([1.0, 2.0])


def test_sign_flip_random_mode_is_seeded_and_close_to_exact():
    rng = np.random.default_rng(3)
    d = rng.normal(0.1, 0.3, size=17)
    exact = power.sign_flip_pvalue(d, exact_max_n=17)
    approx = power.sign_flip_pvalue(d)  # 17 > 16: 10,000 random sign vectors
    assert approx == power.sign_flip_pvalue(d)  # fixed seed: deterministic
    assert abs(approx - exact) < 0.02
    assert power.sign_flip_pvalue(np.full(30, 0.1)) == pytest.approx(1 / 10_001)  # never 0


# --------------------------------------------------------------------------- paired t
def test_paired_test_agrees_with_scipy():
    rng = np.random.default_rng(0)
    a = rng.normal(0.3, 0.1, 12)
    b = a - rng.normal(0.05, 0.05, 12)
    out = power.paired_test(a, b)
    ref = sps.ttest_rel(a, b)
    assert out["t"] == pytest.approx(ref.statistic, rel=1e-12)
    assert out["p_t"] == pytest.approx(ref.pvalue, rel=1e-12)
    assert out["n_pairs"] == 12
    assert out["mean_diff"] == pytest.approx(np.mean(a - b))
    assert out["sd_diff"] == pytest.approx(np.std(a - b, ddof=1))
    assert out["p_perm"] == pytest.approx(power.sign_flip_pvalue(a - b))
    assert out["mde"] == pytest.approx(power.mde_paired(out["sd_diff"], 12))


def test_paired_test_drops_nonfinite_pairs_and_degenerate_cases():
    out = power.paired_test([1.0, 2.0, np.nan, 4.0], [0.5, 1.0, 1.0, np.inf])
    assert out["n_pairs"] == 2
    flat = power.paired_test([1.0, 1.0, 1.0], [0.0, 0.0, 0.0])  # no variance: no t, no mde
    assert math.isnan(flat["t"]) and math.isnan(flat["p_t"]) and math.isnan(flat["mde"])
    with pytest.raises(ValueError):
        power.paired_test([1, 2], [1, 2, 3])


# --------------------------------------------------------------------------- minimum detectable difference
def test_mde_shrinks_with_n_and_scales_with_sd():
    ns = [3, 5, 8, 12, 24, 50, 200]
    m = [power.mde_paired(1.0, n) for n in ns]
    assert all(x > y for x, y in itertools.pairwise(m))
    for n in (4, 24):
        assert power.mde_paired(0.3, n) == pytest.approx(0.3 * power.mde_paired(1.0, n), rel=1e-8)
        # the normal approximation is (z_.975 + z_.8) sd / sqrt(n), below the t-test's
        z = sps.norm.ppf(0.975) + sps.norm.ppf(0.8)
        assert power.mde_paired(0.3, n, method="normal") == pytest.approx(z * 0.3 / math.sqrt(n))
        assert power.mde_paired(0.3, n, method="normal") < power.mde_paired(0.3, n)
    assert math.isnan(power.mde_paired(1.0, 1)) and math.isnan(power.mde_paired(np.nan, 10))


@pytest.mark.parametrize("n", [2, 5, 24])
def test_mde_has_the_asked_power(n):
    """At the mde, the t-test's power (noncentral t, both tails) is 0.8; checked by simulation too."""
    sd = 0.04
    delta = power.mde_paired(sd, n)
    df, tc = n - 1, sps.t.ppf(0.975, n - 1)
    ncp = delta * math.sqrt(n) / sd
    assert sps.nct.sf(tc, df, ncp) + sps.nct.cdf(-tc, df, ncp) == pytest.approx(0.8, abs=1e-6)
    rng = np.random.default_rng(n)
    d = rng.normal(delta, sd, size=(20_000, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    assert np.mean(np.abs(t) > tc) == pytest.approx(0.8, abs=0.015)


def test_mde_matches_statsmodels():
    sm = pytest.importorskip("statsmodels.stats.power")
    for n in (6, 24, 100):
        es = sm.TTestPower().solve_power(nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
        assert power.mde_paired(0.02, n) == pytest.approx(es * 0.02, rel=1e-4)


def test_n_pairs_needed_is_the_first_n_that_reaches_the_difference():
    for diff, sd in ((0.1, 0.03), (0.1, 0.5), (0.02, 0.05)):
        n = power.n_pairs_needed(diff, sd)
        assert power.mde_paired(sd, n) <= diff
        assert n == 2 or power.mde_paired(sd, n - 1) > diff
    assert power.n_pairs_needed(0.0, 0.1) is None and power.n_pairs_needed(0.1, np.nan) is None


# --------------------------------------------------------------------------- a results directory
@pytest.fixture(scope="module")
def small_results(tmp_path_factory):
    """Two ordered runs (the cross pair in both orders), 48 episodes (enough for every condition
    at lag 2's count to leave 0), only the conditions block (genuine, passive, shuffled, pseudo,
    lag1, lag2), its claims judged: a few seconds, not minutes."""
    root = build_synthetic_results(
        tmp_path_factory.mktemp("power") / "results", pairs=SYNTHETIC_PAIRS[1:3], n_episodes=48,
        cube_kwargs={"tom": False},
        analyze_kwargs={"persona_disjoint": False, "relationship": False, "sample_sizes": None,
                        "nonlinear": False, "tom": False})
    claims.write(results.load_results(root), results.load_published())
    return results.load_results(root)


def test_control_table_has_one_row_per_control(small_results):
    res = small_results
    table = power.paired_control_tests(res)
    assert list(table.columns) == power.TABLE_COLUMNS
    assert list(table["control"]) == ["passive", "shuffled", "pseudo", "lag1", "lag2"]
    assert list(table["comparison"]) == [f"genuine - {c}" for c in table["control"]]
    ds = res.analysis(res.run_names[0])
    n_expected = len(res.runs) * ds.sizes["direction"] * ds.sizes["split_seed"]
    assert (table["n_pairs"] == n_expected).all() and (table["n_runs"] == len(res.runs)).all()
    for col in ("mean_genuine", "mean_control", "mean_diff", "sd_diff", "p_perm"):
        assert np.isfinite(table[col].to_numpy(float)).all(), col
    ok = table["sd_diff"] > 0
    assert ok.any()
    for col in ("t", "p_t", "mde", "mde_normal"):
        assert np.isfinite(table.loc[ok, col].to_numpy(float)).all(), col
    assert ((table["p_t"].dropna() >= 0) & (table["p_t"].dropna() <= 1)).all()
    assert ((table["p_perm"] > 0) & (table["p_perm"] <= 1)).all()


def test_corrected_resampled_test_by_hand():
    """Nadeau-Bengio: t = mean / (sd * sqrt(1/n + n_test/n_train)), n - 1 df, two-sided."""
    d = np.array([0.05, 0.07, 0.04, 0.06, 0.08, 0.05])
    n, ratio = 6, 0.25
    r = power.corrected_resampled_test(d, ratio)
    sd = np.std(d, ddof=1)
    t = d.mean() / (sd * np.sqrt(1 / n + ratio))
    assert r["n"] == n and r["mean"] == pytest.approx(d.mean())
    assert r["t"] == pytest.approx(t) and r["p"] == pytest.approx(2 * sps.t.sf(t, n - 1))
    assert r["p"] > sps.ttest_1samp(d, 0).pvalue  # the correction is more cautious than the plain test
    assert r["mde"] == pytest.approx(power.mde_paired(sd * np.sqrt(1 + n * ratio), n))
    assert np.isnan(power.corrected_resampled_test([0.1, 0.1, 0.1], ratio)["p"])  # no spread, no test
    assert np.isnan(power.corrected_resampled_test([0.1], ratio)["t"])


def test_paired_tests_by_run_and_the_corrected_columns(small_results, monkeypatch):
    res = small_results
    table = power.paired_control_tests(res, ["passive"])
    r = table.iloc[0]
    ratios = []
    for name in res.run_names:
        ds = res.analysis(name)
        a = ds["n_train"].sel(condition="passive").to_numpy().ravel()
        b = ds["n_test"].sel(condition="passive").to_numpy().ravel()
        ratios += list(b[a > 0] / a[a > 0])
    assert r["test_train_ratio"] == pytest.approx(np.mean(ratios))
    pv = power.paired_values(res, "passive")
    ref = power.corrected_resampled_test(pv["genuine"] - pv["control"], np.mean(ratios))
    assert r["p_corrected"] == pytest.approx(ref["p"]) and r["p_corrected"] > r["p_t"]
    assert np.isnan(power.paired_control_tests(res, ["passive"], unit="direction").iloc[0]["p_corrected"])
    by = power.paired_tests_by_run(res, ["passive", "lag1"])
    assert list(dict.fromkeys(by["run"])) == res.run_names + ["all runs"]
    one = by[(by["run"] == res.run_names[0]) & (by["control"] == "passive")].iloc[0]
    ds = res.analysis(res.run_names[0])
    assert one["n_pairs"] == ds.sizes["direction"] * ds.sizes["split_seed"]
    # the claims step keeps every control's tests per run; the controls page shows them, run by run
    pd.testing.assert_frame_equal(res.tests("controls_by_run"), power.paired_tests_by_run(res), check_dtype=False)
    monkeypatch.setattr(results.Results, "embedded", property(lambda self: True))
    shown = run_page("fig03_04_controls", results_dir=str(res.root))
    every = res.tests("controls_by_run")
    assert shown.text.count("the embedded models show genuine SyncR²") == len(res.run_names)
    (by_run,) = [t for t in shown.tables if "p (re-splits)" in getattr(t, "columns", ())]
    assert {"p (re-splits)", "p (episodes)"} <= set(by_run.columns) and len(by_run) == len(every)
    # every verdict is worded from the larger p of the two tests
    assert (every["p"] == every[["p_corrected", "p_episodes"]].max(axis=1)).all()
    assert "Each p is the larger of two tests" in shown.text


def test_episode_bootstrap_test_by_hand(small_results):
    """The dialog-level test: the difference of the contrast's SyncR² (genuine and the control on
    the rows both hold, reference aggregation) over runs and directions, resampled by whole
    episodes with the same draws for both sides."""
    res = small_results
    r = power.paired_control_tests(res, ["lag1"]).iloc[0]

    def side(n, var, s):
        return res.analysis(n)[var].sel(contrast="lag1", side=s)
    g = [side(n, "sync_r2_contrast_pooled", "genuine").values for n in res.run_names]
    c = [side(n, "sync_r2_contrast_pooled", "control").values for n in res.run_names]
    assert r["sync_diff"] == pytest.approx(np.mean(np.concatenate(g) - np.concatenate(c)))
    boots = np.concatenate([(side(n, "sync_r2_contrast_boot", "genuine") - side(n, "sync_r2_contrast_boot", "control"))
                            .transpose("direction", "boot").values for n in res.run_names])
    db = boots.mean(axis=0)
    p = min(1, 2 * min(1 + (db <= 0).sum(), 1 + (db >= 0).sum()) / (1 + db.size))
    assert r["p_episodes"] == pytest.approx(p) and r["n_boot"] == db.size
    # Efron's BCa: the share of draws below the estimate and the acceleration move the quantiles; the acceleration
    # from each episode's influence, the regression of the draws on the analysis' own draws of episodes, which
    # explain them (other counts would not)
    from scipy.stats import norm

    from synclib.stats import episode_draws

    counts = episode_draws(48, db.size).astype(float)
    X = counts - counts.mean(0)
    u, *_ = np.linalg.lstsq(X, db - db.mean(), rcond=None)
    explained = 1 - np.sum((db - db.mean() - X @ u) ** 2) / np.sum((db - db.mean()) ** 2)
    assert explained > 0.8
    u -= u.mean()
    a = np.sum(u ** 3) / (6 * np.sum(u ** 2) ** 1.5)
    z0 = norm.ppf((np.sum(db < r["sync_diff"]) + 0.5 * np.sum(db == r["sync_diff"])) / db.size)
    z = z0 + norm.ppf([0.025, 0.975])
    lo, hi = np.quantile(db, norm.cdf(z0 + z / (1 - a * z)))
    assert (r["ci_lo"], r["ci_hi"]) == pytest.approx((lo, hi)) and r["ci_lo"] <= r["sync_diff"] <= r["ci_hi"]
    # the corrected re-split interval of the per-seed gaps beside it
    se = abs(r["mean_diff"] / r["t_corrected"])  # Nadeau and Bengio's standard error
    half = sps.t.ppf(0.975, r["n_pairs"] - 1) * se
    assert (r["ci_split_lo"], r["ci_split_hi"]) == pytest.approx((r["mean_diff"] - half, r["mean_diff"] + half))
    assert r["n_episodes"] == 48  # the fixture's cubes
    assert r["p"] == max(r["p_corrected"], r["p_episodes"])


def test_episode_bootstrap_finds_no_difference_between_a_condition_and_itself(small_results):
    """A control that is the genuine data itself: every resample's difference is 0, p = 1."""
    res = small_results
    for n in res.run_names:
        ds = res.analysis(n)
        for v in ("sync_r2_contrast_boot", "sync_r2_contrast_pooled"):
            ds[v].loc[{"contrast": "shuffled", "side": "control"}] = ds[v].sel(contrast="shuffled", side="genuine").values
    try:
        r = power.episode_test(res, "shuffled")
        assert r["sync_diff"] == 0 and r["p_episodes"] == 1.0 and r["ci_lo"] == r["ci_hi"] == 0
    finally:
        res._analysis.clear()  # reload the files for the other tests


def test_control_table_pairs_by_run_direction_and_seed(small_results):
    res = small_results
    pv = power.paired_values(res, "passive")
    row = pv.iloc[0]
    per = res.analysis(row["run"])["sync_r2_contrast"].sel(contrast="passive")  # on the rows both hold
    sel = {"direction": row["direction"], "split_seed": row["split_seed"]}
    assert row["genuine"] == pytest.approx(float(per.sel(side="genuine", **sel)))
    assert row["control"] == pytest.approx(float(per.sel(side="control", **sel)))
    t = power.paired_control_tests(res, ["passive"]).iloc[0]
    ref = sps.ttest_rel(pv["genuine"], pv["control"])
    assert t["p_t"] == pytest.approx(ref.pvalue) and t["mean_diff"] == pytest.approx((pv["genuine"] - pv["control"]).mean())
    # seeds averaged: one value per run and direction, the seed means
    cons = power.paired_values(res, "passive", unit="direction")
    assert len(cons) == len(res.runs) * 2
    first = cons.iloc[0]
    m = pv[(pv["run"] == first["run"]) & (pv["direction"] == first["direction"])]
    assert first["genuine"] == pytest.approx(m["genuine"].mean())
    with pytest.raises(ValueError):
        power.paired_values(res, "passive", unit="episode")


def test_sample_sizes_and_sentences(small_results):
    res = small_results
    sizes = res.sample_sizes()
    assert 0 < sizes["n_train"] < sizes["n_samples"]
    assert sizes["n_runs"] == 2 and sizes["split_seeds"] == 3 and sizes["directions"] == 2
    table = power.paired_control_tests(res)
    shown = run_page("power", results_dir=str(res.root))
    text = shown.text
    passive = table.set_index("control").loc["passive"]
    assert f"{passive['mean_diff']:.3f}" in text and "stated assumption" in text
    assert f"this run has about {sizes['n_samples']:.0f}" in text
    both = pd.concat([table, power.paired_control_tests(res, unit="direction")], ignore_index=True)
    (shown_table,) = [t for t in shown.tables if "min. detectable difference" in t.columns]
    assert len(shown_table) == len(both)
    # one control's rows together, per split seed first
    assert list(shown_table.index[:2]) == [("passive", "per split seed"), ("passive", "seeds averaged")]
    assert shown_table.loc[("passive", "per split seed"), "difference"] == f"{passive['mean_diff']:.3f}"


def test_sentences_follow_the_numbers(small_results, tmp_path):
    """The power page words what the run can say about the paper's (assumed) passive difference from the
    controls' tests the claims step kept: planted here, noisy, then precise, then none."""
    res = small_results
    published = results.load_published()
    root = copy_results(res.root, tmp_path / "planted")
    real = power.paired_control_tests(res, ["passive"])
    base = real.assign(n_runs=4, mean_genuine=0.05, mean_control=0.04, t=1.0, mde_normal=np.nan, p_corrected=np.nan,
                       p_episodes=np.nan, p=np.nan, mde_corrected=np.nan, sync_diff=np.nan, ci_lo=np.nan,
                       ci_hi=np.nan, n_boot=0)
    noisy = base.assign(n_pairs=24, mean_diff=0.01, sd_diff=0.3, p_t=0.6, p_perm=0.6, mde=power.mde_paired(0.3, 24))
    sizes = res.sample_sizes()

    def page(controls):
        t = claims.RunTests(res, published)
        t.controls = controls
        plant_test(root, "controls", controls)
        rewrite_claims(root, t)
        return run_page("power", results_dir=str(root)).text

    text = page(noisy)
    assert "**cannot**" in text and f"{power.mde_paired(0.3, 24):.3f}" in text
    assert f"about {power.n_pairs_needed(claims.ASSUMED_PAPER_DIFFERENCE, 0.3)} paired values" in text
    assert "6,500" in text and f"about {sizes['n_samples']:.0f}" in text
    precise = noisy.assign(sd_diff=0.01, mde=power.mde_paired(0.01, 24), p_t=1e-5, p_perm=1e-4, mean_diff=0.08)
    text = page(precise)
    assert "**can**" in text and "finds genuine above passive" in text
    # a run without controls
    text = page(noisy.iloc[:0])
    assert "no control condition" in text and "this run has no passive condition" in text
