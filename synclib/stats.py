"""Statistics: means with standard errors, correlations, partial correlations, p-values.

:func:`mean_se` is the package's one mean and standard error, so one split seed gives a NaN standard error
everywhere.  A correlation needs at least ``MIN_N_CORR`` (3) points and a partial correlation with ``c``
covariates ``c + 3``; below that the result has ``r = nan`` and a ``reason``, printed instead of a number.
Pair-level ability (table 1) is the mean of the two models' scores, our choice (the paper does not say).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_N_CORR = 3


@dataclass(frozen=True)
class Correlation:
    """A (partial) Pearson correlation: ``r`` and two-sided ``p`` (``nan`` when not computable), ``n`` points,
    the ``covariates`` controlled for, and the ``reason`` ``r`` is ``nan`` (else None)."""

    r: float
    p: float
    n: int
    covariates: tuple = ()
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """True when ``r`` was computed."""
        return self.reason is None

    def describe(self) -> str:
        """One clause, e.g. ``"r = 0.91, p = 0.012 (n = 6)"`` or the reason it is missing."""
        if not self.ok:
            return f"no r ({self.reason})"
        dof = self.n - 2 - len(self.covariates)
        caveat = " - with 1 degree of freedom this is not evidence" if dof <= 1 else ""
        return f"r = {self.r:.2f}, p = {format_p(self.p)} (n = {self.n}{caveat})"


def format_p(p: float) -> str:
    """``p`` to two significant digits, or ``< 0.001``."""
    if p is None or not np.isfinite(p):
        return "n/a"
    return "< 0.001" if p < 0.001 else f"{p:.2g}"


def p_clause(p: float) -> str:
    """``"p = 0.012"`` or ``"p < 0.001"`` (:func:`format_p` in a sentence)."""
    s = format_p(p)
    return f"p {s}" if s.startswith("<") else f"p = {s}"


def fmt(x, digits: int = 2, sign: bool = False) -> str:
    """``x`` with ``digits`` decimals (and its sign with ``sign``), ``"n/a"`` when missing or not finite."""
    return "n/a" if x is None or not np.isfinite(x) else f"{x:{'+' if sign else ''}.{digits}f}"


def mean_se(values, axis=None):
    """Mean and standard error of the finite values, over all of them or along an axis.

    Parameters
    ----------
    values : array-like
        Samples, e.g. one SyncR² per split seed ``(n,)``, or ``(condition, direction, split_seed)`` with ``axis``.
    axis : int or None
        ``None``: all values flattened (floats returned); an int: along that axis.  NaN and inf are left out.

    Returns
    -------
    mean, se : float, or arrays of ``values.shape`` without ``axis``
        ``se = std(ddof=1) / sqrt(n)`` over the ``n`` finite values; NaN for ``n < 2`` (``mean`` NaN for ``n = 0``).
    """
    v = np.asarray(values, dtype=np.float64)
    if axis is None:  # the finite values only (also keeps numpy's summation order of a plain mean)
        v = v.ravel()
        v = v[np.isfinite(v)]
        axis = -1
    elif np.isinf(v).any():
        v = np.where(np.isinf(v), np.nan, v)
    n = np.sum(~np.isnan(v), axis=axis)
    with warnings.catch_warnings():  # all-NaN slices: NaN, not a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(v, axis=axis)
        sd = np.nanstd(v, axis=axis, ddof=1)
    se = np.where(n > 1, sd / np.sqrt(np.maximum(n, 1)), np.nan)
    if v.ndim == 1:
        return float(mean), float(se)
    return mean, se


def holm(p) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values: the k-th smallest of the m finite ones times
    ``m - k + 1``, made monotone, at most 1; NaN stays NaN (not in the family).  Shape as ``p``."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    m = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    return out


def bootstrap_p(draws) -> float:
    """Two-sided bootstrap p of a statistic being 0, from its resampled values ``draws`` (B,):
    ``2 min(1 + #{d <= 0}, 1 + #{d >= 0}) / (1 + B)``, at most 1; NaN without draws."""
    d = np.asarray(draws, dtype=np.float64)
    d = d[np.isfinite(d)]
    if not d.size:
        return float("nan")
    return float(min(1.0, 2 * min(1 + np.sum(d <= 0), 1 + np.sum(d >= 0)) / (1 + d.size)))


def rank_p(value: float, null) -> float:
    """One-sided rank p of ``value`` against the finite exchangeable draws ``null``:
    ``(1 + #{null >= value}) / (1 + n)``; NaN without a finite value or draw."""
    d = np.asarray(null, dtype=np.float64)
    d = d[np.isfinite(d)]
    if not d.size or not np.isfinite(value):
        return float("nan")
    return float((1 + np.sum(d >= value)) / (1 + d.size))


#: resamples of whole episodes for the dialog-level tests (:func:`episode_draws`)
N_BOOT = 2000
#: seed of the episode draws (the same draws for every run of the same task set)
BOOT_SEED = 0


def episode_draws(n_episodes: int, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> np.ndarray:
    """How often each of ``n_episodes`` episodes is drawn in each of ``n_boot`` resamples with
    replacement: counts (n_boot, n_episodes), each row summing to ``n_episodes``."""
    idx = np.random.default_rng(seed).integers(0, n_episodes, size=(n_boot, n_episodes))
    return np.stack([np.bincount(row, minlength=n_episodes) for row in idx])


def acceleration(draws, counts) -> float:
    """The BCa acceleration of a statistic from its resampled values ``draws`` (B,) and the resamples' draws
    ``counts`` (B, E) (:func:`episode_draws`; rows with a non-finite draw left out): the episodes' empirical
    influence ``U`` (E,) is the least-squares regression of the draws on the counts, centred (Efron 1987, section
    7: no refit without each episode), and ``a = sum U^3 / (6 (sum U^2)^(3/2))``; for a mean it is the jackknife's.
    0 where the draws do not vary with the counts."""
    d, c = np.asarray(draws, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != d.shape[0]:
        raise ValueError(f"acceleration: counts must be (B, E) with B = {d.shape[0]} draws, got {c.shape}")
    ok = np.isfinite(d)
    d, c = d[ok], c[ok]
    if d.size < 2 or np.ptp(d) == 0:
        return 0.0
    u = np.linalg.lstsq(c - c.mean(0), d - d.mean(), rcond=None)[0]
    u -= u.mean()
    ss = float(np.sum(u ** 2))
    return float(np.sum(u ** 3) / (6 * ss ** 1.5)) if ss > 0 else 0.0


def bootstrap_interval(draws, level: float = 0.95, estimate: float | None = None,
                       counts=None) -> tuple[float, float]:
    """Percentile interval of the resampled values ``draws`` (B,) (finite ones): the ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles; NaN without draws.  With the ``estimate`` the draws resample, bias-corrected
    (Efron's BC): where a share ``q`` of the draws (ties half) falls below it, ``z0 = Phi^-1(q)`` and the quantiles
    move to ``Phi(2 z0 +- z)``, so draws skewed to one side of the estimate no longer shift the interval that way.
    With the resamples' ``counts`` (B, E) as well, BCa: :func:`acceleration` ``a`` and the quantiles
    ``Phi(z0 + (z0 + z) / (1 - a (z0 + z)))``."""
    d = np.asarray(draws, dtype=np.float64)
    a = acceleration(d, counts) if counts is not None and estimate is not None else 0.0
    d = d[np.isfinite(d)]
    if not d.size:
        return float("nan"), float("nan")
    q = np.array([(1 - level) / 2, (1 + level) / 2])
    if estimate is not None and np.isfinite(estimate):
        from scipy import stats as sps

        below = (np.sum(d < estimate) + 0.5 * np.sum(d == estimate)) / d.size
        z0 = sps.norm.ppf(np.clip(below, 1 / (d.size + 1), d.size / (d.size + 1)))
        z = z0 + sps.norm.ppf(q)
        q = sps.norm.cdf(z0 + z / (1 - a * z))
    lo, hi = np.quantile(d, q)
    return float(lo), float(hi)


def bca_interval(draws, estimate: float, n_episodes: int, level: float = 0.95) -> tuple[float, float]:
    """The BCa interval (:func:`bootstrap_interval`) of a statistic's resamples of whole episodes ``draws`` (B,),
    NaN where a resample has none, around ``estimate``: the counts are the analysis' own draws
    (:func:`episode_draws` of the cube's ``n_episodes``); BC alone without ``n_episodes``."""
    draws = np.asarray(draws, dtype=float)
    counts = episode_draws(n_episodes, draws.size) if n_episodes else None
    return bootstrap_interval(draws, level, estimate=estimate, counts=counts)


def reference_family_se(pair_means, n_split_seeds: int = 3) -> float:
    """Figure 4a's error bar as the reference computes it (``playground/data_analysis.py`` 1206-1207):
    ``np.std(pair_means)`` (ddof 0) ``/ sqrt(n_split_seeds * n_pairs)``, ``pair_means`` (n_pairs,) one SyncR^2 per
    model pair of a family (non-finite ones left out; the reference's ``n_split_seeds`` is 3); NaN without values."""
    v = np.asarray(pair_means, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan
    return float(np.std(v) / np.sqrt(n_split_seeds * v.size))


def _pcol(res: pd.DataFrame) -> str:
    """pingouin names its p-value column ``p_val`` (0.7) or ``p-val`` (older)."""
    return "p_val" if "p_val" in res.columns else "p-val"


def pearson(x, y) -> Correlation:
    """Pearson correlation (pingouin) of ``x`` and ``y`` (n,), pairs with a non-finite member dropped."""
    import pingouin as pg

    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"pearson: x has shape {x.shape} but y has {y.shape}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(x.size)
    if n < MIN_N_CORR:
        return Correlation(math.nan, math.nan, n, (), f"only {n} point{'s' if n != 1 else ''}; "
                           f"a correlation needs at least {MIN_N_CORR}")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return Correlation(math.nan, math.nan, n, (), "one of the variables does not vary")
    with warnings.catch_warnings():  # pingouin warns about power/CI at small n
        warnings.simplefilter("ignore")
        res = pg.corr(x, y, method="pearson")
    return Correlation(float(res["r"].iloc[0]), float(res[_pcol(res)].iloc[0]), n)


def partial_pearson(data: pd.DataFrame, x: str, y: str, covar: str | list[str]) -> Correlation:
    """Partial Pearson correlation (pingouin) of columns ``x`` and ``y`` of ``data`` (one row per model pair)
    given the covariate column(s) ``covar``, e.g. ``"ifeval"``."""
    import pingouin as pg

    covs = [covar] if isinstance(covar, str) else list(covar)
    for col in (x, y, *covs):
        if col not in data.columns:
            raise KeyError(f"partial_pearson: column {col!r} not in {list(data.columns)}")
    d = data[[x, y, *covs]].apply(pd.to_numeric, errors="coerce").dropna()
    n = len(d)
    need = MIN_N_CORR + len(covs)
    if n < need:
        return Correlation(math.nan, math.nan, n, tuple(covs),
                           f"only {n} point{'s' if n != 1 else ''} with scores; a partial "
                           f"correlation given {len(covs)} covariate(s) needs at least {need}")
    if any(np.ptp(d[c].to_numpy()) == 0 for c in (x, y, *covs)):
        return Correlation(math.nan, math.nan, n, tuple(covs), "a variable does not vary")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = pg.partial_corr(data=d, x=x, y=y, covar=covs, method="pearson")
    return Correlation(float(res["r"].iloc[0]), float(res[_pcol(res)].iloc[0]), n, tuple(covs))


def correlations_by_group(table: pd.DataFrame, x: str, y: str, by: str = "family",
                          pooled: str | None = "All pairs") -> pd.DataFrame:
    """Pearson r of ``x`` and ``y`` per group, then pooled (when ``pooled`` is a label): columns ``group, n, r,
    p, reason, text``."""
    rows = []
    groups = list(table.groupby(by, sort=False)) + ([(pooled, table)] if pooled else [])
    for name, sub in groups:
        c = pearson(sub[x], sub[y])
        rows.append({"group": name, "n": c.n, "r": c.r, "p": c.p, "reason": c.reason,
                     "text": c.describe()})
    return pd.DataFrame(rows)


def compare_groups(table: pd.DataFrame, value: str, by: str) -> dict:
    """Whether the groups ``by`` differ in ``value`` over the rows: Welch's t-test for two groups, one-way ANOVA
    for more.  ``{"name", "p" (NaN with fewer than two groups of two values), "n" (rows per group)}``."""
    from scipy import stats as sps

    groups = {k: g[value].dropna().to_numpy(float) for k, g in table.groupby(by, sort=False)}
    ok = [v for v in groups.values() if len(v) >= 2]
    n = {k: len(v) for k, v in groups.items()}
    if len(ok) < 2:
        return {"name": "no test", "p": math.nan, "n": n}
    if len(ok) == 2:
        return {"name": "Welch's t-test", "p": float(sps.ttest_ind(*ok, equal_var=False).pvalue), "n": n}
    return {"name": "one-way ANOVA", "p": float(sps.f_oneway(*ok).pvalue), "n": n}


def pair_ability(pairs: pd.DataFrame, scores: pd.DataFrame, measures=("ifeval", "musr")) -> pd.DataFrame:
    """``pairs`` (``model_a``, ``model_b``) with one column per measure: the mean of its two models' ``scores``
    (``model`` and the measures, :func:`synclib.analysis.results.load_ability_scores`); NaN where one has none."""
    out = pairs.copy()
    s = scores.set_index("model")
    for m in measures:
        if m not in s.columns:
            out[m] = math.nan
            continue
        lookup = s[m].to_dict()
        out[m] = [np.mean([lookup.get(a, math.nan), lookup.get(b, math.nan)])
                  for a, b in zip(out["model_a"], out["model_b"])]
    return out
