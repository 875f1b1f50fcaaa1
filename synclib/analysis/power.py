"""Statistical power: what a run's genuine-vs-control comparisons can and cannot detect.

A few dozen training samples per dataset and SyncR² of a few hundredths with standard errors as large cannot by
themselves tell "no difference" apart from "too few samples to see one"; this module gives the numbers that can:

* :func:`paired_control_tests`: genuine against each control (passive, shuffled, lagJ), paired per split seed on
  genuine's contrast with the control (``sync_r2_contrast``, dims ``contrast, direction, split_seed, side``: both
  fitted on the rows both hold, :mod:`synclib.analysis.contrasts`): paired t-test, exact sign-flip permutation test
  and minimum detectable difference; :func:`paired_tests_by_run` per ordered run.
* :func:`episode_test`, :func:`episode_interval`: the same with the episode (dialog) as the unit, from resamples of
  whole episodes; :func:`setting_test` and :func:`tom_tests` for tables 2 and 5 and figure 11.
* :func:`planted_power`: the power curve of the claims' corrected test on differences planted in the run's own
  states (:mod:`synclib.analysis.planted`); :func:`detection_size`, where it reaches 80 %.

:mod:`synclib.analysis.claims` runs these once per run (``claims.json``).  The minimum detectable difference (MDE)
is at alpha 0.05 two-sided and power 0.8.  The split seeds of one ordered run re-split the *same* samples, so their
scores are positively correlated: ``unit="split_seed"`` (the default) overstates the number of independent
replicates, ``unit="direction"`` (split seeds averaged first) is conservative.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy import optimize
from scipy import stats as sps

from synclib import stats

__all__ = [
    "EXACT_MAX_N",
    "N_RANDOM_FLIPS",
    "SETTINGS",
    "TABLE_COLUMNS",
    "TWO_TESTS",
    "UNITS",
    "PLANTED_COLUMNS",
    "corrected_resampled_test",
    "conservative_p",
    "detection_size",
    "episode_interval",
    "episode_test",
    "mde_paired",
    "n_pairs_needed",
    "paired_control_tests",
    "paired_test",
    "paired_tests_by_run",
    "paired_values",
    "planted_power",
    "reported_difference",
    "setting_test",
    "significantly_above",
    "sign_flip_pvalue",
    "surrogate_table",
    "surrogate_test",
    "tom_tests",
]

#: the pairable units of :func:`paired_values`
UNITS = ("split_seed", "direction")
#: up to this many paired values the sign-flip test enumerates all 2^n sign vectors
EXACT_MAX_N = 16
#: random sign vectors above :data:`EXACT_MAX_N`
N_RANDOM_FLIPS = 10_000
#: the order in which controls are listed
_CONTROL_ORDER = ("passive", "passive_own", "shuffled", "pseudo")


# --------------------------------------------------------------------------- tests on paired values
def _diffs(diffs) -> np.ndarray:
    d = np.asarray(diffs, dtype=np.float64).ravel()
    return d[np.isfinite(d)]


def sign_flip_pvalue(diffs, n_random: int = N_RANDOM_FLIPS, seed: int = 0,
                     exact_max_n: int = EXACT_MAX_N) -> float:
    """Two-sided sign-flip permutation p-value of the mean of paired differences ``diffs`` (n,; non-finite dropped).

    The statistic is ``|mean(d)|``; the p-value is the share of sign vectors ``s`` with ``|mean(s * d)| >= |mean(d)|``
    (relative tolerance 1e-9 for ties): all ``2**n`` up to ``n = exact_max_n`` (``count / 2**n``), else ``n_random``
    drawn by ``numpy.random.default_rng(seed)`` (``(1 + count) / (1 + n_random)``, never 0).  NaN without differences.
    """
    d = _diffs(diffs)
    n = d.size
    if n == 0:
        return math.nan
    obs = abs(d.mean())
    tol = 1e-9 * max(obs, np.abs(d).max(initial=0.0), 1e-300)
    if n <= exact_max_n:
        bits = (np.arange(2 ** n)[:, None] >> np.arange(n)[None, :]) & 1  # (2^n, n)
        signs = 1.0 - 2.0 * bits
        stat = np.abs(signs @ d) / n
        return float(np.mean(stat >= obs - tol))
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(n_random, n))
    stat = np.abs(signs @ d) / n
    return float((1 + np.sum(stat >= obs - tol)) / (1 + n_random))


def paired_test(a, b, seed: int = 0) -> dict:
    """Paired comparison of ``a`` and ``b``, shape (n,); pairs with a non-finite member are dropped.

    Returns a dict: ``n_pairs``, ``mean_a``, ``mean_b``, ``mean_diff`` (of ``a - b``), ``sd_diff`` (ddof 1), ``t``
    and ``p_t`` (:func:`scipy.stats.ttest_rel`; NaN for fewer than two pairs or no variance), ``p_perm``
    (:func:`sign_flip_pvalue` with ``seed``) and ``mde`` (:func:`mde_paired`).
    """
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"paired_test: a has shape {a.shape} but b has {b.shape}")
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    d = a - b
    n = int(d.size)
    sd = float(np.std(d, ddof=1)) if n > 1 else math.nan
    t = p_t = math.nan
    if n > 1 and sd > 0:
        res = sps.ttest_rel(a, b)
        t, p_t = float(res.statistic), float(res.pvalue)
    return {"n_pairs": n, "mean_a": float(a.mean()) if n else math.nan,
            "mean_b": float(b.mean()) if n else math.nan,
            "mean_diff": float(d.mean()) if n else math.nan, "sd_diff": sd, "t": t, "p_t": p_t,
            "p_perm": sign_flip_pvalue(d, seed=seed), "mde": mde_paired(sd, n)}


def corrected_resampled_test(diffs, test_train_ratio: float) -> dict:
    """Nadeau and Bengio's corrected resampled t-test of paired differences from re-splits.

    Differences over ``n`` random train/test splits of the same samples are positively correlated, so the plain
    ``var / n`` is too small; the correction (Nadeau & Bengio 2003, *Machine Learning* 52:239) uses
    ``var * (1 / n + test_train_ratio)`` (``n_test / n_train`` of the splits) with ``n - 1`` degrees of freedom;
    conservative for differences pooled from independent runs or directions.  ``diffs``: shape (n,), non-finite
    values dropped.

    Returns a dict: ``n``, ``mean``, ``t``, ``p`` (two-sided), ``mde`` (:func:`mde_paired` at the inflated spread
    ``sd * sqrt(1 + n * test_train_ratio)``) and ``ci_split_lo``/``ci_split_hi`` (the 95 % interval of the mean at
    the corrected standard error, ``n - 1`` degrees of freedom: it covers refitting the maps on new splits of the
    same samples); NaN where the differences do not vary or ``n < 2``.
    """
    d = _diffs(diffs)
    n = int(d.size)
    out = {"n": n, "mean": float(d.mean()) if n else math.nan, "t": math.nan, "p": math.nan, "mde": math.nan,
           "ci_split_lo": math.nan, "ci_split_hi": math.nan}
    if n < 2 or not np.isfinite(test_train_ratio) or test_train_ratio < 0:
        return out
    sd = float(np.std(d, ddof=1))
    if sd <= 1e-12 * max(1.0, abs(out["mean"])):   # equal up to rounding: no spread, no test
        return out
    se = sd * math.sqrt(1.0 / n + float(test_train_ratio))
    t = out["mean"] / se
    half = float(sps.t.ppf(0.975, n - 1)) * se
    out.update(t=float(t), p=float(2 * sps.t.sf(abs(t), n - 1)),
               mde=mde_paired(sd * math.sqrt(1 + n * float(test_train_ratio)), n),
               ci_split_lo=out["mean"] - half, ci_split_hi=out["mean"] + half)
    return out


def _power_t(delta: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided one-sample (paired) t-test at true mean difference ``delta``."""
    df = n - 1
    tc = sps.t.ppf(1 - alpha / 2, df)
    ncp = delta * math.sqrt(n) / sd
    up, down = sps.nct.sf(tc, df, ncp), sps.nct.cdf(-tc, df, ncp)
    # scipy's nct can return NaN far out in a tail: that tail's probability is 0 (or 1)
    up = (1.0 if ncp > tc else 0.0) if not np.isfinite(up) else up
    down = (1.0 if ncp < -tc else 0.0) if not np.isfinite(down) else down
    return float(min(1.0, up + down))


def mde_paired(sd, n, alpha: float = 0.05, power: float = 0.8, method: str = "t") -> float:
    """Minimum detectable difference of a two-sided paired t-test: the smallest true mean difference that the test
    at level ``alpha`` detects with probability ``power`` from ``n`` paired values whose differences have standard
    deviation ``sd`` (ddof 1).

    ``method="t"`` (the tables') solves the power equation exactly with the noncentral t (``n - 1`` degrees of
    freedom, noncentrality ``delta sqrt(n) / sd``, both tails); ``"normal"`` is the approximation
    ``(z_{1-alpha/2} + z_power) sd / sqrt(n)``, too small for small ``n``.

    Returns the difference in the units of ``sd``; NaN for ``n < 2`` or an ``sd`` that is not finite and positive
    (differences that do not vary define no test).
    """
    n = int(n)
    if n < 2 or sd is None or not np.isfinite(sd) or sd <= 0:
        return math.nan
    sd = float(sd)
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    normal = z * sd / math.sqrt(n)
    if method == "normal":
        return float(normal)
    if method != "t":
        raise ValueError(f"mde_paired: method must be 't' or 'normal', got {method!r}")
    hi = normal
    while _power_t(hi, sd, n, alpha) < power:  # the t-test needs more than the normal approx
        hi *= 2
    return float(optimize.brentq(lambda x: _power_t(x, sd, n, alpha) - power, 0.0, hi, xtol=1e-12 * sd))


def n_pairs_needed(diff, sd, alpha: float = 0.05, power: float = 0.8, max_n: int = 10 ** 6) -> int | None:
    """The smallest number of pairs (at least 2) at which a two-sided paired t-test detects a true mean difference
    ``diff`` with probability ``power`` when the differences have standard deviation ``sd``; None when ``diff`` or
    ``sd`` is not finite and positive or more than ``max_n`` would be needed."""
    if not (np.isfinite(diff) and np.isfinite(sd)) or diff <= 0 or sd <= 0:
        return None
    if mde_paired(sd, max_n, alpha, power) > diff:
        return None
    z = sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power)
    lo = hi = max(2, math.ceil((z * sd / diff) ** 2))  # the normal approximation: a lower bound
    while mde_paired(sd, hi, alpha, power) > diff:
        lo, hi = hi, hi * 2
    while lo < hi:  # mde decreases with n
        mid = (lo + hi) // 2
        if mde_paired(sd, mid, alpha, power) <= diff:
            hi = mid
        else:
            lo = mid + 1
    return int(lo)


# --------------------------------------------------------------------------- a run's paired values
def _per_seed(results, name: str, condition: str):
    """``sync_r2_per_seed`` of one run and condition as (direction, split_seed) DataArray, or None."""
    ds = results.analysis(name)
    if "sync_r2_per_seed" not in ds or condition not in ds["sync_r2_per_seed"]["condition"].values:
        return None
    return ds["sync_r2_per_seed"].sel(condition=condition).transpose("direction", "split_seed")


def _contrast(results, name: str, control: str):
    """Genuine's and ``control``'s per-seed SyncR² as two (direction, split_seed) DataArrays from
    ``sync_r2_contrast`` (:data:`synclib.analysis.contrasts.CONTRAST_RULE`); without it, each on its own samples."""
    ds = results.analysis(name)
    if "sync_r2_contrast" in ds and control in ds["contrast"].values:
        v = ds["sync_r2_contrast"].sel(contrast=control).transpose("direction", "split_seed", "side")
        return v.sel(side="genuine", drop=True), v.sel(side="control", drop=True)
    return _per_seed(results, name, "genuine"), _per_seed(results, name, control)


def _controls(results) -> list[str]:
    """Every condition other than genuine that some run has: passive, shuffled, pseudo, then lags by k."""
    seen = []
    for r in results.runs:
        ds = results.analysis(r.name)
        if "sync_r2_per_seed" in ds:
            seen += [str(c) for c in ds["sync_r2_per_seed"]["condition"].values]
    seen = [c for c in dict.fromkeys(seen) if c != "genuine"]

    def key(c):
        if c in _CONTROL_ORDER:
            return (0, _CONTROL_ORDER.index(c), c)
        if c.startswith("lag") and c[3:].isdigit():
            return (1, int(c[3:]), c)
        return (2, 0, c)
    return sorted(seen, key=key)


def paired_values(results, control: str, unit: str = "split_seed") -> pd.DataFrame:
    """The paired genuine and control SyncR² values of a run, one row per pair with both values finite.

    ``unit="split_seed"``: one pair per (ordered run, direction, split seed) from the contrast of genuine and
    ``control`` on the rows both hold (``sync_r2_contrast``); ``"direction"``: the split seeds averaged first (where
    both are finite), one pair per (ordered run, direction).  Returns a DataFrame with columns ``run, direction,
    split_seed`` (-1 for ``"direction"``), ``genuine``, ``control``; runs without the control add nothing.
    """
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    rows = []
    for r in results.runs:
        g, c = _contrast(results, r.name, control)
        if g is None or c is None:
            continue
        gv, cv = g.to_numpy().astype(float), c.to_numpy().astype(float)  # (Dir, S)
        ok = np.isfinite(gv) & np.isfinite(cv)
        for di, d in enumerate(g["direction"].values):
            if unit == "direction":
                if ok[di].any():
                    rows.append({"run": r.name, "direction": str(d), "split_seed": -1,
                                 "genuine": float(gv[di, ok[di]].mean()), "control": float(cv[di, ok[di]].mean())})
                continue
            for si, s in enumerate(g["split_seed"].values):
                if ok[di, si]:
                    rows.append({"run": r.name, "direction": str(d), "split_seed": int(s),
                                 "genuine": float(gv[di, si]), "control": float(cv[di, si])})
    return pd.DataFrame(rows, columns=["run", "direction", "split_seed", "genuine", "control"])


TABLE_COLUMNS = ["comparison", "control", "unit", "n_runs", "n_pairs", "mean_genuine", "mean_control",
                 "mean_diff", "sd_diff", "t", "p_t", "p_perm", "mde", "mde_normal", "test_train_ratio",
                 "t_corrected", "p_corrected", "mde_corrected", "n_episodes", "n_boot", "sync_genuine",
                 "sync_control", "sync_diff", "se_episodes", "ci_lo", "ci_hi", "p_episodes", "p", "ci_split_lo",
                 "ci_split_hi"]

#: the two tests of a control's difference, named in every sentence that quotes :func:`conservative_p`
TWO_TESTS = ("the corrected resampled t-test over re-splits and the bootstrap over whole episodes; "
             "the larger p of the two")


def _pooled(results, pick, runs=None) -> tuple[float, np.ndarray, int]:
    """A reported SyncR² quantity and its resamples of whole episodes, averaged over the ordered runs (all, or
    ``runs``) and directions; ``pick(ds)`` gives ``(value (direction,), resamples (direction, boot))`` or None.
    Returns ``(value, draws (B,) NaN where a resample has none, n_episodes of the first run)``; NaN and no draws
    where no run qualifies."""
    vals, boots, n_ep = [], [], 0
    for r in results.runs:
        if runs is not None and r.name not in runs:
            continue
        ds = results.analysis(r.name)
        got = pick(ds)
        if got is None:
            continue
        vals.append(got[0].to_numpy().astype(float))                                           # (direction,)
        boots.append(got[1].transpose("direction", "boot").to_numpy().astype(float))
        n_ep = n_ep or int(ds.attrs.get("n_episodes", 0))
    if not boots:
        return math.nan, np.array([]), n_ep
    with warnings.catch_warnings():  # runs without a value (too few samples to fit): NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        b = np.nanmean(np.concatenate(boots), axis=0)                                          # (B,)
        value = float(np.nanmean(np.concatenate(vals)))
    return value, b, n_ep


def _condition(name: str):
    """``pick`` of :func:`_pooled`: one condition on its own samples (``sync_r2``, ``sync_r2_boot``)."""
    def pick(ds):
        if "sync_r2_boot" not in ds or name not in ds["condition"].values:
            return None
        return ds["sync_r2"].sel(condition=name), ds["sync_r2_boot"].sel(condition=name)
    return pick


def _contrast_side(control: str, side):
    """``pick`` of :func:`_pooled`: one side of genuine's contrast with ``control`` (``sync_r2_contrast_pooled``,
    ``sync_r2_contrast_boot``), or for ``side="gap"`` genuine minus control; without contrasts, own samples."""
    def pick(ds):
        if "sync_r2_contrast_boot" in ds and control in ds["contrast"].values:
            v, b = (ds[n].sel(contrast=control) for n in ("sync_r2_contrast_pooled", "sync_r2_contrast_boot"))
            if side == "gap":
                return v.sel(side="genuine") - v.sel(side="control"), b.sel(side="genuine") - b.sel(side="control")
            return v.sel(side=side), b.sel(side=side)
        if "sync_r2_boot" not in ds or not {"genuine", control} <= set(ds["condition"].values):
            return None
        v, b = ds["sync_r2"], ds["sync_r2_boot"]
        if side == "gap":
            return v.sel(condition="genuine") - v.sel(condition=control), \
                b.sel(condition="genuine") - b.sel(condition=control)
        name = "genuine" if side == "genuine" else control
        return v.sel(condition=name), b.sel(condition=name)
    return pick


def episode_test(results, control: str, runs=None) -> dict:
    """Genuine against ``control`` with the episode (dialog) as the unit: a bootstrap of whole episodes, maps held
    fixed, on the rows both hold (``sync_r2_contrast_boot``; rules in the analyses' ``boot_rule`` and
    ``contrast_rule`` attributes).

    The statistic is the contrast's SyncR² difference, genuine minus control, averaged over the ordered runs and
    directions.  Runs that play the same tasks share the draws (one seed), so a task drawn counts in every run.

    Returns a dict: ``n_episodes`` (of the first run's cube), ``n_boot``, ``sync_genuine``, ``sync_control``,
    ``sync_diff``, ``se_episodes`` (sd of the resampled differences), ``ci_lo``/``ci_hi`` (BCa 95 %,
    :func:`synclib.stats.bca_interval`), ``p_episodes`` (``2 min(1 + #{d_b <= 0}, 1 + #{d_b >= 0}) / (1 + B)``,
    at most 1); NaN where no run has the resamples.
    """
    d, every, n_ep = _pooled(results, _contrast_side(control, "gap"), runs)
    db = every[np.isfinite(every)]
    out = {"n_episodes": n_ep, "n_boot": 0, "sync_genuine": math.nan, "sync_control": math.nan,
           "sync_diff": math.nan, "se_episodes": math.nan, "ci_lo": math.nan, "ci_hi": math.nan,
           "p_episodes": math.nan}
    if not db.size or not np.isfinite(d):
        return out
    B = db.size
    lo, hi = stats.bca_interval(every, d, n_ep)
    out.update(sync_genuine=_pooled(results, _contrast_side(control, "genuine"), runs)[0],
               sync_control=_pooled(results, _contrast_side(control, "control"), runs)[0],
               n_boot=B, sync_diff=d, se_episodes=float(np.std(db, ddof=1)) if B > 1 else math.nan,
               ci_lo=lo, ci_hi=hi, p_episodes=stats.bootstrap_p(db))
    return out


def episode_interval(results, condition: str = "genuine", runs=None) -> dict:
    """The reported SyncR² of ``condition`` (mean over the ordered runs, or ``runs``, and directions) with its
    interval over resamples of whole episodes (``sync_r2_boot``).

    Returns a dict: ``value``, ``ci_lo``, ``ci_hi`` (BCa 95 %, :func:`synclib.stats.bca_interval`), ``p_zero``
    (one-sided, ``(1 + #{s_b <= 0}) / (1 + B)``: that SyncR² is 0), ``n_boot``, ``n_episodes``; NaN where no run
    has resamples.
    """
    v, every, n_ep = _pooled(results, _condition(condition), runs)
    b = every[np.isfinite(every)]
    out = {"value": math.nan, "ci_lo": math.nan, "ci_hi": math.nan, "p_zero": math.nan, "n_boot": 0,
           "n_episodes": n_ep}
    if b.size:
        lo, hi = stats.bca_interval(every, v, n_ep)
        out.update(value=v, ci_lo=lo, ci_hi=hi, p_zero=float((1 + np.sum(b <= 0)) / (1 + b.size)), n_boot=int(b.size))
    return out


def surrogate_test(results, runs=None, split: str = "episode") -> dict:
    """Genuine SyncR² against its surrogate partners (``sync_r2_surrogate``,
    :data:`synclib.analysis.surrogates.SURROGATE_RULE`), each averaged over the ordered runs (or ``runs``) and
    directions: the null that can happen, in place of SyncR² = 0; ``split="persona"``: the same test under the
    persona-disjoint split (``persona_disjoint_sync_r2_surrogate`` ...).

    Two tests, ``p`` the larger: the rank of genuine among the surrogates (``p_rank``, :func:`synclib.stats.rank_p`,
    at least ``p_floor = 1 / (1 + n_surrogates)``) and the bootstrap of whole episodes of the gap to the surrogates'
    mean (``surrogate_gap_boot``; ``p_episodes`` as :func:`episode_test`).

    Returns a dict: ``genuine`` (on the surrogates' rows), ``surrogate_mean``, ``surrogate_sd``, ``surrogate_max``,
    ``surrogates`` (the distribution, (n,)), ``n_surrogates``, ``share_below`` (surrogates below genuine), ``gap``,
    ``ci_lo``/``ci_hi``, ``p_rank``, ``p_episodes``, ``p``, ``p_floor``, ``n_boot``, ``n_episodes``,
    ``same_personas`` (share of surrogate samples whose partner dialog has the same persona pair), ``n_runs``,
    ``n_sim_seeds`` (fewest simulation seeds of the runs' cubes: with one, no surrogate keeps the task); NaN and 0
    where no run has surrogates.
    """
    if split not in ("episode", "persona"):
        raise ValueError(f"split must be 'episode' or 'persona', got {split!r}")
    pre = "persona_disjoint_" if split == "persona" else ""
    gen, sur, gaps, same, n_ep, n_seeds = [], [], [], [], 0, []
    for r in results.runs:
        if runs is not None and r.name not in runs:
            continue
        ds = results.analysis(r.name)
        if pre + "sync_r2_surrogate" not in ds:
            continue
        gen.append(ds[pre + "sync_r2_surrogate_genuine"].to_numpy().astype(float))
        sur.append(ds[pre + "sync_r2_surrogate"].transpose("direction", "surrogate").to_numpy().astype(float))
        same.append(ds[pre + "surrogate_same_personas"].to_numpy().astype(float))
        if pre + "surrogate_gap_boot" in ds:
            gaps.append(ds[pre + "surrogate_gap_boot"].transpose("direction", "boot").to_numpy().astype(float))
        n_ep = n_ep or int(ds.attrs.get("n_episodes", 0))
        n_seeds.append(int(ds.attrs.get("n_sim_seeds", 1)))
    nan = math.nan
    out = {"n_sim_seeds": min(n_seeds, default=0), "genuine": nan, "surrogate_mean": nan, "surrogate_sd": nan, "surrogate_max": nan,
           "surrogates": np.array([]), "n_surrogates": 0, "share_below": nan, "gap": nan, "ci_lo": nan,
           "ci_hi": nan, "p_rank": nan, "p_episodes": nan, "p": nan, "n_boot": 0, "n_episodes": n_ep,
           "same_personas": nan, "n_runs": len(gen), "p_floor": nan}
    if not gen or len({s.shape[1] for s in sur}) != 1:
        return out
    with warnings.catch_warnings():  # a direction without a value: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        g = float(np.nanmean(np.concatenate(gen)))
        dist = np.nanmean(np.concatenate(sur), axis=0)                                # (n,)
        same_p = float(np.nanmean(np.concatenate(same)))
        gb = np.nanmean(np.concatenate(gaps), axis=0) if gaps else np.array([])
    if not np.isfinite(g) or not np.isfinite(dist).any():
        return out
    ok = dist[np.isfinite(dist)]
    out.update(genuine=g, surrogate_mean=float(ok.mean()), surrogate_sd=float(ok.std(ddof=1)) if ok.size > 1 else nan,
               surrogate_max=float(ok.max()), surrogates=dist, n_surrogates=int(ok.size), p_floor=1 / (1 + ok.size),
               share_below=float(np.mean(ok < g)), gap=float(g - ok.mean()), p_rank=stats.rank_p(g, ok),
               same_personas=same_p)
    every, gb = gb, gb[np.isfinite(gb)]
    if gb.size:
        lo, hi = stats.bca_interval(every, out["gap"], n_ep)
        out.update(ci_lo=lo, ci_hi=hi, p_episodes=stats.bootstrap_p(gb), n_boot=int(gb.size))
    out["p"] = max(out["p_rank"], out["p_episodes"]) if gb.size else out["p_rank"]
    return out


def surrogate_table(results) -> pd.DataFrame:
    """:func:`surrogate_test` per pair (both orders) and over all runs (``pair`` "all"), where a value could be
    computed; ``attrs["present"]``: some analysis has surrogates.  Columns ``pair`` and the test's scalar entries."""
    rows, present = [], False
    units = [(p, [r.name for r in results.runs_of(p)]) for p in results.pair_names]
    for name, runs in units + ([("all", None)] if len(units) > 1 else []):
        t = surrogate_test(results, runs)
        present |= bool(t["n_runs"])
        if t["n_surrogates"]:
            rows.append({"pair": name, **{k: v for k, v in t.items() if k != "surrogates"}})
    out = pd.DataFrame(rows)
    out.attrs["present"] = present
    return out


#: the settings :func:`setting_test` compares with the genuine condition: (variable, reduced dims, label)
SETTINGS = {"persona": ("persona_disjoint_sync_r2_per_seed", (), "persona-disjoint minus original SyncR²"),
            "nonlinear": ("nonlinear_r2", ("layer_pair",), "the MLP's minus the affine map's test R²")}


def _persona_test(results) -> dict:
    """Table 2: the persona-disjoint split against the run's own, like with like.  A persona split and an episode
    split of the same seed are unrelated partitions, so nothing pairs them by seed: each side is averaged over its
    own split seeds first and the differences over runs x directions get a plain paired t-test
    (:func:`corrected_resampled_test` at ratio 0); beside it, the bootstrap of whole episodes of the difference on
    the surrogate test's rows and split seeds (``persona_disjoint_surrogate_genuine_boot`` minus
    ``surrogate_genuine_boot``, the same draws; maps fixed), ``p_episodes`` as :func:`episode_test`.  ``p`` is the
    larger of the two (the t-test's alone without the resamples)."""
    units, draws, point, n_seeds, n_runs, n_ep = [], [], [], 0, 0, 0
    for r in results.runs:
        ds = results.analysis(r.name)
        if "persona_disjoint_sync_r2_per_seed" not in ds:
            continue
        n_runs += 1
        n_ep = n_ep or int(ds.attrs.get("n_episodes", 0))
        a = ds["persona_disjoint_sync_r2_per_seed"].transpose("direction", "split_seed").to_numpy().astype(float)
        b = ds["sync_r2_per_seed"].sel(condition="genuine").transpose("direction", "split_seed").to_numpy().astype(float)
        with warnings.catch_warnings():  # a direction without a value: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            units += list(np.nanmean(a, 1) - np.nanmean(b, 1))
        n_seeds = max(n_seeds, int(np.isfinite(a).any(0).sum()))
        if {"persona_disjoint_surrogate_genuine_boot", "surrogate_genuine_boot"} <= set(ds.data_vars):
            d = ds["persona_disjoint_surrogate_genuine_boot"] - ds["surrogate_genuine_boot"]
            draws.append(d.transpose("direction", "boot").to_numpy().astype(float))
            point.append((ds["persona_disjoint_sync_r2_surrogate_genuine"] - ds["sync_r2_surrogate_genuine"])
                         .to_numpy().astype(float))
    out = corrected_resampled_test(np.array(units), 0.0)
    out.update(p_units=out["p"], ci_lo=math.nan, ci_hi=math.nan, p_episodes=math.nan, n_boot=0, n_layer_pairs=0,
               n_runs=n_runs, n_seeds=n_seeds)
    if draws:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            every = np.nanmean(np.concatenate(draws), axis=0)
        gb = every[np.isfinite(every)]
        if gb.size:
            lo, hi = stats.bca_interval(every, float(np.nanmean(np.concatenate(point))), n_ep)
            out.update(ci_lo=lo, ci_hi=hi, p_episodes=stats.bootstrap_p(gb), n_boot=int(gb.size))
            if np.isfinite(out["p"]):
                out["p"] = max(out["p"], out["p_episodes"])
    return out


def setting_test(results, setting: str) -> dict:
    """Table 2 or 5: a setting against the original.  ``"persona"``: :func:`_persona_test`; ``"nonlinear"``:
    ``nonlinear_r2`` minus ``affine_r2``, averaged over the layer pairs, paired by run, direction and split seed with
    :func:`corrected_resampled_test` (ratio of the genuine splits), which needs two or more split seeds (with one
    there is no re-split to correct for, and directions of one run share their dialogs); beside it the bootstrap of
    whole episodes of the same difference (``nonlinear_gap_boot``, maps fixed), ``p_episodes`` as
    :func:`episode_test`.  ``p`` is the larger of the two; with one split seed the bootstrap's alone, its ``mde``
    ``(z_0.975 + z_0.8)`` times the resamples' standard deviation.

    Returns the test's dict plus ``n_layer_pairs`` (nonlinear; else 0), ``n_runs``, ``n_seeds`` (the setting's
    split seeds), ``ci_lo``/``ci_hi`` (the bootstrap's, BCa), ``p_corrected``, ``p_episodes``,
    ``se_episodes`` and ``n_boot``.
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {sorted(SETTINGS)}, got {setting!r}")
    if setting == "persona":
        return _persona_test(results)
    var, reduce, _ = SETTINGS[setting]
    diffs, ratios, draws, n_lp, n_seeds, n_ep = [], [], [], 0, 0, 0
    for r in results.runs:
        ds = results.analysis(r.name)
        if var not in ds:
            continue
        n_ep = n_ep or int(ds.attrs.get("n_episodes", 0))
        if "nonlinear_gap_boot" in ds:
            draws.append(ds["nonlinear_gap_boot"].transpose("direction", "boot").to_numpy().astype(float))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            a, b = ds[var].mean(list(reduce)), ds["affine_r2"].mean(list(reduce))
        ntr, nte = (ds[f"n_{k}"].sel(condition="genuine") for k in ("train", "test"))
        n_lp = max(n_lp, int((ds["nonlinear_src_layer"] >= 0).sum("layer_pair").max()))
        d = (a - b).transpose("direction", "split_seed").to_numpy().astype(float)
        diffs.append(d.ravel())
        n_seeds = max(n_seeds, int(np.isfinite(d).any(0).sum()))  # the seeds the setting was fitted on
        ok = ntr.to_numpy().ravel() > 0
        ratios += list(nte.to_numpy().ravel()[ok] / ntr.to_numpy().ravel()[ok])
    d = np.concatenate(diffs) if diffs else np.array([])
    out = corrected_resampled_test(d, float(np.mean(ratios)) if ratios else math.nan)
    if n_seeds < 2:  # no re-split to correct for: one split of each run's two directions
        out.update(p=math.nan, t=math.nan, mde=math.nan, ci_split_lo=math.nan, ci_split_hi=math.nan)
    out.update(n_layer_pairs=n_lp, n_runs=len(diffs), n_seeds=n_seeds, p_corrected=out["p"], ci_lo=math.nan,
               ci_hi=math.nan, p_episodes=math.nan, se_episodes=math.nan, n_boot=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        every = np.nanmean(np.concatenate(draws), axis=0) if draws else np.array([])
    gb = every[np.isfinite(every)]
    if gb.size > 1 and np.isfinite(out["mean"]):
        lo, hi = stats.bca_interval(every, out["mean"], n_ep)
        se = float(np.std(gb, ddof=1))
        out.update(ci_lo=lo, ci_hi=hi, p_episodes=stats.bootstrap_p(gb), se_episodes=se, n_boot=int(gb.size))
        if n_seeds < 2:
            out.update(p=out["p_episodes"], mde=float((sps.norm.ppf(0.975) + sps.norm.ppf(0.8)) * se))
        else:
            out["p"] = max(out["p"], out["p_episodes"])
    return out


def tom_tests(results) -> pd.DataFrame:
    """Figure 11: each decoder against the train-mean baseline, paired by run, reading agent and split seed
    (baseline minus decoder test KL: positive when the decoder is better), with :func:`corrected_resampled_test`
    (n_test / n_train of its own probes).  Columns ``target, relation, n, mean, p, mde, format_followed`` (whether
    the format filter was on); empty without ToM results."""
    cols = ["target", "relation", "n", "mean", "p", "mde", "format_followed"]
    names = results.runs_with("tom_kl_best")
    if not names:
        return pd.DataFrame(columns=cols)
    first = results.analysis(names[0])
    rows = []
    for target in first["tom_target"].values:
        for rel in first["tom_relation"].values:
            diffs, ratios, followed = [], [], True
            for name in names:
                ds = results.analysis(name)
                at = {"tom_target": target, "tom_relation": rel}
                diffs.append((ds["tom_kl_baseline"] - ds["tom_kl_best"]).sel(**at).to_numpy().astype(float).ravel())
                sel = {k: v for k, v in at.items() if k in ds["tom_n_train"].dims}
                ntr = ds["tom_n_train"].sel(**sel).to_numpy().ravel()
                nte = ds["tom_n_test"].sel(**sel).to_numpy().ravel()
                ratios += list(nte[ntr > 0] / ntr[ntr > 0])
                followed &= str(ds.attrs.get("tom_format_filter", "applied")).startswith("applied")
            res = corrected_resampled_test(np.concatenate(diffs), float(np.mean(ratios)) if ratios else math.nan)
            rows.append({"target": str(target), "relation": str(rel).replace("_", " "), "n": res["n"],
                         "mean": res["mean"], "p": res["p"], "mde": res["mde"], "format_followed": followed})
    return pd.DataFrame(rows, columns=cols)


def conservative_p(row) -> float:
    """The larger p of a comparison's two tests (:data:`TWO_TESTS`), or the one there is."""
    ps = [row.get("p_corrected", math.nan), row.get("p_episodes", math.nan)]
    ps = [float(p) for p in ps if p is not None and np.isfinite(p)]
    return max(ps) if ps else math.nan


def _test_train_ratio(results, runs, condition: str) -> float:
    """Mean ``n_test / n_train`` over ``runs`` of the fits behind genuine's contrast with ``condition`` (without
    contrasts: the condition's own fits); NaN without."""
    ratios = []
    for name in runs:
        ds = results.analysis(name)
        if "n_train_contrast" in ds and condition in ds["contrast"].values:
            a, b = (ds[v].sel(contrast=condition) for v in ("n_train_contrast", "n_test_contrast"))
        elif "n_train" in ds and condition in ds["n_train"]["condition"].values:
            a, b = ds["n_train"].sel(condition=condition), ds["n_test"].sel(condition=condition)
        else:
            continue
        a, b = a.to_numpy().astype(float).ravel(), b.to_numpy().astype(float).ravel()
        ratios += list(b[a > 0] / a[a > 0])
    return float(np.mean(ratios)) if ratios else math.nan


def paired_control_tests(results, controls=None, unit: str = "split_seed", seed: int = 0,
                         runs=None) -> pd.DataFrame:
    """Genuine against each control condition: paired tests across the run's replicates.

    Parameters
    ----------
    results : synclib.analysis.results.Results
    controls : sequence of str, optional
        Default: every non-genuine condition some run has (passive, shuffled, pseudo, then the lags by k).
    unit : {"split_seed", "direction"}
        The paired values (:func:`paired_values`); ``"direction"`` is the conservative choice.
    seed : int
        For the random sign flips (more than 16 pairs).
    runs : sequence of str, optional
        Only these ordered runs (default: all).

    Returns
    -------
    DataFrame
        One row per control, columns :data:`TABLE_COLUMNS`: ``comparison`` (e.g. ``"genuine - passive"``),
        ``control``, ``unit``, ``n_runs`` (ordered runs with pairs), ``n_pairs`` and the means, sd, t, p and MDE of
        :func:`paired_test`, ``mde_normal`` (the normal approximation); with ``unit="split_seed"`` also
        ``test_train_ratio``, ``t_corrected``, ``p_corrected``, ``mde_corrected`` (:func:`corrected_resampled_test`,
        the test to read for re-split values) and the entries of :func:`episode_test`; ``p``:
        :func:`conservative_p`, the p every claim is worded from (NaN for ``"direction"``).
    """
    controls = _controls(results) if controls is None else list(controls)
    rows = []
    for c in controls:
        pv = paired_values(results, c, unit)
        if runs is not None:
            pv = pv[pv["run"].isin(list(runs))]
        res = paired_test(pv["genuine"], pv["control"], seed=seed)
        ratio = _test_train_ratio(results, pv["run"].unique(), c) if unit == "split_seed" else math.nan
        cor = corrected_resampled_test(pv["genuine"] - pv["control"], ratio)
        row = {"comparison": f"genuine - {c}", "control": c, "unit": unit,
               "n_runs": int(pv["run"].nunique()), "n_pairs": res["n_pairs"],
               "mean_genuine": res["mean_a"], "mean_control": res["mean_b"],
               "mean_diff": res["mean_diff"], "sd_diff": res["sd_diff"], "t": res["t"],
               "p_t": res["p_t"], "p_perm": res["p_perm"], "mde": res["mde"],
               "mde_normal": mde_paired(res["sd_diff"], res["n_pairs"], method="normal"),
               "test_train_ratio": ratio, "t_corrected": cor["t"], "p_corrected": cor["p"],
               "mde_corrected": cor["mde"], "ci_split_lo": cor["ci_split_lo"], "ci_split_hi": cor["ci_split_hi"]}
        if unit == "split_seed":
            row.update(episode_test(results, c, runs))
        row["p"] = conservative_p(row)
        rows.append(row)
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def paired_tests_by_run(results, controls=None) -> pd.DataFrame:
    """:func:`paired_control_tests` for each ordered run alone, then, with several, all pooled (``run`` =
    ``"all runs"``).  Columns ``run`` and :data:`TABLE_COLUMNS`."""
    names = [r.name for r in results.runs]
    parts = [paired_control_tests(results, controls, runs=[n]).assign(run=n) for n in names]
    if len(names) > 1:
        parts.append(paired_control_tests(results, controls).assign(run="all runs"))
    if not parts:
        return pd.DataFrame(columns=["run"] + TABLE_COLUMNS)
    out = pd.concat(parts, ignore_index=True)
    return out[["run"] + TABLE_COLUMNS]


def reported_difference(row) -> float:
    """The difference a sentence quotes: of the reported SyncR² (:func:`episode_test`), else the
    mean of the per-split-seed differences."""
    return row["sync_diff"] if np.isfinite(row.get("sync_diff", math.nan)) else row["mean_diff"]


def significantly_above(row, level: float = 0.05) -> bool:
    """Genuine significantly above the control, by the larger p of the two tests."""
    return bool(np.isfinite(row["p"]) and row["p"] < level and reported_difference(row) > 0)


#: columns of :func:`planted_power`
PLANTED_COLUMNS = ["share", "planted", "planted_se", "n_reps", "detected", "rate", "rate_se", "n_pairs",
                   "sd_diff", "mde"]


def planted_power(results, runs=None, level: float = 0.05) -> pd.DataFrame:
    """How often the claims' corrected test finds a difference planted in the run's own states.

    Per replicate of :mod:`synclib.analysis.planted` (replicate ``r`` of each ordered run pooled), the differences
    genuine minus a planted control over ordered runs x directions x split seeds get :func:`corrected_resampled_test`
    at the replicates' mean ``n_test / n_train``; a replicate *detects* the difference when ``p < level`` and the
    mean difference is above 0.  ``runs``: the ordered runs to pool (default: all with ``planted_sync_r2`` and the
    first such run's shares).

    Returns
    -------
    DataFrame
        One row per planted share > 0 and, where the analysis has its null (``planted_null_sync_r2``), share 0: the
        same share planted on both sides, ``detected`` its false findings (any ``p < level``, either sign); columns
        :data:`PLANTED_COLUMNS`: ``planted`` (mean over replicates of the
        mean paired difference: what the method measures at this run's size), ``planted_se`` (SE over replicates),
        ``n_reps``, ``detected``, ``rate`` (``detected / n_reps``), ``rate_se`` (binomial), ``n_pairs`` (per
        replicate), ``sd_diff`` and ``mde`` (means over replicates).  Empty without planted replicates.  ``attrs``:
        ``runs``, ``test_train_ratio``, ``level``, ``layers`` (per run, the layers of models A and B fitted),
        ``null_share`` (the share planted on both sides of share 0), ``null_bound`` (``level`` plus the binomial
        95 % margin over ``n_reps``: share 0's rate at most this).
    """
    names = [r.name for r in results.runs] if runs is None else list(runs)
    parts, nulls, ratios, layers, shares = [], [], [], {}, None
    for name in names:
        ds = results.analysis(name)
        if "planted_sync_r2" not in ds or not ds.sizes.get("replicate"):
            continue
        v = ds["planted_sync_r2"].transpose("direction", "replicate", "split_seed", "share")
        if shares is None:
            shares = v["share"].to_numpy().astype(float)
        elif not np.array_equal(v["share"].to_numpy().astype(float), shares):
            continue
        parts.append(v.to_numpy().astype(float))
        null_share = float(ds.attrs.get("planted_null_share", math.nan))
        if "planted_null_sync_r2" in ds and null_share in shares:
            side = v.sel(share=null_share).to_numpy().astype(float)
            nulls.append(side - ds["planted_null_sync_r2"].transpose(*v.dims[:3]).to_numpy().astype(float))
        ntr, nte = (ds[k].to_numpy().astype(float).ravel() for k in ("n_train_planted", "n_test_planted"))
        ratios += list(nte[ntr > 0] / ntr[ntr > 0])
        layers[name] = (str(ds.attrs.get("planted_layers_a", "")), str(ds.attrs.get("planted_layers_b", "")))
    out = pd.DataFrame(columns=PLANTED_COLUMNS)
    if not parts or shares is None or 0.0 not in shares:
        return out
    n_reps = min(p.shape[1] for p in parts)
    # (replicate, pairs, share): every run's directions x split seeds pooled per replicate
    pooled = np.concatenate([np.moveaxis(p[:, :n_reps], 1, 0).reshape(n_reps, -1, len(shares)) for p in parts], axis=1)
    base = pooled[..., list(shares).index(0.0)]
    ratio = float(np.mean(ratios)) if ratios else math.nan
    rows = []
    null = (np.concatenate([np.moveaxis(d[:, :n_reps], 1, 0).reshape(n_reps, -1) for d in nulls], axis=1)
            if len(nulls) == len(parts) else None)
    for k, f in enumerate(shares):
        if f <= 0 and null is None:
            continue
        diffs = null if f <= 0 else base - pooled[..., k]                # (replicate, pairs)
        tests = [corrected_resampled_test(d, ratio) for d in diffs]
        means = np.array([t["mean"] for t in tests], dtype=float)
        # share 0 (nothing planted): a false finding is any p < level, either sign
        hits = [bool(np.isfinite(t["p"]) and t["p"] < level and (t["mean"] > 0 or f <= 0)) for t in tests]
        sds = [np.std(d[np.isfinite(d)], ddof=1) if np.isfinite(d).sum() > 1 else math.nan for d in diffs]
        rate = float(np.mean(hits))
        ok = np.isfinite(means)
        rows.append({"share": float(f), "planted": _finite_mean(means),
                     "planted_se": float(means[ok].std(ddof=1) / math.sqrt(ok.sum())) if ok.sum() > 1 else math.nan,
                     "n_reps": n_reps, "detected": int(sum(hits)), "rate": rate,
                     "rate_se": math.sqrt(rate * (1 - rate) / n_reps),
                     "n_pairs": int(max(t["n"] for t in tests)), "sd_diff": _finite_mean(sds),
                     "mde": _finite_mean([t["mde"] for t in tests])})
    out = pd.DataFrame(rows, columns=PLANTED_COLUMNS)
    # a test at ``level`` finds a difference where none is planted at most this often (its binomial 95 % margin)
    bound = level + 1.96 * math.sqrt(level * (1 - level) / n_reps)
    out.attrs.update({"runs": list(layers), "test_train_ratio": ratio, "layers": layers, "level": level,
                      "null_bound": bound, "null_share": null_share if null is not None else math.nan})
    return out


def _finite_mean(values) -> float:
    """The mean of the finite values, NaN without any."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


def detection_size(curve: pd.DataFrame, target: float = 0.8, by: str = "planted"):
    """The smallest ``by`` of a curve (:func:`planted_power`) from which on the detection rate
    stays at or above ``target``; None when the largest stays below it."""
    c = curve.sort_values(by)
    ok = c["rate"].to_numpy() >= target
    if not ok.any() or not ok[-1]:
        return None
    below = np.where(~ok)[0]
    first = 0 if below.size == 0 else below[-1] + 1
    return float(c[by].iloc[first])
