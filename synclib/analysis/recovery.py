"""Synthetic recovery: how often the analysis recovers a planted difference, per sample size.

On synthetic cubes (:func:`synclib.analysis.synthetic.make_synthetic_cube`) with a planted
genuine-passive difference, how often :func:`synclib.analysis.analyze` followed by the paired
test of :func:`synclib.analysis.power.paired_control_tests` recovers it at p < 0.05, per number of
samples per dataset.

* :func:`coupling_for_difference` finds the generator's ``coupling`` that plants a given
  difference (measured with many samples);
* :func:`recovery_curve` runs the simulation; the curve reports the difference actually
  measured at each size, not the nominal knob;
* :func:`power_curve` runs it at one size over a range of planted differences (the power
  function of the test, from where it almost never recovers them to where it always does);
* :func:`detection_size`, :func:`simulation_sizes` and :func:`curve_frames` read the curve,
  choose its sizes around a run's and tidy it for plotting.

torch and :mod:`synclib.analysis` are imported only when a simulation runs.
"""
from __future__ import annotations

import functools
import math
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields

import numpy as np
import pandas as pd

from synclib.analysis.power import UNITS, corrected_resampled_test, paired_test
from synclib.penalty import PAPER_ALPHA, check_alpha_value

__all__ = [
    "RECOVERY_COLUMNS",
    "RecoveryTest",
    "SyntheticSetting",
    "coupling_for_difference",
    "curve_frames",
    "detection_size",
    "power_curve",
    "recovery_curve",
    "simulation_sizes",
]


@contextmanager
def _one_torch_thread():
    """Tiny ridge fits are fastest single-threaded (and do not fight other processes)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of the ridge
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _synthetic_pairs(n_samples: int, coupling: float, cube_seed: int, *, layers: int, dim: int,
                     n_rounds: int, signal: float, split_seeds, ridge_alpha, unit: str) -> dict:
    """One synthetic ordered run: a cube with enough full-length episodes for ``n_samples``
    samples per dataset, analysed on genuine and passive; its paired values.

    Returns ``{"genuine": (m,), "passive": (m,), "n_train": mean training samples}``."""
    # lazy: torch loads only when a simulation runs (synclib.figures.power imports this module)
    from synclib.analysis import analyze
    # lazy: xarray (the synthetic cubes) loads only when a simulation runs
    from synclib.analysis.synthetic import Planted, Shapes, make_synthetic_cube

    # B->A has n_rounds - 1 samples per full episode, A->B n_rounds
    n_episodes = max(2, math.ceil(n_samples / (n_rounds - 1)))
    cube = make_synthetic_cube(n_episodes=n_episodes, n_seeds=1, n_rounds=n_rounds,
                               shapes=Shapes(layers_a=layers, dim_a=dim, layers_b=layers, dim_b=dim),
                               coupling=coupling, seed=cube_seed,
                               planted=Planted(latent_dim=min(8, dim), signal=signal, relationship_effect=0.0,
                                               min_utterances=2 * n_rounds),
                               passive=True, tom=False)
    ds = analyze(cube, conditions=("genuine", "passive"), penalty=ridge_alpha, n_samples=int(n_samples),
                 split_seeds=tuple(split_seeds), n_boot=0, progress=False, log=lambda m: None)
    per = ds["sync_r2_per_seed"].transpose("condition", "direction", "split_seed")
    g = per.sel(condition="genuine").to_numpy().astype(float)
    p = per.sel(condition="passive").to_numpy().astype(float)
    if unit == "direction":
        g, p = np.nanmean(g, axis=1), np.nanmean(p, axis=1)
    ntr = ds["n_train"].sel(condition="genuine").to_numpy().astype(float)
    nte = ds["n_test"].sel(condition="genuine").to_numpy().astype(float)
    return {"genuine": g.ravel(), "passive": p.ravel(), "n_train": float(ntr[ntr > 0].mean()),
            "n_test": float(nte[nte > 0].mean())}


#: couplings tried by :func:`coupling_for_difference` (the planted difference rises with the
#: coupling up to about 0.7: genuine ~ rho^2, passive ~ rho^4, times the signal fraction)
_CAL_GRID = tuple(np.round(np.arange(0.0, 0.701, 0.1), 2))


@functools.lru_cache(maxsize=16)
def _calibration(calibration_samples: int, layers: int, dim: int, n_rounds: int, signal: float,
                 ridge_alpha, seed: int, n_cubes: int) -> tuple[tuple, tuple]:
    """(couplings, mean genuine-minus-passive SyncR² at ``calibration_samples``): the mean over
    ``n_cubes`` cubes, both directions and split seed 0."""
    diffs = []
    with _one_torch_thread():
        for c in _CAL_GRID:
            vals = [_synthetic_pairs(calibration_samples, float(c), 7_000_000 + seed * 1000 + i, layers=layers,
                                     dim=dim, n_rounds=n_rounds, signal=signal, split_seeds=(0,),
                                     ridge_alpha=ridge_alpha, unit="split_seed") for i in range(n_cubes)]
            diffs.append(float(np.nanmean(np.concatenate([v["genuine"] - v["passive"] for v in vals]))))
    return tuple(float(c) for c in _CAL_GRID), tuple(diffs)


def coupling_for_difference(effect: float, *, calibration_samples: int = 1500, layers: int = 3, dim: int = 8,
                            n_rounds: int = 5, signal: float = 8.0, ridge_alpha=0.1, seed: int = 0,
                            n_cubes: int = 1) -> tuple[float, float]:
    """The ``coupling`` of :func:`synclib.analysis.synthetic.make_synthetic_cube` that plants a
    genuine-minus-passive SyncR² difference of ``effect``.

    In the generator the genuine map predicts across one AR(1) step of the latent dialog
    state (R² ~ rho² times the layers' signal fraction) and the passive reader across two
    (~ rho⁴), so the difference grows with ``coupling = rho`` up to about 0.7.  It is
    calibrated empirically: for couplings 0, 0.1, ..., 0.7 the difference is measured on
    ``n_cubes`` cubes of ``calibration_samples`` samples per dataset (both directions, split
    seed 0), where small-sample shrinkage and noise are small, then interpolated (the
    measured curve made non-decreasing).  Cached per setting; deterministic.

    Parameters
    ----------
    effect : float
        The difference to plant, in SyncR² (> 0).
    calibration_samples, layers, dim, n_rounds, signal, ridge_alpha, seed, n_cubes :
        The synthetic setting (as :func:`recovery_curve`) and the calibration's size.

    Returns
    -------
    (coupling, calibrated_diff) : (float, float)
        ``calibrated_diff`` is the interpolated difference at ``coupling`` (equal to
        ``effect`` inside the calibrated range).

    Raises
    ------
    ValueError
        When ``effect`` exceeds the largest difference this setting can plant (the message
        gives it; raise ``signal`` to plant more).
    """
    if not effect > 0:
        raise ValueError(f"effect must be > 0, got {effect}")
    cs, ds = _calibration(int(calibration_samples), int(layers), int(dim), int(n_rounds), float(signal),
                          ridge_alpha, int(seed), int(n_cubes))
    ds = np.maximum.accumulate(np.maximum(np.asarray(ds), 0.0))
    if effect > ds[-1]:
        raise ValueError(f"a difference of {effect:g} cannot be planted in this synthetic setting: the "
                         f"largest is {ds[-1]:.3f} (coupling {cs[-1]}); raise `signal`")
    # first coupling where the (non-decreasing) curve reaches effect, linear within that step
    j = int(np.argmax(ds >= effect))
    if j == 0:
        return float(cs[0]), float(ds[0])
    lo, hi = ds[j - 1], ds[j]
    frac = 0.0 if hi == lo else (effect - lo) / (hi - lo)
    return float(cs[j - 1] + frac * (cs[j] - cs[j - 1])), float(effect)


#: the tests :func:`recovery_curve` can count a replicate's recovery by
TESTS = ("corrected", "t", "perm")


@dataclass(frozen=True)
class SyntheticSetting:
    """The synthetic world of :func:`recovery_curve` and its analysis, checked once.

    layers, dim : layers per model and their width (tiny by default: 3 of width 8).
    n_rounds : full rounds per episode.
    signal : the layers' signal strength of :func:`synclib.analysis.synthetic.make_synthetic_cube`.
    ridge_alpha : the analysis' ridge penalty, a number > 0 (default the paper's 0.1) or ``"cv"``
        (pass the run's own, :func:`synclib.analysis.power.run_sample_sizes` ``["alpha"]``).
    calibration_samples : samples per dataset of the calibration of a planted difference
        (:func:`coupling_for_difference`).
    """

    layers: int = 3
    dim: int = 8
    n_rounds: int = 5
    signal: float = 8.0
    ridge_alpha: float | str = PAPER_ALPHA
    calibration_samples: int = 1500

    def __post_init__(self):
        for name, lo in (("layers", 1), ("dim", 1), ("n_rounds", 2), ("calibration_samples", 2)):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
            object.__setattr__(self, name, int(v))
        object.__setattr__(self, "signal", float(self.signal))
        check_alpha_value(self.ridge_alpha)

    def analysis(self) -> dict:
        """The keywords of :func:`coupling_for_difference` that describe the world (all but the
        calibration's size)."""
        return {k: v for k, v in asdict(self).items() if k != "calibration_samples"}


@dataclass(frozen=True)
class RecoveryTest:
    """When a replicate of :func:`recovery_curve` counts as recovering the difference.

    test : {"corrected", "t", "perm"}
        The corrected resampled t-test (:func:`synclib.analysis.power.corrected_resampled_test` with the
        analyses' ``n_test / n_train``: the test the book's claims use), the plain paired t-test
        or the sign-flip permutation test.
    level : float
        Significance level.
    unit : {"split_seed", "direction"}
        As :func:`synclib.analysis.power.paired_values`.
    """

    test: str = "corrected"
    level: float = 0.05
    unit: str = "split_seed"

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")
        if self.test not in TESTS:
            raise ValueError(f"test must be one of {', '.join(TESTS)}, got {self.test!r}")
        if not 0 < self.level < 1:
            raise ValueError(f"level must be in (0, 1), got {self.level!r}")


def _curve_options(kwargs: dict) -> dict:
    """Flat keywords (``n_runs``, ``split_seeds``, the fields of :class:`SyntheticSetting` and of
    :class:`RecoveryTest`) as :func:`recovery_curve`'s arguments."""
    names = {f.name for f in fields(SyntheticSetting)}, {f.name for f in fields(RecoveryTest)}
    unknown = sorted(set(kwargs) - names[0] - names[1] - {"n_runs", "split_seeds"})
    if unknown:
        raise TypeError(f"unknown option(s) {unknown}")
    return {**{k: kwargs[k] for k in ("n_runs", "split_seeds") if k in kwargs},
            "setting": SyntheticSetting(**{k: v for k, v in kwargs.items() if k in names[0]}),
            "criterion": RecoveryTest(**{k: v for k, v in kwargs.items() if k in names[1]})}

RECOVERY_COLUMNS = ["n_samples", "n_train", "n_pairs", "effect", "coupling", "calibrated_diff", "n_reps",
                    "detected", "rate", "rate_se", "mean_diff", "se_diff", "mean_genuine", "mean_passive",
                    "mean_sd_diff", "mean_mde"]


def recovery_curve(sample_sizes, effect: float | None, n_reps: int = 10, *, n_runs: int = 4, split_seeds=(0, 1, 2),
                   coupling: float | None = None, setting: SyntheticSetting | None = None,
                   criterion: RecoveryTest | None = None, seed: int = 0) -> pd.DataFrame:
    """How often the method recovers a planted genuine-passive difference, per sample size.

    For each size ``N`` and each of ``n_reps`` replicates: ``n_runs`` independent synthetic
    cubes (:func:`synclib.analysis.synthetic.make_synthetic_cube`, ``layers`` layers of width ``dim``
    per model, one simulation seed, ``n_rounds`` full rounds per episode, enough episodes
    for ``N`` samples per dataset: ``setting``) play the ordered runs of a run; each is analysed
    with :func:`synclib.analysis.analyze` (genuine and passive, ``n_samples=N``, the split seeds,
    ridge penalty ``setting.ridge_alpha``), and the paired test of
    :func:`synclib.analysis.power.paired_control_tests` runs on the replicate's ``n_runs x 2 directions
    (x split seeds)`` paired values.  A replicate *recovers* the difference when the test's
    p < ``criterion.level`` and the mean difference is positive (genuine above passive).

    Parameters
    ----------
    sample_sizes : sequence of int
        Samples per dataset ``N`` (training plus test, split 8:2 by the reference's rule).
    effect : float
        The genuine-minus-passive SyncR² difference to plant, as measured with
        ``setting.calibration_samples`` samples per dataset (:func:`coupling_for_difference`).
        Ignored (may be None) when ``coupling`` is given.
    n_reps : int
        Replicates per size.
    n_runs : int
        Ordered runs (independent cubes) per replicate: the run's design.
    split_seeds : sequence of int
        The split seeds of each analysis.
    coupling : float, optional
        Plant with this coupling directly instead of calibrating ``effect``.
    setting : SyntheticSetting, optional
        The synthetic world, the analysis' ridge penalty and the calibration's size (default
        ``SyntheticSetting()``).
    criterion : RecoveryTest, optional
        The test, its level and the paired unit (default ``RecoveryTest()``: the corrected
        test at 0.05 over split seeds).
    seed : int
        Base seed: cube ``i`` of replicate ``r`` at size index ``z`` has seed
        ``seed * 1_000_000 + z * 10_000 + r * 100 + i``, so the result is deterministic.

    Returns
    -------
    DataFrame
        One row per size, columns :data:`RECOVERY_COLUMNS`: ``n_samples`` (N), ``n_train``
        (mean training samples actually used), ``n_pairs`` (paired values per replicate),
        ``effect`` (nominal), ``coupling``, ``calibrated_diff`` (the difference the coupling
        plants at ``calibration_samples``; NaN when ``coupling`` was given), ``n_reps``,
        ``detected`` (replicates that recovered it), ``rate`` (``detected / n_reps``),
        ``rate_se`` (binomial, ``sqrt(rate (1 - rate) / n_reps)``), ``mean_diff`` and
        ``se_diff`` (mean and standard error over replicates of the replicate's measured
        mean genuine-minus-passive difference: the difference the method actually sees at
        this size, smaller than the planted one at small N), ``mean_genuine``,
        ``mean_passive``, ``mean_sd_diff`` (mean over replicates of the paired differences'
        sd) and ``mean_mde`` (mean over replicates of :func:`synclib.analysis.power.mde_paired`).  The frame's
        ``attrs`` hold the setting.
    """
    setting, criterion = setting or SyntheticSetting(), criterion or RecoveryTest()
    test, level, unit = criterion.test, criterion.level, criterion.unit
    world = setting.analysis()
    if coupling is None:
        if effect is None:
            raise ValueError("recovery_curve: give `effect` or `coupling`")
        coupling, calibrated = coupling_for_difference(effect, calibration_samples=setting.calibration_samples,
                                                       seed=seed, **world)
    else:
        calibrated = math.nan
    rows = []
    with _one_torch_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for z, size in enumerate(int(s) for s in sample_sizes):
            reps = []
            for r in range(int(n_reps)):
                runs = [_synthetic_pairs(size, coupling, seed * 1_000_000 + z * 10_000 + r * 100 + i,
                                         split_seeds=split_seeds, unit=unit, **world) for i in range(int(n_runs))]
                g = np.concatenate([x["genuine"] for x in runs])
                p = np.concatenate([x["passive"] for x in runs])
                res = paired_test(g, p, seed=seed)
                if test == "corrected":
                    ratio = float(np.mean([x["n_test"] / x["n_train"] for x in runs]))
                    cor = corrected_resampled_test(g - p, ratio)
                    res = {**res, "p_corrected": cor["p"], "mde": cor["mde"]}
                pval = {"t": res["p_t"], "perm": res["p_perm"]}.get(test, res.get("p_corrected"))
                hit = bool(np.isfinite(pval) and pval < level and res["mean_diff"] > 0)
                reps.append({**res, "hit": hit, "n_train": float(np.mean([x["n_train"] for x in runs]))})
            rep = pd.DataFrame(reps)
            rate = float(rep["hit"].mean())
            md = rep["mean_diff"].to_numpy(float)
            rows.append({"n_samples": size, "n_train": float(rep["n_train"].mean()),
                         "n_pairs": int(rep["n_pairs"].max()), "effect": math.nan if effect is None else float(effect), "coupling": float(coupling),
                         "calibrated_diff": float(calibrated), "n_reps": int(n_reps),
                         "detected": int(rep["hit"].sum()), "rate": rate,
                         "rate_se": math.sqrt(rate * (1 - rate) / n_reps),
                         "mean_diff": float(np.nanmean(md)),
                         "se_diff": float(np.nanstd(md, ddof=1) / math.sqrt(np.isfinite(md).sum()))
                         if np.isfinite(md).sum() > 1 else math.nan,
                         "mean_genuine": float(rep["mean_a"].mean()), "mean_passive": float(rep["mean_b"].mean()),
                         "mean_sd_diff": float(rep["sd_diff"].mean()), "mean_mde": float(rep["mde"].mean())})
    out = pd.DataFrame(rows, columns=RECOVERY_COLUMNS)
    out.attrs.update({"setting": {**world, "n_runs": int(n_runs), "split_seeds": list(split_seeds),
                                  "unit": unit, "test": test, "level": level,
                                  "calibration_samples": setting.calibration_samples, "seed": int(seed)}})
    return out


#: couplings of :func:`power_curve`: in the default synthetic setting they plant differences
#: from ~0.002 (almost never recovered by the corrected test at a few hundred samples) to ~0.13
POWER_COUPLINGS = (0.1, 0.15, 0.2, 0.225, 0.25, 0.275, 0.3, 0.35, 0.4, 0.5)


def power_curve(n_samples: int, couplings=POWER_COUPLINGS, n_reps: int = 8, *, calibration_samples: int = 1500,
                seed: int = 0, **kwargs) -> pd.DataFrame:
    """The power of the paired test at one size: :func:`recovery_curve` at ``n_samples`` for
    each coupling of ``couplings``, with ``planted`` the genuine-minus-passive difference the
    coupling plants with ``calibration_samples`` samples per dataset (the calibration of
    :func:`coupling_for_difference`, interpolated).  ``kwargs``: :func:`recovery_curve`'s
    ``n_runs`` and ``split_seeds`` and, flat, the fields of :class:`SyntheticSetting`
    (``ridge_alpha``, ``layers``, ...) and of :class:`RecoveryTest` (``test``, ``level``, ``unit``).

    Returns
    -------
    DataFrame
        :data:`RECOVERY_COLUMNS` plus ``planted``, one row per coupling (ascending).
    """
    options = _curve_options({**kwargs, "calibration_samples": calibration_samples})
    st = options["setting"]
    cs, ds = _calibration(st.calibration_samples, st.layers, st.dim, st.n_rounds, st.signal, st.ridge_alpha,
                          int(seed), 1)
    ds = np.maximum.accumulate(np.maximum(np.asarray(ds), 0.0))
    rows = []
    for c in sorted(float(c) for c in couplings):
        one = recovery_curve([int(n_samples)], None, n_reps=n_reps, coupling=c, seed=seed, **options)
        rows.append(one.assign(planted=float(np.interp(c, cs, ds))))
    out = pd.concat(rows, ignore_index=True)
    out.attrs.update(one.attrs)
    return out


def detection_size(curve: pd.DataFrame, target: float = 0.8, by: str = "n_samples"):
    """The smallest ``by`` of a :func:`recovery_curve` (``n_samples``) or :func:`power_curve`
    (``planted``) from which on the detection rate stays at or above ``target``; None when the
    largest stays below it."""
    c = curve.sort_values(by)
    ok = c["rate"].to_numpy() >= target
    if not ok.any() or not ok[-1]:
        return None
    # the last point below target, then the next one
    below = np.where(~ok)[0]
    first = 0 if below.size == 0 else below[-1] + 1
    v = c[by].iloc[first]
    return int(v) if by == "n_samples" else float(v)


def simulation_sizes(n_samples: float, factors=(0.5, 1, 2, 4), minimum: int = 20) -> list[int]:
    """Sample sizes for :func:`recovery_curve` around a run's ``n_samples`` per dataset:
    ``round(n_samples * f)`` for each factor (at least ``minimum``, duplicates dropped,
    ascending); ``[minimum, 2 minimum, 4 minimum, 8 minimum]`` when ``n_samples`` is not finite."""
    if n_samples is None or not np.isfinite(n_samples) or n_samples <= 0:
        return [minimum * 2 ** i for i in range(4)]
    return sorted({max(int(minimum), round(n_samples * f)) for f in factors})


def curve_frames(curve: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tidy frames of a :func:`recovery_curve` for :func:`synclib.figures.charts.lines_with_se`.

    Returns
    -------
    rate : DataFrame
        Columns ``n_samples, series, mean, se``: the detection rate and its binomial SE,
        one row per size, ``series`` naming the planted difference.
    diff : DataFrame
        Columns ``n_samples, series, mean, se``: the measured genuine-minus-passive
        difference (mean and SE over replicates) per size, and the planted one (the
        calibrated difference, SE 0) as a second series.
    """
    c = curve.sort_values("n_samples")
    label = f"planted difference {c['effect'].iloc[0]:.2f}" if len(c) and np.isfinite(c['effect'].iloc[0]) \
        else "planted difference"
    rate = pd.DataFrame({"n_samples": c["n_samples"], "series": label, "mean": c["rate"], "se": c["rate_se"]})
    cal = curve.attrs.get("setting", {}).get("calibration_samples", "many")
    planted = c["calibrated_diff"].where(np.isfinite(c["calibrated_diff"]), c["effect"])
    diff = pd.concat([
        pd.DataFrame({"n_samples": c["n_samples"], "series": "measured (mean over replicates)",
                      "mean": c["mean_diff"], "se": c["se_diff"]}),
        pd.DataFrame({"n_samples": c["n_samples"], "series": f"planted (at {cal} samples)",
                      "mean": planted, "se": 0.0})], ignore_index=True)
    return rate.reset_index(drop=True), diff
