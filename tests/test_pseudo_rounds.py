"""Pseudo-dyads and synchrony per round (ours; issue 38 items 1 and 2), on synthetic cubes
with planted structure and against hand computations."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge

from synclib import stats
from synclib.analysis import AnalysisError, analyze, build_dataset
from synclib.analysis.ridge import r2_grid, resampled_r2
from synclib.analysis.samples import pseudo_partners
from synclib.analysis.scores import sync_r2, sync_r2_noclip
from synthetic import Planted, Shapes, make_synthetic_cube
from synclib.splits import episode_split

SMALL = dict(passive=False, tom=False, shapes=Shapes(layers_a=4, dim_a=16, layers_b=4, dim_b=16))
FIT = dict(split_seeds=(0, 1, 2), n_samples=None, progress=False, log=lambda m: None, alpha=1.0, n_boot=0, cka=False)


# --------------------------------------------------------------------------- the partner dialogs
def test_partners_are_the_same_task_under_the_next_seed():
    cube = make_synthetic_cube(n_episodes=5, n_seeds=3, **SMALL)
    cube = cube.assign_coords(sim_seed=[7, 2, 4])  # cube order is not seed order
    ep, seed, rule = pseudo_partners(cube)
    assert (ep == np.arange(5)[:, None]).all()
    # seeds ascending 2 -> 4 -> 7 -> 2: positions 1 -> 2 -> 0 -> 1
    assert seed[0].tolist() == [1, 2, 0]
    assert "same task" in rule


def test_one_seed_pairs_tasks_of_the_same_scenario_and_never_a_dialog_with_itself():
    cube = make_synthetic_cube(n_episodes=12, n_seeds=1, **SMALL)  # scenarios of 5, 5 and 2 tasks
    env = np.asarray(cube["env_id"].values)
    env[0], env[5] = "alone-0", "alone-5"  # two tasks alone in their scenario: paired with each other
    cube = cube.assign_coords(env_id=("episode", env))
    ep, seed, rule = pseudo_partners(cube)
    p = ep[:, 0]
    assert (seed == 0).all() and (p != np.arange(12)).all()
    assert sorted(p.tolist()) == list(range(12))          # every dialog is one dialog's partner
    assert p[0] == 5 and p[5] == 0 and p[1] == 2 and p[4] == 1 and p[10] == 11 and p[11] == 10
    assert (env[p] == env).sum() == 10
    assert "10 of 12 tasks" in rule


def test_one_dialog_has_no_partner():
    """pseudo_partners refuses one dialog; the dataset of a run of one dialog is empty and says
    why, so that such a run is analysed (its pseudo-dyads NaN) and its pages render."""
    cube = make_synthetic_cube(n_episodes=1, n_seeds=1, **SMALL)
    with pytest.raises(AnalysisError, match="pseudo-dyads need two dialogs"):
        pseudo_partners(cube)
    d = build_dataset(cube, "A->B", "pseudo")
    assert d.n == 0 and d.info["partner"] == "missing: the run has a single dialog, so there are no pseudo-dyads"
    assert build_dataset(cube, "A->B", "genuine").n > 0


@pytest.mark.parametrize("direction,shift", [("A->B", 0), ("B->A", 1)])
def test_pseudo_samples_take_the_partners_next_state(direction, shift):
    cube = make_synthetic_cube(n_episodes=6, n_seeds=2, **SMALL)
    d = build_dataset(cube, direction, "pseudo")
    g = build_dataset(cube, direction, "genuine")
    src, tgt = ("hidden_a", "hidden_b") if direction == "A->B" else ("hidden_b", "hidden_a")
    for i in range(0, d.n, 7):
        e, s, k = d.episode[i], d.sim_seed[i], d.round[i]
        x, y = d.take([i])
        np.testing.assert_array_equal(x[0], cube[src].values[e, s, k])
        np.testing.assert_array_equal(y[0], cube[tgt].values[e, 1 - s, k + shift])
    assert d.info["partner"] == "the same task under another simulation seed"
    assert d.n <= g.n  # a partner dialog that ended sooner drops samples


# --------------------------------------------------------------------------- planted structure
@pytest.mark.parametrize("seeds,shared_by,episodes", [(2, "task", 30), (1, "scenario", 60)])
def test_pseudo_dyads_find_no_synchrony_where_none_was_planted_across_dialogs(seeds, shared_by, episodes):
    cube = make_synthetic_cube(n_episodes=episodes, n_seeds=seeds, planted=Planted(shared=0.0, shared_by=shared_by),
                               **SMALL)
    out = analyze(cube, conditions=("genuine", "pseudo"), **FIT)
    assert (out["sync_r2"].sel(condition="genuine") > 0.15).all()
    assert (out["sync_r2"].sel(condition="pseudo") < 0.01).all()


@pytest.mark.parametrize("seeds,shared_by,episodes", [(2, "task", 30), (1, "scenario", 60)])
def test_pseudo_dyads_recover_synchrony_planted_across_dialogs(seeds, shared_by, episodes):
    """Every dialog of a task (seeds) or scenario (tasks) follows one latent path: agents that
    never talked share it, and the pseudo-dyads find most of the genuine synchrony."""
    cube = make_synthetic_cube(n_episodes=episodes, n_seeds=seeds, planted=Planted(shared=1.0, shared_by=shared_by),
                               **SMALL)
    out = analyze(cube, conditions=("genuine", "pseudo"), **FIT)
    pseudo, genuine = out["sync_r2"].sel(condition="pseudo"), out["sync_r2"].sel(condition="genuine")
    assert (pseudo > 0.05).all()
    assert (pseudo > 0.5 * genuine).all()
    assert out.attrs["pseudo_partner"].startswith("the same task" if seeds > 1 else "another task")


def test_the_shared_option_leaves_the_default_cube_unchanged():
    a = make_synthetic_cube(n_episodes=6, n_seeds=2, seed=3, **SMALL)
    b = make_synthetic_cube(n_episodes=6, n_seeds=2, seed=3, planted=Planted(shared=0.0), **SMALL)
    np.testing.assert_array_equal(a["hidden_b"].values, b["hidden_b"].values)
    with pytest.raises(ValueError, match="shared_by"):
        make_synthetic_cube(n_episodes=6, planted=Planted(shared=0.5, shared_by="seed"), **SMALL)


# --------------------------------------------------------------------------- per round
def test_a_rounds_r2_is_its_mse_over_the_test_sets_variance_and_they_average_to_the_test_r2():
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((60, 2, 5)), rng.standard_normal((60, 1, 4))
    Y[:, 0] += X[:, 0, :4] * 0.8
    tr, te = np.arange(40), np.arange(40, 60)
    rnd = np.arange(20) % 3
    fit = r2_grid(X, Y, tr, te, 2.0, test_groups=rnd)
    r2, (labels, loss, sizes) = fit.r2, (fit.test_loss.labels, fit.test_loss.loss, fit.test_loss.sizes)
    np.testing.assert_array_equal(labels, np.arange(3))
    yt = Y[te, 0]
    for r in range(3):
        m = rnd == r
        grid = resampled_r2(r2, loss, sizes, np.ones((1, 1)), drawn=np.array([r]))[0]
        for l in range(2):
            pred = Ridge(alpha=2.0).fit(X[tr, l], Y[tr, 0]).predict(X[te, l])
            hand = 1 - np.mean(((yt[m] - pred[m]) ** 2).mean(0) / yt.var(0))
            assert grid[l, 0] == pytest.approx(hand, abs=1e-5)
    per_round = np.stack([resampled_r2(r2, loss, sizes, np.ones((1, 1)), drawn=np.array([r]))[0] for r in range(3)])
    np.testing.assert_allclose(np.tensordot(sizes / sizes.sum(), per_round, 1), r2, atol=1e-10)


def test_the_round_score_of_the_analysis_equals_a_hand_computation():
    """sync_r2_round of one split seed: sklearn's ridge on the split's training samples, each
    round's R² over the test set's variance, each source layer at the target layer the whole
    test set chose (no maximum on the round), clip, mean; unclipped, the rounds weighted by their
    test samples average to the whole test set's value (issue 49: no bias per round)."""
    cube = make_synthetic_cube(n_episodes=24, n_seeds=1, **SMALL)
    out = analyze(cube, conditions=("genuine",), **{**FIT, "split_seeds": (0,)})
    d = build_dataset(cube, "A->B", "genuine")
    tr, te, _ = episode_split(d.episode, None, np.random.RandomState(0), n_groups=24)
    (xtr, ytr), (xte, yte) = d.take(tr), d.take(te)
    var = yte.var(0)                                   # (L_tgt, D): the whole test set's

    def grid_on(m):
        g = np.empty((4, 4))
        for ls in range(4):
            for lt in range(4):
                pred = Ridge(alpha=1.0).fit(xtr[:, ls], ytr[:, lt]).predict(xte[m, ls])
                g[ls, lt] = 1 - np.mean(((yte[m, lt] - pred) ** 2).mean(0) / var[lt])
        return g

    whole = grid_on(np.ones(len(te), bool))
    tgt = whole.argmax(1)
    stored = out["round_tgt_layer"].sel(condition="genuine", direction="A->B").to_numpy()
    assert stored[:4].tolist() == tgt.tolist() and (stored[4:] == -1).all()
    weighted = np.zeros(4)
    for r in range(cube.sizes["round"]):
        m = d.round[te] == r
        if not m.any():
            assert np.isnan(out["sync_r2_round"].sel(condition="genuine", direction="A->B", round=r))
            continue
        at = grid_on(m)[np.arange(4), tgt]
        weighted += m.mean() * at.mean()
        got = float(out["sync_r2_round"].sel(condition="genuine", direction="A->B", round=r))
        assert got == pytest.approx(at.mean(), abs=1e-4)
        assert got <= sync_r2(grid_on(m)) + 1e-4         # the round's own maximum would only be higher
        assert int(out["n_test_round"].sel(condition="genuine", direction="A->B", split_seed=0, round=r)) == m.sum()
    assert weighted == pytest.approx(sync_r2_noclip(whole), abs=1e-6)  # float32 states
    assert weighted == pytest.approx(float(out["sync_r2_noclip"].sel(condition="genuine", direction="A->B")), abs=1e-4)


def test_the_rounds_average_to_the_whole_test_value():
    """Issue 49: in every condition and direction the rounds' SyncR², weighted by their test
    samples, is the whole test set's unclipped SyncR² (up to the split seeds' slightly different
    weights), where the best target of each round, clipped, lifted every round."""
    cube = make_synthetic_cube(n_episodes=40, n_seeds=1, n_rounds=6,
                               shapes=Shapes(layers_a=4, dim_a=8, layers_b=4, dim_b=8),
                               planted=Planted(min_utterances=12, signal=3.0))
    out = analyze(cube, conditions=("genuine", "passive", "lag1"), **{**FIT, "split_seeds": (0, 1)})
    n = out["n_test_round"].mean("split_seed")
    weighted = (out["sync_r2_round"] * n).sum("round") / n.where(out["sync_r2_round"].notnull()).sum("round")
    np.testing.assert_allclose(weighted.values, out["sync_r2_noclip"].values, atol=0.005)


def test_a_trend_planted_over_the_rounds_is_found_and_tested(tmp_path):
    """The partner's states drown in noise that grows round by round: synchrony fades, and the
    trend table says so, its slope a least-squares fit of the round table's values."""
    from synclib.analysis import claims
    from synclib.analysis.results import load_published, load_results
    from synthetic import SYNTHETIC_PAIRS, build_synthetic_results

    root = build_synthetic_results(tmp_path / "res", pairs=SYNTHETIC_PAIRS[:1], analyze_kwargs=dict(
        persona_disjoint=False, relationship=False, sample_sizes=None, nonlinear=False, tom=False, n_boot=50))
    cube = make_synthetic_cube(n_episodes=80, n_seeds=1, n_rounds=6, planted=Planted(min_utterances=12), **SMALL)
    noise = np.random.default_rng(1).standard_normal(cube["hidden_b"].shape) * np.arange(6)[None, None, :, None, None]
    cube["hidden_b"] = cube["hidden_b"] + (1.5 * noise).astype(np.float32)
    analyze(cube, conditions=("genuine", "pseudo"), **{**FIT, "n_boot": 400}).to_netcdf(root / "analysis" / "S-S.nc")
    res = load_results(root)

    table = res.round_table()
    g = table[table["condition"] == "genuine"]
    assert g["kept"].all() and g["round"].tolist() == [1, 2, 3, 4, 5]  # round 6 has agent 1's direction only
    assert (g["ci_lo"] <= g["mean"]).all() and (g["mean"] <= g["ci_hi"]).all()
    assert g["mean"].iloc[0] > g["mean"].iloc[-1] + 0.1
    claims.write(res, load_published())  # the claims step tests the trends, once, for the controls page
    trend = load_results(root).tests("trends").set_index("condition")
    t = trend.loc["genuine"]
    assert t["slope"] == pytest.approx(np.polyfit(g["round"], g["mean"], 1)[0])
    assert t["slope"] < 0 and t["ci_hi"] < 0 and t["p"] < 0.01 and t["n_boot"] == 400
    assert (t["first_round"], t["last_round"], t["n_rounds"]) == (1, 5, 5)
    assert t["p_holm"] == pytest.approx(min(1.0, t["p"] * trend["p"].notna().sum()), abs=1e-12) or t["p_holm"] >= t["p"]


def test_bootstrap_p_and_interval():
    d = np.array([-1.0, 1, 2, 3, np.nan])
    assert stats.bootstrap_p(d) == pytest.approx(2 * 2 / 5)
    assert stats.bootstrap_p([]) != stats.bootstrap_p([])  # NaN
    assert stats.bootstrap_interval(np.arange(101.0)) == pytest.approx((2.5, 97.5))


def test_the_bias_corrected_interval_follows_where_the_draws_fall_from_the_estimate():
    """Issue 74, item 4: Efron's bias-corrected percentile interval.  Draws centred on the estimate give the plain
    percentiles; draws of which 70 % fall below the estimate (as the reviewer saw for the gaps) move the interval
    up, toward the estimate, by the quantiles Phi(2 z0 +- 1.96), z0 = Phi^-1(0.7)."""
    from scipy.stats import norm

    d = np.random.default_rng(0).standard_normal(20_000)
    plain = stats.bootstrap_interval(d)
    assert stats.bootstrap_interval(d, estimate=float(np.median(d))) == pytest.approx(plain, abs=1e-3)
    est = float(np.quantile(d, 0.7))
    lo, hi = stats.bootstrap_interval(d, estimate=est)
    z0 = norm.ppf(0.7)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(d, norm.cdf(2 * z0 + norm.ppf([0.025, 0.975])))), abs=1e-6)
    assert lo > plain[0] and hi > plain[1]
    assert stats.bootstrap_interval(d, estimate=float("nan")) == plain  # no estimate: the percentiles


def test_the_acceleration_of_a_mean_is_the_jackknifes_and_moves_the_interval():
    """BCa without refits (Efron 1987): the influence of each episode is the regression of the draws on the
    resamples' counts.  For a mean of skewed values it equals the jackknife's acceleration, and the interval takes
    the quantiles Phi(z0 + (z0 + z) / (1 - a (z0 + z)))."""
    from scipy.stats import norm

    x = np.random.default_rng(1).exponential(size=30)  # skewed episode values
    counts = stats.episode_draws(30, 4000, seed=5)
    draws = counts @ x / 30
    jack = np.array([np.delete(x, i).mean() for i in range(30)])
    dev = jack.mean() - jack
    a_jack = np.sum(dev ** 3) / (6 * np.sum(dev ** 2) ** 1.5)
    assert a_jack > 0.01 and stats.acceleration(draws, counts) == pytest.approx(a_jack, rel=1e-6)
    est = float(x.mean())
    z0 = norm.ppf(np.mean(draws < est))
    z = z0 + norm.ppf([0.025, 0.975])
    want = np.quantile(draws, norm.cdf(z0 + z / (1 - a_jack * z)))
    assert stats.bootstrap_interval(draws, estimate=est, counts=counts) == pytest.approx(tuple(want), rel=1e-6)
    assert stats.bca_interval(draws, est, 0) == stats.bootstrap_interval(draws, estimate=est)  # no counts: BC
    assert stats.acceleration(np.full(4000, 0.3), counts) == 0.0  # draws that do not vary
    with pytest.raises(ValueError, match="counts"):
        stats.acceleration(draws, counts[:10])


# --------------------------------------------------------------------------- the presets
@pytest.mark.parametrize("name,partner", [("default.yaml", "the same task"), ("overnight.yaml", "the same task")])
def test_the_presets_pages_have_pseudo_dyads_and_rounds_with_their_intervals(name, partner):
    """Both presets analyse the pseudo-dyads and resample episodes (the rounds' intervals and
    trend test), and build the same controls page; which partner rule applies follows from
    their seeds."""
    from pathlib import Path

    from synclib.config import load_config

    repo = Path(__file__).resolve().parents[1]
    cfg = load_config(repo / "config" / name)
    assert cfg["analysis"]["pseudo_dyads"] and cfg["analysis"]["n_boot"] >= 1000
    cube = make_synthetic_cube(n_episodes=4, n_seeds=len(cfg["simulate"]["seeds"]), **SMALL)
    assert pseudo_partners(cube)[2].startswith(partner)
    page = (repo / "notebooks" / "fig03_04_controls.md").read_text()
    assert "res.round_table()" in page and 'res.tests("trends")' in page
    assert "Here the partner dialog is" in page and "SyncR², genuine dyads vs pseudo-dyads" in page
