"""Loading a results directory for the notebooks, as tidy tables.

Layout of a results directory (what ``synclib run`` writes; paths in the manifest are
relative to it)::

    RESULTS/
      manifest.json            {"name": ..., "embedded": bool, "config": {...},
                                "pairs": [{"name": "G-S", "pair": "S-G", "order": 2,
                                           "model_a": label, "model_b": label,
                                           "spec_a": ..., "spec_b": ..., "family": "Cross",
                                           "cube": "cubes/G-S.nc",
                                           "analysis": "analysis/G-S.nc",
                                           "judge": "judge/G-S.judge.csv"}, ...]}
      cubes/RUN.nc             activation cube of one ordered run (book/architecture.md)
      analysis/RUN.nc          its analysis Dataset
      judge/RUN.judge.csv      its judge scores

:func:`load_results` returns a :class:`Results`; its ``*_table`` methods return the tidy
:class:`pandas.DataFrame` each notebook draws with :mod:`synclib.figures.charts`.  As the paper's
code: SyncR² is aggregated over split seeds by the analysis (``sync_r2``, ``sync_r2_se``);
a model pair's SyncR² is the mean of its directional values (two directions x both speaking
orders), its band the mean of their standard errors; its social performance the mean over
its orders.  ``separate=True`` gives one row per ordered run instead.

:func:`synclib.analysis.synthetic.build_synthetic_results` writes a tiny results directory for tests;
its manifest says ``"synthetic": true``.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from synclib import stats
from synclib.judge import read_table, social_performance
from synclib.judge.table import overall_scores
from synclib.paths import PUBLISHED_NUMBERS, display, in_repo
from synclib.penalty import Penalty
from synclib.tasks.scenarios import RELATIONSHIPS

MANIFEST = "manifest.json"
#: fields every manifest entry (one ordered run) has; ``pair`` and ``order`` are optional
#: (default: the run's own name, order 1), so results written before both orders still load
PAIR_KEYS = ("name", "model_a", "model_b", "family", "analysis", "judge")
#: analysis variable holding SyncR² with the persona-disjoint split (table 2)
PERSONA_VAR = "persona_disjoint_sync_r2"


def layer_offset(layers) -> int:
    """1 when the analysis numbers layers from 0 (the pages number them from 1), else 0."""
    layers = np.asarray(layers)
    return 1 if (layers.size and layers.min() == 0) else 0


def grid_frame(grid, value: str) -> pd.DataFrame:
    """A ``(src_layer, tgt_layer)`` grid as rows ``src_layer, tgt_layer, VALUE, best``: layers
    1-based, non-finite cells (padding) dropped, ``best`` the first of each source layer's
    highest values."""
    grid = grid.transpose("src_layer", "tgt_layer")
    vals = grid.to_numpy().astype(float)
    src, tgt = np.asarray(grid["src_layer"]), np.asarray(grid["tgt_layer"])
    offset = layer_offset(src)
    rows = []
    for i in range(vals.shape[0]):
        row = vals[i]
        if not np.isfinite(row).any():
            continue
        best = int(np.nanargmax(row))
        for j in range(vals.shape[1]):
            if np.isfinite(row[j]):
                rows.append({"src_layer": int(src[i]) + offset, "tgt_layer": int(tgt[j]) + offset,
                             value: float(row[j]), "best": j == best})
    return pd.DataFrame(rows, columns=["src_layer", "tgt_layer", value, "best"])


class ResultsError(ValueError):
    """A results directory is missing or malformed; the message names the file and field."""


@dataclass(frozen=True)
class RunInfo:
    """One ordered run of a results directory (a cube, its analysis and judge table).

    ``pair`` is the unordered pair as the config names it (``"S-G"``); ``order`` is 1 for
    the pair as written (its first model plays agent 1) and 2 for the reversed run
    (``name == "G-S"``).  Paths are absolute.
    """

    name: str
    model_a: str
    model_b: str
    family: str
    analysis: Path
    judge: Path
    cube: Path | None = None
    spec_a: str | None = None
    spec_b: str | None = None
    pair: str = ""
    order: int = 1


def _find_results(results_dir: str | os.PathLike) -> Path:
    """Resolve ``results_dir``: as given when absolute, else relative to the repository root."""
    p = in_repo(results_dir)
    if not (p / MANIFEST).is_file():
        raise ResultsError(f"no results at {display(p)}: {MANIFEST} is missing (run `make book` or "
                           "`synclib run` first)")
    return p


def load_results(results_dir: str | os.PathLike) -> "Results":
    """Open a results directory (see the module docstring for its layout)."""
    root = _find_results(results_dir)
    mpath = root / MANIFEST
    where = display(mpath)
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("pairs"), list):
        raise ResultsError(f"{where}: expected an object with a list 'pairs'")
    runs = []
    for i, entry in enumerate(manifest["pairs"]):
        missing = [k for k in PAIR_KEYS if k not in entry]
        if missing:
            raise ResultsError(f"{where}: pairs[{i}] lacks field(s) {missing}")
        order = entry.get("order", 1)
        if order not in (1, 2):
            raise ResultsError(f"{where}: pairs[{i}].order must be 1 or 2, got {order!r}")
        runs.append(RunInfo(
            name=str(entry["name"]), model_a=str(entry["model_a"]), model_b=str(entry["model_b"]),
            family=str(entry["family"]), analysis=root / entry["analysis"],
            judge=root / entry["judge"], cube=root / entry["cube"] if entry.get("cube") else None,
            spec_a=entry.get("spec_a"), spec_b=entry.get("spec_b"),
            pair=str(entry.get("pair") or entry["name"]), order=int(order)))
    if not runs:
        raise ResultsError(f"{where}: 'pairs' is empty")
    return Results(root=root, manifest=manifest, runs=runs)


@dataclass
class Results:
    """A loaded results directory.

    Attributes
    ----------
    root : Path
    manifest : dict
    runs : list of RunInfo
        The ordered runs, in manifest order.

    A *unit* of the tables is a model pair (default: its ordered runs pooled, as the
    paper's figures pool both speaking orders) or, with ``separate=True``, one ordered run
    (the reference's ``separate=True`` view).
    """

    root: Path
    manifest: dict
    runs: list
    _analysis: dict = field(default_factory=dict, repr=False)
    _judge: dict = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ basics
    @property
    def embedded(self) -> bool:
        """True when the run used the embedded tiny models."""
        return bool(self.manifest.get("embedded", False))

    @property
    def synthetic(self) -> bool:
        """True for a test fixture made by :func:`synclib.analysis.synthetic.build_synthetic_results`."""
        return bool(self.manifest.get("synthetic", False))

    @property
    def config(self) -> dict:
        return dict(self.manifest.get("config") or {})

    @property
    def run_names(self) -> list[str]:
        return [r.name for r in self.runs]

    @property
    def pair_names(self) -> list[str]:
        """The unordered model pairs, in order of first appearance."""
        return list(dict.fromkeys(r.pair for r in self.runs))

    def run(self, name: str) -> RunInfo:
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(f"run {name!r} not in {display(self.root / MANIFEST)}; runs: {self.run_names}")

    def runs_of(self, pair: str) -> list[RunInfo]:
        """The ordered runs of ``pair`` (order 1 first)."""
        out = sorted((r for r in self.runs if r.pair == pair), key=lambda r: r.order)
        if not out:
            raise KeyError(f"pair {pair!r} not in {display(self.root / MANIFEST)}; pairs: {self.pair_names}")
        return out

    def units(self, separate: bool = False) -> list[tuple[str, list[RunInfo]]]:
        """``(name, runs)`` per table row: pairs with their runs, or each run alone."""
        if separate:
            return [(r.name, [r]) for r in self.runs]
        return [(p, self.runs_of(p)) for p in self.pair_names]

    def analysis(self, name: str) -> xr.Dataset:
        """The run's analysis Dataset, loaded into memory (cached)."""
        if name not in self._analysis:
            path = self.run(name).analysis
            if not path.is_file():
                raise ResultsError(f"analysis file missing for run {name}: {display(path)}")
            with xr.open_dataset(path) as ds:
                self._analysis[name] = ds.load()
        return self._analysis[name]

    def judge(self, name: str) -> pd.DataFrame | None:
        """The run's judge table, or ``None`` when the run has none for it."""
        if name not in self._judge:
            path = self.run(name).judge
            self._judge[name] = read_table(path) if path.is_file() else None
        return self._judge[name]

    def runs_with(self, var: str) -> list[str]:
        """Names of the runs whose analysis has variable ``var``."""
        return [r.name for r in self.runs if var in self.analysis(r.name)]

    def mark_present(self, frame: pd.DataFrame, var: str) -> pd.DataFrame:
        """``frame`` with ``attrs["present"]``: whether a run's analysis has ``var``, so that an
        empty table can say why (no value could be computed, or the block was not run)."""
        frame.attrs["present"] = bool(self.runs_with(var))
        return frame

    def unit_info(self, runs: list[RunInfo], separate: bool = False) -> dict:
        """A table row's description of a unit: ``pair`` (or the run's name with ``separate``),
        ``family``, ``model_a``, ``model_b`` and ``orders`` (its ordered runs)."""
        first = runs[0]
        return {"pair": first.name if separate else first.pair, "family": first.family,
                "model_a": first.model_a, "model_b": first.model_b, "orders": len(runs)}

    def orders_played(self) -> str:
        """``"both"``, ``"first"`` or ``"mixed"``: whether pairs of two different models
        were played in both speaking orders."""
        mixed = [p for p in self.pair_names if self.runs_of(p)[0].model_a != self.runs_of(p)[0].model_b]
        n = {len(self.runs_of(p)) for p in mixed}
        return "both" if n == {2} else "first" if n <= {1} else "mixed"

    def model_table(self) -> pd.DataFrame:
        """Table 3 (appendix F) for this run: each model's abbreviation (its key in the config),
        its label, spec and family, and its layers and width as the cubes record them.

        Returns
        -------
        DataFrame
            ``abbreviation, model, spec, family, layers, width`` (layers and width NaN where no
            cube of the model is there).
        """
        shapes: dict = {}
        for r in self.runs:
            if r.cube is None or not r.cube.is_file():
                continue
            with xr.open_dataset(r.cube) as c:
                for side, label in (("a", r.model_a), ("b", r.model_b)):
                    shapes.setdefault(label, (c.attrs.get(f"n_layers_{side}"), c.attrs.get(f"d_model_{side}")))
        rows = []
        for key, m in (self.config.get("models") or {}).items():
            label = m.get("label", key)
            layers, width = shapes.get(label, (None, None))
            rows.append({"abbreviation": key, "model": label, "spec": m.get("spec", ""), "family": m.get("family", ""),
                         "layers": math.nan if layers is None else int(layers),
                         "width": math.nan if width is None else int(width)})
        return pd.DataFrame(rows, columns=["abbreviation", "model", "spec", "family", "layers", "width"])

    def describe(self) -> str:
        """One line naming the run, e.g. for a notebook's first output (no machine paths)."""
        kind = ("SYNTHETIC TEST DATA (not results)" if self.synthetic else
                "embedded tiny models" if self.embedded else "configured models")
        where = display(self.root)
        if Path(where).is_absolute():  # outside the repository: no machine path on a page
            where = f"{self.root.name} (outside the repository)"
        return (f"results: {where} ({self.manifest.get('name', 'unnamed')}, {kind}); "
                f"pairs: {', '.join(self.pair_names)}; ordered runs: {', '.join(self.run_names)}")

    # ------------------------------------------------------------------ fig 2, 3
    def heatmap_frame(self, name: str, condition: str = "genuine",
                      direction: str = "A->B") -> pd.DataFrame:
        """Test R² per layer pair of one ordered run, averaged over split seeds, with each
        source layer's best target (the reference's ``r2_mean``).

        Returns
        -------
        DataFrame
            Columns ``src_layer, tgt_layer, r2, best`` (layers 1-based, padding dropped);
            empty when the run has no finite value for ``condition``.
        """
        ds = self.analysis(name)
        if "r2_mean" in ds:
            grid = ds["r2_mean"].sel(condition=condition, direction=direction)
        elif "r2" in ds:
            grid = ds["r2"].sel(condition=condition, direction=direction)
            if "split_seed" in grid.dims:
                grid = grid.mean("split_seed")
        else:
            raise ResultsError(f"{display(self.run(name).analysis)}: no variable 'r2_mean' or 'r2'")
        return grid_frame(grid, "r2")

    def example_run(self) -> str:
        """A run to show as the example: the first cross-family run, else the first run."""
        for r in self.runs:
            if r.family.lower().startswith("cross"):
                return r.name
        return self.runs[0].name

    def heatmap_frames(self, runs=None, conditions=("genuine",), direction: str = "A->B",
                       max_runs: int = 3) -> dict[str, pd.DataFrame]:
        """:meth:`heatmap_frame` for several runs and conditions, keyed by a panel title.

        ``runs``: a run name, a list of them, or None for the first ``max_runs`` runs of the
        manifest.  A title reads
        e.g. ``"S-G genuine: SmolLM2 → Gemma"`` (source model first).
        """
        names = [runs] if isinstance(runs, str) else list(runs) if runs else self.run_names[:max_runs]
        out = {}
        for name in names:
            r = self.run(name)
            src, tgt = (r.model_a, r.model_b) if direction == "A->B" else (r.model_b, r.model_a)
            for cond in conditions:
                out[f"{name} {cond}: {src} → {tgt}"] = self.heatmap_frame(name, cond, direction)
        return out

    # ------------------------------------------------------------------ SyncR² summaries
    def _directional(self, runs: list[RunInfo], var: str, directions=None, **sel) -> tuple[np.ndarray, np.ndarray]:
        """The directional values of ``var`` (and of ``{var}_se``, NaN without it) over
        ``runs``: one per (run, direction), reference-aggregated over split seeds."""
        vals, ses = [], []
        for r in runs:
            ds = self.analysis(r.name)
            if var not in ds:
                raise ResultsError(f"{display(r.analysis)}: no variable {var!r}")
            for v, out in ((var, vals), (f"{var}_se", ses)):
                if v not in ds:
                    out.append(np.full(len(directions or ds["direction"]), np.nan))
                    continue
                da = ds[v].sel(**{k: x for k, x in sel.items() if k in ds[v].dims})
                if directions is not None:
                    da = da.sel(direction=list(directions))
                rest = [d for d in da.dims if d != "direction"]
                if rest:
                    raise ResultsError(f"{display(r.analysis)}: {v} has unexpected dims {rest} after "
                                       f"selecting {sel}")
                out.append(np.atleast_1d(da.to_numpy().astype(float)))
        return np.concatenate(vals), np.concatenate(ses)

    def unit_value(self, runs, var: str = "sync_r2", directions=None, **sel) -> dict:
        """``mean`` of the unit's directional values (the paper's pair SyncR²: both
        directions of both orders), ``se`` the mean of their standard errors (the
        reference's band), ``n_values`` how many were finite."""
        v, se = self._directional(runs, var, directions, **sel)
        ok = np.isfinite(v)
        return {"mean": float(v[ok].mean()) if ok.any() else math.nan,
                "se": float(np.nanmean(se[ok])) if np.isfinite(se[ok]).any() else math.nan,
                "n_values": int(ok.sum())}

    def sync_table(self, condition: str = "genuine", separate: bool = False) -> pd.DataFrame:
        """Per pair (or ordered run): SyncR² ``mean`` over its directional values and ``se``
        (columns ``pair, family, model_a, model_b, orders, condition, mean, se, n_values``)."""
        rows = [{**self.unit_info(runs, separate), "condition": condition,
                 **self.unit_value(runs, "sync_r2", condition=condition)}
                for _, runs in self.units(separate)]
        return pd.DataFrame(rows)

    def conditions(self) -> list[str]:
        """The conditions present in every run's ``sync_r2``, in the analysis' order."""
        sets = [list(self.analysis(n)["sync_r2"]["condition"].values) for n in self.run_names]
        return [c for c in sets[0] if all(c in s for s in sets)]

    def sample_counts(self) -> pd.DataFrame:
        """Samples of every dataset of the run, as the analyses record them: the one count
        every page, the claims list and the run summary quote.

        Returns
        -------
        DataFrame
            One row per (run, condition, direction, split seed) that was split: ``run``,
            ``condition``, ``direction``, ``split_seed``, ``n_train``, ``n_test``,
            ``n_available`` (the dataset's samples before the split).
        """
        rows = []
        for r in self.runs:
            ds = self.analysis(r.name)
            if "n_train" not in ds:
                continue
            t = ds[["n_train", "n_test"]].to_dataframe().reset_index()
            if "n_available" in ds:
                t = t.merge(ds["n_available"].to_dataframe().reset_index(), on=["condition", "direction"])
            rows.append(t[t["n_train"] > 0].assign(run=r.name))
        cols = ["run", "condition", "direction", "split_seed", "n_train", "n_test", "n_available"]
        if not rows:
            return pd.DataFrame(columns=cols)
        return pd.concat(rows, ignore_index=True).reindex(columns=cols)

    # ------------------------------------------------------------------ fig 6, table 1
    def run_social(self, name: str) -> float:
        """One ordered run's social performance (:func:`synclib.judge.social_performance`),
        NaN without a judge table."""
        table = self.judge(name)
        return float(social_performance(table)) if table is not None else math.nan

    def social_table(self, separate: bool = False) -> pd.DataFrame:
        """Per pair: social performance, the mean over its ordered runs (the reference's
        ``get_performance_averaged``), or per run with ``separate``."""
        rows = []
        for _, runs in self.units(separate):
            per_run = [self.run_social(r.name) for r in runs]
            ok = [x for x in per_run if np.isfinite(x)]
            n_ep = 0
            for r in runs:
                t = self.judge(r.name)
                n_ep = max(n_ep, int(t["episode"].nunique()) if t is not None and "episode" in t else 0)
            rows.append({**self.unit_info(runs, separate), "social": float(np.mean(ok)) if ok else math.nan,
                         "judged_episodes": n_ep})
        return pd.DataFrame(rows)

    def dialog_scores(self) -> pd.DataFrame:
        """Every judged dialog's social performance: the mean of both agents' overall scores
        (a dialog counts when both were scored, as :func:`synclib.judge.social_performance`).

        Returns
        -------
        DataFrame
            ``run, pair, episode, sim_seed, score``.
        """
        parts = []
        for r in self.runs:
            t = self.judge(r.name)
            if t is None:
                continue
            wide = overall_scores(t).pivot_table(index=["episode", "sim_seed"], columns="agent",
                                                 values="overall", dropna=False).reindex(columns=[1, 2])
            both = wide[wide.notna().all(axis=1)]
            parts.append(both.mean(axis=1).rename("score").reset_index().assign(run=r.name, pair=r.pair))
        cols = ["run", "pair", "episode", "sim_seed", "score"]
        return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)

    def judged_table(self) -> pd.DataFrame:
        """Per ordered run: the dialogs the judge scored (``judged``, of ``dialogs`` in the
        cube) and the run's social performance with a 95 % t interval over its judged
        dialogs (each dialog: the mean of both agents' overall scores; ``mean``, ``lo``,
        ``hi``).  With a judged sample (``judge.sample``) the interval is what the sample
        can say about the run's mean."""
        from scipy import stats as sps

        scores = self.dialog_scores()
        rows = []
        for r in self.runs:
            if self.judge(r.name) is None:
                continue
            per = scores.loc[scores["run"] == r.name, "score"].to_numpy(float)
            m, se = stats.mean_se(per)
            half = float(sps.t.ppf(0.975, len(per) - 1) * se) if len(per) > 1 else math.nan
            n_dialogs = math.nan
            if r.cube is not None and r.cube.is_file():
                with xr.open_dataset(r.cube) as cube:
                    n_dialogs = int((cube["n_utterances"].values > 0).sum())
            rows.append({"run": r.name, "pair": r.pair, "judged": len(per), "dialogs": n_dialogs,
                         "mean": m, "lo": m - half, "hi": m + half})
        return pd.DataFrame(rows, columns=["run", "pair", "judged", "dialogs", "mean", "lo", "hi"])

    def pair_table(self, min_fit: int = stats.MIN_N_CORR, separate: bool = False) -> pd.DataFrame:
        """Per pair (or run): SyncR² (``sync``, ``sync_se``) and social performance, with
        ``fit``: whether the family has at least ``min_fit`` units with both numbers."""
        sync = self.sync_table(separate=separate).rename(columns={"mean": "sync", "se": "sync_se"})
        social = self.social_table(separate)[["pair", "social", "judged_episodes"]]
        t = sync.merge(social, on="pair")
        ok = t["sync"].notna() & t["social"].notna()
        counts = t[ok].groupby("family")["pair"].count()
        t["fit"] = t["family"].map(counts).fillna(0).ge(min_fit) & ok
        return t

    # ------------------------------------------------------------------ ridge penalty (fig 8)
    def penalty(self):
        """The run's ridge penalty as its analyses recorded it (:class:`synclib.penalty.Penalty`,
        :meth:`~synclib.penalty.Penalty.from_attrs`): ``.kind`` is ``"fixed"`` or ``"cv"``."""
        return Penalty.from_attrs(self.analysis(self.runs[0].name).attrs)

    def penalty_label(self) -> str:
        """The run's ridge penalty in words: ``"λ = 0.1"`` or ``"λ chosen by cross-validation"``."""
        return self.penalty().label()

    # ------------------------------------------------------------------ optional blocks
    def units_with(self, var: str) -> list[tuple[str, list[RunInfo]]]:
        """The units (a pair and its ordered runs) whose runs hold ``var``, each with those runs only."""
        have = set(self.runs_with(var))
        return [(n, [r for r in runs if r.name in have]) for n, runs in self.units()
                if any(r.name in have for r in runs)]

    def relationship_table(self) -> pd.DataFrame:
        """Figure 5: SyncR² samples by relationship (one row per pair, relationship, sample).

        Samples are the values over every dimension other than relationship and direction
        (split seeds, subsampling seeds) of every run of the pair; directions are averaged.
        ``code`` is Sotopia's relationship code (0 stranger .. 5 family_member), for ordering;
        ``n_test`` the test samples each value rests on (the run's mean subset size: every
        relationship is subsampled to the smallest one's count).
        """
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
                    raise ResultsError(f"{display(r.analysis)}: {var} has no 'relationship' dim (dims {da.dims})")
                if "direction" in da.dims:
                    da = da.mean("direction")
                for rel in da["relationship"].values:
                    label = (RELATIONSHIPS.get(int(rel), str(rel))
                             if isinstance(rel, (int, np.integer)) else str(rel))
                    vals = da.sel(relationship=rel).to_numpy().ravel().astype(float)
                    for v in vals[np.isfinite(vals)]:
                        rows.append({**self.unit_info(runs), "relationship": label,
                                     "code": codes.get(label, -1), "sync": float(v), "n_test": n_test})
        return self.mark_present(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders",
                                                         "relationship", "code", "sync", "n_test"]), var)

    def relationship_scenarios(self, with_values: bool = True) -> dict:
        """Distinct scenarios per relationship category among the analysed sources
        (``relationship_n_scenarios``; the fewest over the runs): for the categories with values
        in :meth:`relationship_table`, or with ``with_values=False`` for every category the
        tasks have."""
        have = set(self.relationship_table()["relationship"])
        out: dict = {}
        for r in self.runs:
            ds = self.analysis(r.name)
            if "relationship_n_scenarios" in ds:
                for rel, n in zip(ds["relationship"].values, ds["relationship_n_scenarios"].values):
                    if (str(rel) in have if with_values else int(n) > 0):
                        out[str(rel)] = min(int(n), out.get(str(rel), int(n)))
        return out

    def per_seed_pooled(self, runs, var: str, reduce=("layer_pair", "direction", "agent"), **sel) -> np.ndarray:
        """``var`` per split seed, averaged over ``reduce`` dims and over the runs."""
        per_run = []
        with warnings.catch_warnings():  # split seeds without values (e.g. MLPs fitted on some seeds): NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            for r in runs:
                da = self.analysis(r.name)[var]
                da = da.sel(**{k: v for k, v in sel.items() if k in da.dims})
                da = da.mean([d for d in reduce if d in da.dims])
                per_run.append(np.atleast_1d(da.to_numpy().astype(float)))
            return np.nanmean(np.stack(per_run), axis=0)

    def tom_table(self) -> pd.DataFrame:
        """Figure 11: test KL of the ToM decoders and of the train-mean baseline.

        Uses ``tom_kl_best`` (each probe at its validation-chosen layer) and
        ``tom_kl_baseline`` (dims ``tom_target, tom_relation, agent, split_seed``); the two
        reading agents and the pair's runs are averaged per split seed, then mean and SE
        over split seeds.  ``n_kept`` / ``n_dropped``: replies in / out of the instructed
        "Emotion. Action type." format (``tom_n_kept``, ``tom_n_dropped``, summed over runs).

        Returns
        -------
        DataFrame
            ``pair, family, model_a, model_b, orders, target, relation, panel``,
            ``decoder_or_baseline`` (``"decoder"`` / ``"baseline"``), ``mean``, ``se``,
            ``n_kept``, ``n_dropped``, ``n_train`` and ``n_test`` (samples per probe: mean
            over reading agents, split seeds and runs), ``filtered`` (whether the format
            filter dropped the replies that did not follow it).
        """
        cols = ["pair", "family", "model_a", "model_b", "orders", "target", "relation", "panel",
                "decoder_or_baseline", "mean", "se", "n_kept", "n_dropped", "n_train", "n_test", "filtered"]
        rows = []
        for name, runs in self.units_with("tom_kl_best"):
            first = self.analysis(runs[0].name)
            for kind, var in (("decoder", "tom_kl_best"), ("baseline", "tom_kl_baseline")):
                if var not in first:
                    continue
                for target in first[var]["tom_target"].values:
                    for rel in first[var]["tom_relation"].values:
                        m, s = stats.mean_se(self.per_seed_pooled(runs, var, tom_target=target,
                                                                   tom_relation=rel))
                        counts = self._tom_counts(runs, tom_target=target, tom_relation=rel)
                        sizes = {k: self._tom_size(runs, f"tom_{k}", tom_target=target, tom_relation=rel)
                                 for k in ("n_train", "n_test")}
                        filtered = all(str(self.analysis(r.name).attrs.get("tom_format_filter", "applied"))
                                       .startswith("applied") for r in runs)
                        rows.append({**self.unit_info(runs), "target": str(target),
                                     "relation": str(rel).replace("_", " "),
                                     "panel": f"{name} · {target}", "decoder_or_baseline": kind,
                                     "mean": m, "se": s, "n_kept": counts["kept"],
                                     "n_dropped": counts["dropped"], **sizes, "filtered": filtered})
        return self.mark_present(pd.DataFrame(rows, columns=cols), "tom_kl_best")

    def _tom_size(self, runs, var: str, **sel) -> float:
        """Mean of ``var`` (``tom_n_train`` or ``tom_n_test``) over the reading agents, split
        seeds and ``runs`` at ``sel`` (a dim the variable lacks, as in analyses written before
        the counts had a target dim, is not selected); NaN without it."""
        vals = []
        for r in runs:
            ds = self.analysis(r.name)
            if var in ds:
                da = ds[var]
                vals.append(float(da.sel(**{k: v for k, v in sel.items() if k in da.dims}).to_numpy().mean()))
        return float(np.mean(vals)) if vals else math.nan

    def _tom_counts(self, runs, **sel) -> dict:
        """Replies kept / dropped by the ToM format filter, summed over agents and runs."""
        out = {}
        for c in ("kept", "dropped"):
            total = 0
            for r in runs:
                ds = self.analysis(r.name)
                if f"tom_n_{c}" in ds:
                    da = ds[f"tom_n_{c}"]
                    total += int(da.sel(**{k: v for k, v in sel.items() if k in da.dims}).sum())
            out[c] = total
        return out


# ---------------------------------------------------------------------- published numbers
def load_published(path: str | os.PathLike | None = None) -> dict:
    """The paper's published numbers (``data/published.json``), each with its source."""
    path = Path(path) if path else PUBLISHED_NUMBERS
    if not path.is_file():
        raise ResultsError(f"published numbers not found: {path}")
    return json.loads(path.read_text())
