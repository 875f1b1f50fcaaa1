"""The tidy tables the pages draw, one per figure's quantity: :class:`Tables`, a base of
:class:`~synclib.analysis.results.Results` (``res.control_table()``, ``res.topk_table()``, ...).

Each is a DataFrame of numbers read from the analyses (the tests are :mod:`synclib.analysis.claims`'), one row
per unit as :mod:`synclib.analysis.results` defines it.  A table of a block some analyses lack is empty, with
``attrs["present"]`` saying whether any run has it (:meth:`Tables.mark_present`).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import xarray as xr

from synclib import stats
from synclib.paths import display
from synclib.penalty import PAPER_ALPHA, Penalty
from synclib.tasks.scenarios import CLOSENESS_CODES, RELATIONSHIPS

__all__ = ["Tables", "MIN_TEST_SAMPLES", "clipping_summary", "layer_offset", "grid_frame"]

#: rounds with fewer mean test samples are left out of the trend and drawn hollow (thin rounds are noisy, not biased)
MIN_TEST_SAMPLES = 5
_UNIT = ["pair", "family", "model_a", "model_b", "orders"]


def layer_offset(layers) -> int:
    """1 when the analysis numbers layers from 0 (the pages number them from 1), else 0."""
    layers = np.asarray(layers)
    return 1 if (layers.size and layers.min() == 0) else 0


def grid_frame(grid, value: str) -> pd.DataFrame:
    """A ``(src_layer, tgt_layer)`` grid as rows ``src_layer, tgt_layer, VALUE, best``: layers 1-based,
    non-finite cells (padding) dropped, ``best`` the first of each source layer's highest values."""
    grid = grid.transpose("src_layer", "tgt_layer")
    vals = grid.to_numpy().astype(float)
    src, tgt = np.asarray(grid["src_layer"]), np.asarray(grid["tgt_layer"])
    offset = layer_offset(src)
    rows = []
    for i in range(vals.shape[0]):
        if not np.isfinite(vals[i]).any():
            continue
        best = int(np.nanargmax(vals[i]))
        rows += [{"src_layer": int(src[i]) + offset, "tgt_layer": int(tgt[j]) + offset, value: float(vals[i, j]),
                  "best": j == best} for j in range(vals.shape[1]) if np.isfinite(vals[i, j])]
    return pd.DataFrame(rows, columns=["src_layer", "tgt_layer", value, "best"])


def clipping_summary(table: pd.DataFrame) -> dict:
    """Figure 8's numbers from one penalty's rows of :meth:`Tables.clipping_table`: mean over pairs of the clipped
    and kept SyncR², median ratio of their SEs (``se_ratio``), ``n_pairs``, ``alpha`` (the paper's, else NaN)."""
    c = table[table["method"] == "clipped at 0"].set_index("pair")
    k = table[table["method"] == "kept"].set_index("pair")
    both = c.join(k, lsuffix="_c", rsuffix="_k").dropna(subset=["mean_c", "mean_k"])
    ratio = (both["se_k"] / both["se_c"]).replace([np.inf, -np.inf], np.nan)
    return {"clipped": float(both["mean_c"].mean()) if len(both) else math.nan,
            "kept": float(both["mean_k"].mean()) if len(both) else math.nan,
            "se_ratio": float(np.nanmedian(ratio)) if ratio.notna().any() else math.nan, "n_pairs": len(both),
            "alpha": PAPER_ALPHA if (table["penalty"] == "paper").all() else math.nan}


def _slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slopes of ``y`` (..., n) on ``x`` (n,)."""
    xc = x - x.mean()
    return (y - y.mean(axis=-1, keepdims=True)) @ xc / (xc @ xc)


class Tables:
    """The figures' tables (module doc); a base of :class:`~synclib.analysis.results.Results`."""

    def units_with(self, var: str) -> list:
        """The units (a pair and its ordered runs) whose runs hold ``var``, each with those runs only."""
        have = set(self.runs_with(var))
        return [(n, [r for r in runs if r.name in have]) for n, runs in self.units()
                if any(r.name in have for r in runs)]

    def mark_present(self, frame: pd.DataFrame, var: str) -> pd.DataFrame:
        """``frame`` with ``attrs["present"]``: whether some run has ``var`` (so an empty table can say why)."""
        frame.attrs["present"] = bool(self.runs_with(var))
        return frame

    def per_seed_pooled(self, runs, var: str, reduce=("layer_pair", "direction", "agent"), **sel) -> np.ndarray:
        """``var`` per split seed, averaged over the ``reduce`` dims and over ``runs``."""
        per_run = []
        with warnings.catch_warnings():  # split seeds without values (an MLP fitted on some seeds): NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            for r in runs:
                da = self.analysis(r.name)[var]
                da = da.sel(**{k: v for k, v in sel.items() if k in da.dims}).mean([d for d in reduce if d in da.dims])
                per_run.append(np.atleast_1d(da.to_numpy().astype(float)))
            return np.nanmean(np.stack(per_run), axis=0)

    def generalisation_table(self, runs=None) -> pd.DataFrame:
        """Figure 2: per ordered run (``runs``: a name, a list, or None for all), direction and layer pair: the
        genuine maps' ``train_r2`` (scored on their training rows) and ``test_r2``, each the mean over the
        split seeds that have both, ``gap`` (train - test), ``n_seeds``; ``source``/``target`` models."""
        cols = ["run", "pair", "family", "direction", "source", "target", "src_layer", "tgt_layer",
                "train_r2", "test_r2", "gap", "n_seeds"]
        names = [runs] if isinstance(runs, str) else list(runs) if runs else self.run_names
        parts = []
        for name in names:
            r, ds = self.run(name), self.analysis(name)
            if "train_r2" not in ds or "r2" not in ds:
                continue
            train, test = (ds[v].sel(condition="genuine") for v in ("train_r2", "r2"))
            if "split_seed" not in train.dims:
                train, test = train.expand_dims("split_seed"), test.expand_dims("split_seed")
            ok = np.isfinite(train) & np.isfinite(test)
            with warnings.catch_warnings():  # layer pairs without values (padding): NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                both = xr.Dataset({"train_r2": train.where(ok).mean("split_seed"),
                                   "test_r2": test.where(ok).mean("split_seed"), "n_seeds": ok.sum("split_seed")})
            t = both.to_dataframe().reset_index()
            t = t[t["n_seeds"] > 0]
            offset = layer_offset(ds["src_layer"])
            ab = t["direction"] == "A->B"
            parts.append(t.assign(run=r.name, pair=r.pair, family=r.family,
                                  source=np.where(ab, r.model_a, r.model_b), target=np.where(ab, r.model_b, r.model_a),
                                  src_layer=t["src_layer"].astype(int) + offset,
                                  tgt_layer=t["tgt_layer"].astype(int) + offset,
                                  gap=t["train_r2"] - t["test_r2"], n_seeds=t["n_seeds"].astype(int)))
        out = pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)
        return self.mark_present(out, "train_r2")

    def generalisation_summary(self, table: pd.DataFrame | None = None) -> pd.DataFrame:
        """Per ordered run, over :meth:`generalisation_table`'s layer pairs: ``train_median``, ``test_median``,
        ``gap_median``, ``gap_mean``, ``share_positive`` (test R² > 0), ``layer_pairs``, ``n_train``, ``n_test``."""
        t = self.generalisation_table() if table is None else table
        counts = self.sample_counts()
        counts = counts[counts["condition"] == "genuine"]
        rows = []
        for run, sub in t.groupby("run", sort=False):
            c = counts[counts["run"] == run]
            rows.append({"run": run, "pair": sub["pair"].iloc[0], "family": sub["family"].iloc[0],
                         "layer_pairs": len(sub), "train_median": float(sub["train_r2"].median()),
                         "test_median": float(sub["test_r2"].median()), "gap_median": float(sub["gap"].median()),
                         "gap_mean": float(sub["gap"].mean()), "share_positive": float((sub["test_r2"] > 0).mean()),
                         "n_train": float(c["n_train"].mean()) if len(c) else math.nan,
                         "n_test": float(c["n_test"].mean()) if len(c) else math.nan})
        return self.mark_present(pd.DataFrame(rows, columns=[
            "run", "pair", "family", "layer_pairs", "train_median", "test_median", "gap_median", "gap_mean",
            "share_positive", "n_train", "n_test"]), "train_r2")

    # ------------------------------------------------------------------ figures 3-4: the controls
    def control_table(self, conditions=None) -> pd.DataFrame:
        """Figure 4a: per family and condition (default: genuine, passive, shuffled), the mean of the pairs'
        SyncR² and the reference code's error bar (:func:`synclib.stats.reference_family_se`)."""
        if conditions is None:
            conditions = [c for c in ("genuine", "passive", "shuffled") if c in self.conditions()]
        n_split = len((self.config.get("analysis") or {}).get("split_seeds") or [0, 1, 2])
        rows = []
        for cond in conditions:
            for fam, sub in self.sync_table(cond).groupby("family", sort=False):
                v = sub["mean"].to_numpy(float)
                ok = np.isfinite(v)
                rows.append({"family": fam, "condition": cond, "mean": float(v[ok].mean()) if ok.any() else math.nan,
                             "se": stats.reference_family_se(v, n_split), "n_pairs": int(ok.sum())})
        return pd.DataFrame(rows, columns=["family", "condition", "mean", "se", "n_pairs"])

    def lag_table(self) -> pd.DataFrame:
        """Figure 4b: per pair, SyncR² at lag k = 0 (genuine), 1, 2, ... (``k, mean, se, n_values``)."""
        lags = [(0, "genuine")] + sorted((int(c[3:]), c) for c in self.conditions()
                                         if c.startswith("lag") and c[3:].isdigit())
        return pd.DataFrame([{**self.unit_info(runs), "k": k, **self.unit_value(runs, condition=cond)}
                             for _, runs in self.units() for k, cond in lags])

    def contrast_table(self) -> pd.DataFrame:
        """Per pair and control: genuine and the control on the rows both hold (``genuine``, ``control_value``,
        ``gap``), each on all its own samples (``genuine_all``, ``control_all``, ``gap_all``), ``genuine_moved``
        (genuine - genuine_all), for a lag ``genuine_matched`` (genuine at the contrast's size on its own positions,
        :data:`synclib.analysis.contrasts.MATCHED_RULE`; else NaN) and the training samples (``n_train`` per side of
        the contrast, ``n_train_genuine_all``, ``n_train_control_all``: means over directions, split seeds and runs).
        Empty without contrasts."""
        cols = _UNIT + ["control", "genuine", "control_value", "gap", "genuine_all", "control_all", "gap_all",
                        "genuine_moved", "genuine_matched", "n_train", "n_train_genuine_all", "n_train_control_all"]
        if not self.runs or len(self.runs_with("sync_r2_contrast_pooled")) < len(self.runs):
            return pd.DataFrame(columns=cols)

        def train(runs, var, **sel):
            return float(np.mean([self.analysis(r.name)[var].sel(**sel).mean() for r in runs]))

        rows = []
        for _, runs in self.units():
            g_all = self.unit_value(runs, "sync_r2", condition="genuine")["mean"]
            for c in self.conditions():
                if c == "genuine":
                    continue
                g, v = (self.unit_value(runs, "sync_r2_contrast_pooled", contrast=c, side=side)["mean"]
                        for side in ("genuine", "control"))
                c_all = self.unit_value(runs, "sync_r2", condition=c)["mean"]
                matched = (self.unit_value(runs, "sync_r2_matched_pooled", contrast=c)["mean"]
                           if all("sync_r2_matched_pooled" in self.analysis(r.name) for r in runs)
                           and c.startswith("lag") else math.nan)
                rows.append({**self.unit_info(runs), "control": c, "genuine": g, "control_value": v, "gap": g - v,
                             "genuine_all": g_all, "control_all": c_all, "gap_all": g_all - c_all,
                             "genuine_moved": g - g_all, "genuine_matched": matched,
                             "n_train": train(runs, "n_train_contrast", contrast=c, side="genuine"),
                             "n_train_genuine_all": train(runs, "n_train", condition="genuine"),
                             "n_train_control_all": train(runs, "n_train", condition=c)})
        return pd.DataFrame(rows, columns=cols)

    def cka_frame(self, name: str, condition: str = "genuine", direction: str = "A->B") -> pd.DataFrame:
        """Linear CKA per layer pair of one ordered run (``src_layer, tgt_layer, cka, best``, as
        :meth:`~synclib.analysis.results.Results.heatmap_frame`); empty without ``cka`` or ``condition``."""
        ds = self.analysis(name)
        if "cka" not in ds or condition not in ds["condition"].values:
            return pd.DataFrame(columns=["src_layer", "tgt_layer", "cka", "best"])
        return grid_frame(ds["cka"].sel(condition=condition, direction=direction), "cka")

    def cka_table(self, separate: bool = False) -> pd.DataFrame:
        """Per pair (or ordered run) and condition: ``mean`` (linear CKA over every layer pair, then over the unit's
        directional values), ``best`` (each source layer's most similar target, averaged), ``sync_r2`` beside it,
        ``n_min``/``n_max`` (its datasets' samples: CKA uses all), ``n_values``; empty unless every run has ``cka``."""
        cols = _UNIT + ["condition", "mean", "best", "se", "sync_r2", "n_min", "n_max", "n_values"]
        if not all("cka" in self.analysis(n) for n in self.run_names):
            return pd.DataFrame(columns=cols)
        rows = []
        for cond in self.conditions():
            sync = self.sync_table(cond, separate).set_index("pair")["mean"]
            for unit, runs in self.units(separate):
                dirs = [(r, d) for r in runs for d in self.analysis(r.name)["direction"].values]
                grids = [self.analysis(r.name)["cka"].sel(condition=cond, direction=d).to_numpy() for r, d in dirs]
                ns = [int(self.analysis(r.name)["n_available"].sel(condition=cond, direction=d)) for r, d in dirs]
                with warnings.catch_warnings():  # padding rows and columns are NaN
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mean = np.array([np.nanmean(g) for g in grids])
                    best = np.array([np.nanmean(np.nanmax(g, axis=1)) for g in grids])
                ok = np.isfinite(mean)
                rows.append({**self.unit_info(runs, separate), "condition": cond,
                             "mean": float(mean[ok].mean()) if ok.any() else math.nan,
                             "best": float(best[ok].mean()) if ok.any() else math.nan, "se": math.nan,
                             "sync_r2": float(sync.get(unit, math.nan)), "n_min": min(ns), "n_max": max(ns),
                             "n_values": int(ok.sum())})
        return pd.DataFrame(rows, columns=cols)

    def cka_null_table(self) -> pd.DataFrame:
        """Per pair: genuine's mean CKA against its permutation null (``cka_null``, each permutation averaged over the
        directions): ``genuine``, ``null_mean``, ``null_q95``, ``p`` (rank), ``n_perm``, and per control both sides on
        the rows both hold (``cka_contrast``): ``<control>_genuine``, ``<control>_control``."""
        if not self.runs or not all("cka_null" in self.analysis(n) for n in self.run_names):
            return pd.DataFrame(columns=["pair", "genuine", "null_mean", "null_q95", "p", "n_perm"])
        rows = []
        for unit, runs in self.units():
            obs, null, sides = [], [], {}
            for ds in (self.analysis(r.name) for r in runs):
                obs += ds["cka"].sel(condition="genuine").mean(["src_layer", "tgt_layer"]).values.tolist()
                null.append(ds["cka_null"].transpose("direction", "permutation").to_numpy())
                for (c, side), v in (ds["cka_contrast"].mean("direction").to_series().items()
                                     if "cka_contrast" in ds else ()):
                    sides.setdefault(f"{c}_{side}", []).append(v)
            null = np.concatenate(null).mean(axis=0)
            fin, g = null[np.isfinite(null)], float(np.mean(obs))
            rows.append({"pair": unit, "genuine": g, "null_mean": float(fin.mean()) if fin.size else math.nan,
                         "null_q95": float(np.quantile(fin, 0.95)) if fin.size else math.nan, "p": stats.rank_p(g, null),
                         "n_perm": int(fin.size), **{k: float(np.mean(v)) for k, v in sides.items()}})
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ synchrony over the dialog (ours)
    def has_rounds(self) -> bool:
        """Whether every run's analysis scores the rounds of the dialog (``sync_r2_round``)."""
        return bool(self.runs) and all("sync_r2_round" in self.analysis(n) for n in self.run_names)

    def unit_rounds(self, runs, condition: str) -> tuple:
        """A unit's per-round SyncR² (R,), its episode resamples (B, R) or None, and the mean test samples (R,):
        means over its ordered runs and directions (the counts over split seeds too); NaN for a round some
        direction lacks (agent 2's reply to agent 1's last turn has no next state)."""
        vals, boots, ns = [], [], []
        for r in runs:
            ds = self.analysis(r.name)
            if condition not in ds["condition"].values:
                continue
            vals.append(ds["sync_r2_round"].sel(condition=condition).transpose("direction", "round").to_numpy())
            ns.append(ds["n_test_round"].sel(condition=condition).mean("split_seed").transpose("direction", "round")
                      .to_numpy().astype(float))
            if "sync_r2_round_boot" in ds:
                boots.append(ds["sync_r2_round_boot"].sel(condition=condition)
                             .transpose("direction", "boot", "round").to_numpy())
        if not vals:
            return np.array([]), None, np.array([])
        boot = np.mean(np.concatenate(boots), axis=0) if len(boots) == len(vals) else None
        return np.mean(np.concatenate(vals), axis=0), boot, np.mean(np.concatenate(ns), axis=0)

    def round_table(self, conditions=None, separate: bool = False) -> pd.DataFrame:
        """SyncR² per round of the test episodes, per unit and condition: ``round`` (1-based: agent 1's k-th turn,
        or agent 2's reply to it), ``mean`` (over the unit's runs and directions), ``ci_lo``/``ci_hi`` (BCa 95 % over
        resamples, :func:`synclib.stats.bca_interval`), ``n_test``, ``kept`` (≥ :data:`MIN_TEST_SAMPLES`);
        ``attrs["has_rounds"]``."""
        cols = _UNIT + ["condition", "round", "mean", "ci_lo", "ci_hi", "n_test", "kept"]
        if not self.has_rounds():
            return pd.DataFrame(columns=cols)
        rows = []
        for cond in conditions or self.conditions():
            for _, runs in self.units(separate):
                value, boot, n = self.unit_rounds(runs, cond)
                n_ep = int(self.analysis(runs[0].name).attrs.get("n_episodes", 0))
                kept = np.isfinite(value) & (n >= MIN_TEST_SAMPLES)
                for k in np.flatnonzero(np.isfinite(value)):
                    lo, hi = (stats.bca_interval(boot[:, k], value[k], n_ep) if boot is not None
                              else (math.nan, math.nan))
                    rows.append({**self.unit_info(runs, separate), "condition": cond, "round": int(k) + 1,
                                 "mean": float(value[k]), "ci_lo": lo, "ci_hi": hi, "n_test": float(n[k]),
                                 "kept": bool(kept[k])})
        out = pd.DataFrame(rows, columns=cols)
        out.attrs["has_rounds"] = True
        return out

    def round_trends(self, conditions=None, separate: bool = False) -> list[dict]:
        """Per unit and condition, the least-squares slope of :meth:`round_table`'s kept rounds on the round number
        (``slope``, ``first``/``last`` and their rounds, ``n_rounds``; none under three kept rounds) and each episode
        resample's (``draws``), which :mod:`synclib.analysis.claims` tests; conditions no round scored are left out."""
        if not self.has_rounds():
            return []
        out = []
        for cond in conditions or self.conditions():
            units = [(runs, self.unit_rounds(runs, cond)) for _, runs in self.units(separate)]
            if not any(np.isfinite(value).any() for _, (value, _, _) in units):
                continue
            for runs, (value, boot, n) in units:
                kept = np.flatnonzero(np.isfinite(value) & (n >= MIN_TEST_SAMPLES))
                row = {**self.unit_info(runs, separate), "condition": cond, "slope": math.nan, "n_rounds": len(kept),
                       "first_round": math.nan, "last_round": math.nan, "first": math.nan, "last": math.nan,
                       "n_episodes": int(self.analysis(runs[0].name).attrs.get("n_episodes", 0)), "draws": None}
                if len(kept) >= 3:
                    x = kept + 1.0  # rounds are 1-based on the pages
                    row.update(slope=float(_slope(x, value[kept])), first_round=int(x[0]), last_round=int(x[-1]),
                               first=float(value[kept[0]]), last=float(value[kept[-1]]))
                    if boot is not None:
                        row["draws"] = _slope(x, boot[:, kept])  # NaN where a resample misses a round
                out.append(row)
        return out

    def relationship_table(self) -> pd.DataFrame:
        """Figure 5: SyncR² samples by relationship, one row per pair, relationship and sample (directions
        averaged); ``code`` is Sotopia's (0 stranger .. 5 family_member), ``n_test`` each value's test samples."""
        var = "relationship_sync_r2"
        codes = {name: code for code, name in RELATIONSHIPS.items()}
        rows = []
        for _, runs in self.units_with(var):
            for r in runs:
                ds = self.analysis(r.name)
                da = ds[var]
                size = ds.get("relationship_subset_size")
                n_test = float(size.where(size > 0).mean()) if size is not None else math.nan
                if "relationship" not in da.dims:
                    raise ValueError(f"{display(r.analysis)}: {var} has no 'relationship' dim (dims {da.dims})")
                if "direction" in da.dims:
                    da = da.mean("direction")
                for rel in da["relationship"].values:
                    label = RELATIONSHIPS.get(int(rel), str(rel)) if isinstance(rel, (int, np.integer)) else str(rel)
                    vals = da.sel(relationship=rel).to_numpy().ravel().astype(float)
                    rows += [{**self.unit_info(runs), "relationship": label, "code": codes.get(label, -1),
                              "sync": float(v), "n_test": n_test} for v in vals[np.isfinite(vals)]]
        return self.mark_present(pd.DataFrame(rows, columns=_UNIT + ["relationship", "code", "sync", "n_test"]), var)

    def closeness_means(self, table: pd.DataFrame | None = None) -> pd.DataFrame:
        """Each closeness category's mean SyncR² per model pair (code x pair), over the paper's five codes."""
        t = self.relationship_table() if table is None else table
        t = t[t["code"].isin(CLOSENESS_CODES)]
        return t.groupby(["code", "pair"])["sync"].mean().unstack("pair")

    def relationship_scenarios(self, with_values: bool = True) -> dict:
        """Distinct scenarios per relationship category (``relationship_n_scenarios``, fewest over the runs), of
        the categories with values, or with ``with_values=False`` of every category the tasks have."""
        have = set(self.relationship_table()["relationship"])
        out: dict = {}
        for r in self.runs:
            ds = self.analysis(r.name)
            if "relationship_n_scenarios" in ds:
                for rel, n in zip(ds["relationship"].values, ds["relationship_n_scenarios"].values):
                    if (str(rel) in have if with_values else int(n) > 0):
                        out[str(rel)] = min(int(n), out.get(str(rel), int(n)))
        return out

    def ability_table(self, scores: pd.DataFrame) -> pd.DataFrame:
        """Table 1's data as the reference's ``compute_partial_correlation`` takes it: per pair, the order-1 run's
        social performance, the mean A->B SyncR² of both runs, and ``ifeval``, ``musr`` (the two models' mean,
        matched by label, then spec; ``scores``: :func:`~synclib.analysis.results.load_ability_scores`)."""
        t = pd.DataFrame([{**self.unit_info(runs), "social": self.run_social(runs[0].name),
                           "sync": self.unit_value(runs, directions=["A->B"], condition="genuine")["mean"]}
                          for _, runs in self.units()])
        lookup, keyed = scores.set_index("model"), t.copy()
        for side in ("a", "b"):
            specs = {p: getattr(self.runs_of(p)[0], f"spec_{side}") for p in self.pair_names}
            keyed[f"model_{side}"] = [m if m in lookup.index else (specs.get(n) or m)
                                      for n, m in zip(t["pair"], t[f"model_{side}"])]
        withab = stats.pair_ability(keyed, scores)
        return t.assign(ifeval=withab["ifeval"].to_numpy(), musr=withab["musr"].to_numpy())

    def topk_table(self) -> pd.DataFrame:
        """Figure 7: per pair and k, SyncR² with the top-k target layers (clipped, as the reference), for
        every k all the pair's directional values have; ``target_layers`` the target models' depths."""
        rows = []
        for _, runs in self.units():
            ds = self.analysis(runs[0].name)
            n_dir = sum(self.analysis(r.name).sizes["direction"] for r in runs)
            depths = sorted({int(ds.attrs[f"n_layers_{s}"]) for s in "ab" if f"n_layers_{s}" in ds.attrs})
            for k in ds["sync_r2_topk"]["k"].values:
                v = self.unit_value(runs, "sync_r2_topk", condition="genuine", k=k)
                if v["n_values"] == n_dir:  # k beyond a target model's depth is NaN: no mixed means
                    rows.append({**self.unit_info(runs), "k": int(k), "mean": v["mean"], "se": v["se"],
                                 "target_layers": " and ".join(map(str, depths))})
        return self.mark_present(pd.DataFrame(rows, columns=_UNIT + ["k", "mean", "se", "target_layers"]),
                                 "sync_r2_topk")

    def clipping_table(self) -> pd.DataFrame:
        """Figure 8: per pair, SyncR² with negatives clipped and kept (``method``), at the paper's penalty
        (``penalty`` "paper": ``paper_alpha_sync_r2[_noclip]``, or the run's own variables when its penalty is the
        paper's) and at the run's own ("run": ``sync_r2[_noclip]``)."""
        rows = []
        own_is_paper = self.penalty().is_paper()
        for _, runs in self.units():
            have = all("paper_alpha_sync_r2" in self.analysis(r.name) for r in runs)
            kinds = ([("paper", "sync_r2")] if own_is_paper else
                     [("paper", "paper_alpha_sync_r2")] * have + [("run", "sync_r2")])
            for penalty, prefix in kinds:
                for method, suffix in (("clipped at 0", ""), ("kept", "_noclip")):
                    v = self.unit_value(runs, prefix + suffix, condition="genuine")
                    rows.append({**self.unit_info(runs), "penalty": penalty, "method": method, "mean": v["mean"],
                                 "se": v["se"]})
        return self.mark_present(pd.DataFrame(rows, columns=_UNIT + ["penalty", "method", "mean", "se"]),
                                 "sync_r2_noclip")

    def penalty_table(self) -> pd.DataFrame:
        """Where the cross-validated penalties fell on their grid (``alpha_relative``), per run and condition:
        ``fits`` (source layers x split seeds x directions), ``at_top``/``at_bottom`` (shares at the grid's ends),
        ``median`` (relative penalty), ``grid_lo``/``grid_hi``.  Empty for a fixed penalty."""
        rows = []
        for r in self.runs:
            ds = self.analysis(r.name)
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
        return pd.DataFrame(rows, columns=["run", "pair", "condition", "fits", "at_top", "at_bottom", "median",
                                           "grid_lo", "grid_hi"])

    def dataset_sizes(self) -> dict:
        """Per pair with a split: its genuine datasets' samples (training + test), the mean over runs, directions
        and split seeds (figure 9's last point)."""
        counts = self.sample_counts().query("condition == 'genuine'")
        pair_of = {r.name: r.pair for r in self.runs}
        n = (counts["n_train"] + counts["n_test"]).groupby(counts["run"].map(pair_of)).mean()
        return {p: int(round(n[p])) for p in self.pair_names if p in n.index}

    def sample_sizes(self, condition: str = "genuine") -> dict:
        """Samples of the datasets of ``condition`` (:meth:`sample_counts`): ``n_train`` and ``n_samples`` (training
        + test), means over runs, directions and split seeds; ``n_train_min``, ``n_train_max``, ``split_seeds`` and
        ``directions`` (first run's), ``n_runs``, ``dims`` (the models' widths, from the cubes present)."""
        c = self.sample_counts().query("condition == @condition")
        ntr, nte = c["n_train"].to_numpy(float), c["n_test"].to_numpy(float)
        first = self.analysis(self.runs[0].name)
        dims = set()
        for r in self.runs:
            if r.cube is not None and r.cube.is_file():
                try:
                    with xr.open_dataset(r.cube) as cube:
                        dims |= {int(cube.attrs[k]) for k in ("d_model_a", "d_model_b") if k in cube.attrs}
                except (OSError, ValueError):
                    pass
        return {"n_train": float(ntr.mean()) if ntr.size else math.nan,
                "n_samples": float((ntr + nte).mean()) if ntr.size else math.nan,
                "n_train_min": int(ntr.min()) if ntr.size else 0, "n_train_max": int(ntr.max()) if ntr.size else 0,
                "split_seeds": int(first.sizes.get("split_seed", 0)), "n_runs": len(self.runs),
                "directions": int(first.sizes.get("direction", 0)), "dims": sorted(dims)}

    def sample_size_table(self) -> pd.DataFrame:
        """Figure 9: SyncR² per pair at the sweep's dataset sizes (``point`` "sweep"), then at the run's own
        full size (``point`` "full run", :meth:`dataset_sizes`) where that is larger."""
        var = "sample_size_sync_r2"
        rows, sizes = [], self.dataset_sizes()
        for _, runs in self.units_with(var):
            da = self.analysis(runs[0].name)[var]
            sdim = next(d for d in da.dims if d not in ("direction", "split_seed"))
            for n in da[sdim].values:
                v = self.unit_value(runs, var, **{sdim: n})
                rows.append({**self.unit_info(runs), "n_samples": int(n), "mean": v["mean"], "se": v["se"],
                             "point": "sweep"})
            n = sizes.get(runs[0].pair, 0)
            if n > int(da[sdim].max()):
                v = self.unit_value(runs, "sync_r2", condition="genuine")
                rows.append({**self.unit_info(runs), "n_samples": n, "mean": v["mean"], "se": v["se"],
                             "point": "full run"})
        return self.mark_present(pd.DataFrame(rows, columns=_UNIT + ["n_samples", "mean", "se", "point"]), var)

    def persona_table(self, settings=("original", "persona-disjoint")) -> pd.DataFrame:
        """Table 2: per pair, genuine SyncR² with the original and the persona-disjoint split
        (``persona_disjoint_sync_r2``), both aggregated as the reference (``setting, mean, se``)."""
        var = "persona_disjoint_sync_r2"
        rows = [{**self.unit_info(runs), "setting": setting, **{k: v for k, v in self.unit_value(
                    runs, name, condition="genuine").items() if k != "n_values"}}
                for _, runs in self.units_with(var) for setting, name in zip(settings, ("sync_r2", var))]
        return self.mark_present(pd.DataFrame(rows, columns=_UNIT + ["setting", "mean", "se"]), var)

    def nonlinear_table(self, settings=("affine", "nonlinear")) -> pd.DataFrame:
        """Table 5: test R² of the affine and the MLP map (not a SyncR²) on the MLP's few layer pairs per direction,
        per split seed pooled over directions and runs, then mean and SE over split seeds; ``n_layer_pairs``."""
        rows = []
        for _, runs in self.units_with("nonlinear_r2"):
            for setting, var in zip(settings, ("affine_r2", "nonlinear_r2")):
                m, s = stats.mean_se(self.per_seed_pooled(runs, var))
                rows.append({**self.unit_info(runs), "setting": setting, "mean": m, "se": s,
                             "n_layer_pairs": int(self.analysis(runs[0].name)[var].sizes.get("layer_pair", 1))})
        return self.mark_present(pd.DataFrame(rows, columns=_UNIT + ["setting", "mean", "se", "n_layer_pairs"]),
                                 "nonlinear_r2")

    def mlp_training(self) -> pd.DataFrame:
        """Table 5's MLPs, one row per fitted map (run, direction, split seed, layer pair): ``epochs`` (early
        stopping), ``steps`` (epochs x minibatches per epoch) and ``cap`` (the most epochs allowed)."""
        cols = ["run", "direction", "split_seed", "layer_pair", "epochs", "steps", "cap"]
        rows = []
        for r in self.runs:
            ds = self.analysis(r.name)
            if "nonlinear_epochs" in ds:
                t = ds[["nonlinear_epochs", "nonlinear_steps_per_epoch"]].to_dataframe().reset_index()
                t = t[t["nonlinear_epochs"] > 0]
                rows.append(pd.DataFrame({"run": r.name, "direction": t["direction"], "split_seed": t["split_seed"],
                                          "layer_pair": t["layer_pair"], "epochs": t["nonlinear_epochs"],
                                          "steps": t["nonlinear_epochs"] * t["nonlinear_steps_per_epoch"],
                                          "cap": int(ds.attrs.get("nonlinear_max_epochs", -1))}))
        return self.mark_present(pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols),
                                 "nonlinear_epochs")

    def tom_table(self) -> pd.DataFrame:
        """Figure 11: test KL of the ToM decoders (``tom_kl_best``) and of the train-mean baseline per pair, target
        and relation (``decoder_or_baseline``): per split seed averaged over reading agents and runs, then ``mean``
        and ``se`` over seeds; ``n_kept``/``n_dropped`` (replies in/out of the "Emotion. Action type." format),
        ``n_train``/``n_test`` per probe, ``filtered`` (whether the format filter dropped the others)."""
        cols = _UNIT + ["target", "relation", "panel", "decoder_or_baseline", "mean", "se", "n_kept", "n_dropped",
                        "n_train", "n_test", "filtered"]
        rows = []
        for name, runs in self.units_with("tom_kl_best"):
            first = self.analysis(runs[0].name)
            filtered = all(str(self.analysis(r.name).attrs.get("tom_format_filter", "applied")).startswith("applied")
                           for r in runs)
            for kind, var in (("decoder", "tom_kl_best"), ("baseline", "tom_kl_baseline")):
                if var not in first:
                    continue
                for target in first[var]["tom_target"].values:
                    for rel in first[var]["tom_relation"].values:
                        at = {"tom_target": target, "tom_relation": rel}
                        m, s = stats.mean_se(self.per_seed_pooled(runs, var, **at))
                        counts = {c: sum(int(self._tom_var(r, f"tom_n_{c}", at).sum()) for r in runs
                                         if f"tom_n_{c}" in self.analysis(r.name)) for c in ("kept", "dropped")}
                        sizes = {k: float(np.mean(v)) if (v := [float(self._tom_var(r, f"tom_{k}", at).mean())
                                                                for r in runs if f"tom_{k}" in self.analysis(r.name)])
                                 else math.nan for k in ("n_train", "n_test")}
                        rows.append({**self.unit_info(runs), "target": str(target),
                                     "relation": str(rel).replace("_", " "), "panel": f"{name} · {target}",
                                     "decoder_or_baseline": kind, "mean": m, "se": s, "n_kept": counts["kept"],
                                     "n_dropped": counts["dropped"], **sizes, "filtered": filtered})
        return self.mark_present(pd.DataFrame(rows, columns=cols), "tom_kl_best")

    def _tom_var(self, run, var: str, at: dict) -> np.ndarray:
        """``var`` of ``run``'s analysis at ``at``, selecting only the dims it has."""
        da = self.analysis(run.name)[var]
        return da.sel(**{k: v for k, v in at.items() if k in da.dims}).to_numpy()
