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
:class:`pandas.DataFrame` each notebook draws with :mod:`synclib.plots`.  As the paper's
code: SyncR² is aggregated over split seeds by the analysis (``sync_r2``, ``sync_r2_se``);
a model pair's SyncR² is the mean of its directional values (two directions x both speaking
orders), its band the mean of their standard errors; its social performance the mean over
its orders.  ``separate=True`` gives one row per ordered run instead.

:func:`synclib.synthetic.build_synthetic_results` writes a tiny results directory for tests;
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
from synclib.paths import PUBLISHED_NUMBERS, display, in_repo
from synclib.scenarios import RELATIONSHIPS

MANIFEST = "manifest.json"
#: fields every manifest entry (one ordered run) has; ``pair`` and ``order`` are optional
#: (default: the run's own name, order 1), so results written before both orders still load
PAIR_KEYS = ("name", "model_a", "model_b", "family", "analysis", "judge")
#: analysis variable holding SyncR² with the persona-disjoint split (table 2)
PERSONA_VAR = "persona_disjoint_sync_r2"


def _layer_offset(layers) -> int:
    """1 when the analysis numbers layers from 0 (the pages number them from 1), else 0."""
    layers = np.asarray(layers)
    return 1 if (layers.size and layers.min() == 0) else 0


def _grid_frame(grid, value: str) -> pd.DataFrame:
    """A ``(src_layer, tgt_layer)`` grid as rows ``src_layer, tgt_layer, VALUE, best``: layers
    1-based, non-finite cells (padding) dropped, ``best`` the first of each source layer's
    highest values."""
    grid = grid.transpose("src_layer", "tgt_layer")
    vals = grid.to_numpy().astype(float)
    src, tgt = np.asarray(grid["src_layer"]), np.asarray(grid["tgt_layer"])
    offset = _layer_offset(src)
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


def load_ability_scores(path: str | os.PathLike) -> pd.DataFrame:
    """Read a CSV of per-model ability scores for table 1.

    Columns (case-insensitive): ``model`` (a model label or spec as in the manifest),
    ``ifeval``, ``musr``; any other column (e.g. ``source``) is kept.
    """
    path = in_repo(path)
    if not path.is_file():
        raise ResultsError(f"ability_scores: file not found: {display(path)}")
    df = pd.read_csv(path)
    df.columns = [c.strip().lower() for c in df.columns]
    missing = [c for c in ("model", "ifeval", "musr") if c not in df.columns]
    if missing:
        raise ResultsError(f"{path}: missing column(s) {missing}; have {list(df.columns)}")
    for c in ("ifeval", "musr"):
        bad = pd.to_numeric(df[c], errors="coerce").isna() & df[c].notna()
        if bad.any():
            raise ResultsError(f"{path}: column {c!r} has non-numeric value(s) "
                               f"{df.loc[bad, c].tolist()}")
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


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
        """True for a test fixture made by :func:`synclib.synthetic.build_synthetic_results`."""
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
            from synclib.judge import read_table

            path = self.run(name).judge
            self._judge[name] = read_table(path) if path.is_file() else None
        return self._judge[name]

    def runs_with(self, var: str) -> list[str]:
        """Names of the runs whose analysis has variable ``var``."""
        return [r.name for r in self.runs if var in self.analysis(r.name)]

    def _holding(self, frame: pd.DataFrame, var: str) -> pd.DataFrame:
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
        return _grid_frame(grid, "r2")

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

    # ------------------------------------------------------------------ generalisation (fig 2)
    def generalisation_table(self, runs=None) -> pd.DataFrame:
        """How well the maps generalise: per ordered run, direction and layer pair, the genuine
        maps' training R² (``train_r2``: the same maps scored on their training rows) beside
        their test R² (``r2``), each the mean over the split seeds that have both.

        ``runs``: a run name, a list of them, or None for every run; runs whose analysis lacks
        ``train_r2`` (written before it was stored) are left out.

        Returns
        -------
        DataFrame
            ``run, pair, family, direction, source, target`` (the source and target models),
            ``src_layer, tgt_layer`` (1-based as :meth:`heatmap_frame`, padding dropped),
            ``train_r2, test_r2, gap`` (train - test) and ``n_seeds``.
        """
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
            offset = _layer_offset(ds["src_layer"])
            ab = t["direction"] == "A->B"
            parts.append(t.assign(run=r.name, pair=r.pair, family=r.family,
                                  source=np.where(ab, r.model_a, r.model_b), target=np.where(ab, r.model_b, r.model_a),
                                  src_layer=t["src_layer"].astype(int) + offset,
                                  tgt_layer=t["tgt_layer"].astype(int) + offset,
                                  gap=t["train_r2"] - t["test_r2"], n_seeds=t["n_seeds"].astype(int)))
        out = pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)
        return self._holding(out, "train_r2")

    def generalisation_summary(self, table: pd.DataFrame | None = None) -> pd.DataFrame:
        """Per ordered run, over the layer pairs of both directions of
        :meth:`generalisation_table`: the median training and test R², the ``gap_median`` and
        ``gap_mean`` of train - test, ``share_positive`` (the share of layer pairs whose test R²
        is above 0), ``layer_pairs``, and the samples per genuine dataset (``n_train``,
        ``n_test``: the mean over directions and split seeds of :meth:`sample_counts`; NaN
        where the analysis does not record them)."""
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
        return self._holding(pd.DataFrame(rows, columns=["run", "pair", "family", "layer_pairs", "train_median",
                                                         "test_median", "gap_median", "gap_mean", "share_positive",
                                                         "n_train", "n_test"]), "train_r2")

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

    def control_table(self, conditions=None) -> pd.DataFrame:
        """Figure 4a: per family and condition, the mean of the pairs' SyncR² and the
        reference's error bar (:func:`synclib.stats.reference_family_se`).

        ``conditions`` default: genuine, passive and shuffled, those the run has.
        """
        if conditions is None:
            conditions = [c for c in ("genuine", "passive", "shuffled") if c in self.conditions()]
        n_split = len((self.config.get("analysis") or {}).get("split_seeds") or [0, 1, 2])
        rows = []
        for cond in conditions:
            t = self.sync_table(cond)
            for fam, sub in t.groupby("family", sort=False):
                v = sub["mean"].to_numpy(float)
                ok = np.isfinite(v)
                rows.append({"family": fam, "condition": cond,
                             "mean": float(v[ok].mean()) if ok.any() else math.nan,
                             "se": stats.reference_family_se(v, n_split), "n_pairs": int(ok.sum())})
        return pd.DataFrame(rows, columns=["family", "condition", "mean", "se", "n_pairs"])

    def lag_table(self) -> pd.DataFrame:
        """Figure 4b: SyncR² per pair at lag k = 0 (genuine), 1, 2, ... (columns
        ``pair, family, ..., k, mean, se``; se the mean of the directional SEs)."""
        conds = self.conditions()
        lags = [(0, "genuine")] + sorted((int(c[3:]), c) for c in conds
                                         if c.startswith("lag") and c[3:].isdigit())
        rows = []
        for _, runs in self.units():
            for k, cond in lags:
                rows.append({**self.unit_info(runs), "k": k, **self.unit_value(runs, condition=cond)})
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ CKA (ours; the paper has none)
    def cka_frame(self, name: str, condition: str = "genuine", direction: str = "A->B") -> pd.DataFrame:
        """Linear CKA per layer pair of one ordered run (the analysis' ``cka``, on all samples
        of the dataset), with each source layer's most similar target.

        Returns
        -------
        DataFrame
            ``src_layer, tgt_layer, cka, best`` (layers 1-based as :meth:`heatmap_frame`,
            padding dropped); empty when the analysis lacks ``cka`` or ``condition``.
        """
        ds = self.analysis(name)
        if "cka" not in ds or condition not in ds["condition"].values:
            return pd.DataFrame(columns=["src_layer", "tgt_layer", "cka", "best"])
        return _grid_frame(ds["cka"].sel(condition=condition, direction=direction), "cka")

    def cka_table(self, separate: bool = False) -> pd.DataFrame:
        """Per pair (or ordered run) and condition: linear CKA beside SyncR².

        Returns
        -------
        DataFrame
            ``pair, family, model_a, model_b, orders, condition``; ``mean`` (CKA averaged over
            every layer pair, then over the unit's directional values: both directions of each
            order), ``best`` (per source layer the most similar target, averaged over source
            layers, then likewise), ``se`` (NaN: one value per dataset, no split seeds),
            ``sync_r2`` (the unit's SyncR², :meth:`sync_table`), ``n_min``, ``n_max`` (the
            fewest and most samples of its datasets: CKA uses them all) and ``n_values``.
            Empty when no run's analysis has ``cka``.
        """
        cols = ["pair", "family", "model_a", "model_b", "orders", "condition", "mean", "best", "se", "sync_r2",
                "n_min", "n_max", "n_values"]
        if not all("cka" in self.analysis(n) for n in self.run_names):
            return pd.DataFrame(columns=cols)
        rows = []
        for cond in self.conditions():
            sync = self.sync_table(cond, separate).set_index("pair")["mean"]
            for unit, runs in self.units(separate):
                grids = [self.analysis(r.name)["cka"].sel(condition=cond, direction=d).to_numpy()
                         for r in runs for d in self.analysis(r.name)["direction"].values]
                ns = [int(self.analysis(r.name)["n_available"].sel(condition=cond, direction=d))
                      for r in runs for d in self.analysis(r.name)["direction"].values]
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

    # ------------------------------------------------------------------ fig 6, table 1
    def run_social(self, name: str) -> float:
        """One ordered run's social performance (:func:`synclib.judge.social_performance`),
        NaN without a judge table."""
        from synclib.judge import social_performance

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
        from synclib.judge.table import overall_scores

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

    def ability_table(self, scores: pd.DataFrame) -> pd.DataFrame:
        """Table 1's data as the reference's ``compute_partial_correlation`` takes it: per
        unordered pair, the social performance of the order-1 run, the mean of the A->B
        SyncR² of both runs (agent 1 -> agent 2 in each order), and ``ifeval``, ``musr``
        (mean of the two models; matched by manifest label, then spec)."""
        rows = []
        for _, runs in self.units():
            rows.append({**self.unit_info(runs), "social": self.run_social(runs[0].name),
                         "sync": self.unit_value(runs, directions=["A->B"], condition="genuine")["mean"]})
        t = pd.DataFrame(rows)
        lookup = scores.set_index("model")
        keyed = t.copy()
        for side in ("a", "b"):
            specs = {p: getattr(self.runs_of(p)[0], f"spec_{side}") for p in self.pair_names}
            keyed[f"model_{side}"] = [m if m in lookup.index else (specs.get(n) or m)
                                      for n, m in zip(t["pair"], t[f"model_{side}"])]
        withab = stats.pair_ability(keyed, scores)
        t["ifeval"] = withab["ifeval"].to_numpy()
        t["musr"] = withab["musr"].to_numpy()
        return t

    # ------------------------------------------------------------------ fig 7, 8
    def topk_table(self) -> pd.DataFrame:
        """Figure 7: per pair and k, SyncR² with the top-k target layers (clipped, as the
        reference; protocol correction 15), for every k that all the pair's directional values
        have (up to the shallower target model's depth).  ``target_layers``: the depths of the
        pair's target models, e.g. ``"30"`` or ``"18 and 30"`` (a k equal to both is every layer
        of the partner)."""
        rows = []
        for _, runs in self.units():
            ds = self.analysis(runs[0].name)
            ks = ds["sync_r2_topk"]["k"].values
            n_dir = sum(self.analysis(r.name).sizes["direction"] for r in runs)
            depths = sorted({int(ds.attrs[f"n_layers_{s}"]) for s in "ab" if f"n_layers_{s}" in ds.attrs})
            for k in ks:
                v = self.unit_value(runs, "sync_r2_topk", condition="genuine", k=k)
                if v["n_values"] == n_dir:  # k beyond a target model's depth is NaN: no mixed means
                    rows.append({**self.unit_info(runs), "k": int(k), "mean": v["mean"], "se": v["se"],
                                 "target_layers": " and ".join(map(str, depths))})
        return self._holding(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders", "k", "mean",
                                                         "se", "target_layers"]), "sync_r2_topk")

    def topk_correlations(self) -> pd.DataFrame:
        """Figure 7: Pearson r of top-k SyncR² with social performance per family and k."""
        social = self.social_table().set_index("pair")["social"]
        topk = self.topk_table()
        topk["social"] = topk["pair"].map(social)
        rows = []
        for k, sub in topk.groupby("k"):
            cors = stats.correlations_by_group(sub, "social", "mean", by="family")
            for _, c in cors.iterrows():
                rows.append({"group": c["group"], "k": int(k), "n": int(c["n"]), "r": c["r"],
                             "p": c["p"], "significant": bool(c["p"] < 0.05) if np.isfinite(c["p"]) else False,
                             "reason": c["reason"]})
        return pd.DataFrame(rows)

    def penalty_label(self) -> str:
        """The run's ridge penalty in words: ``"λ = 0.1"`` or ``"λ chosen by cross-validation"``."""
        alpha = str(self.analysis(self.runs[0].name).attrs.get("alpha", ""))
        return "λ chosen by cross-validation" if alpha == "cv" else f"λ = {alpha}"

    def clipping_table(self) -> pd.DataFrame:
        """Figure 8: per pair, SyncR² with negatives clipped and kept, at the paper's penalty
        (``penalty`` ``"paper"``: ``paper_alpha_sync_r2[_noclip]``, or the run's own variables
        when its penalty is the paper's) and at the run's own (``"run"``: ``sync_r2[_noclip]``).

        Columns ``pair, family, model_a, model_b, orders, penalty, method, mean, se``.
        """
        from synclib.ridge import PAPER_ALPHA

        rows = []
        own_is_paper = self.penalty_label() == f"λ = {PAPER_ALPHA}"
        for _, runs in self.units():
            have = all("paper_alpha_sync_r2" in self.analysis(r.name) for r in runs)
            kinds = ([("paper", "sync_r2")] if own_is_paper else
                     [("paper", "paper_alpha_sync_r2")] * have + [("run", "sync_r2")])
            for penalty, prefix in kinds:
                for method, suffix in (("clipped at 0", ""), ("kept", "_noclip")):
                    v = self.unit_value(runs, prefix + suffix, condition="genuine")
                    rows.append({**self.unit_info(runs), "penalty": penalty, "method": method, "mean": v["mean"],
                                 "se": v["se"]})
        return self._holding(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders", "penalty",
                                                         "method", "mean", "se"]), "sync_r2_noclip")

    @staticmethod
    def clipping_summary(table: pd.DataFrame) -> dict:
        """Figure 8's numbers from the rows of one penalty of :meth:`clipping_table`: the mean
        over pairs of the clipped and kept SyncR² (``clipped``, ``kept``), the median over pairs
        of the ratio of their standard errors (``se_ratio``) and ``alpha`` (the penalty's value,
        NaN for the run's own when it is not a number)."""
        from synclib.ridge import PAPER_ALPHA

        c = table[table["method"] == "clipped at 0"].set_index("pair")
        k = table[table["method"] == "kept"].set_index("pair")
        both = c.join(k, lsuffix="_c", rsuffix="_k").dropna(subset=["mean_c", "mean_k"])
        ratio = (both["se_k"] / both["se_c"]).replace([np.inf, -np.inf], np.nan)
        return {"clipped": float(both["mean_c"].mean()) if len(both) else math.nan,
                "kept": float(both["mean_k"].mean()) if len(both) else math.nan,
                "se_ratio": float(np.nanmedian(ratio)) if ratio.notna().any() else math.nan,
                "n_pairs": len(both),
                "alpha": PAPER_ALPHA if (table["penalty"] == "paper").all() else math.nan}

    # ------------------------------------------------------------------ optional blocks
    def _units_with(self, var: str) -> list[tuple[str, list[RunInfo]]]:
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
        for _, runs in self._units_with(var):
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
        return self._holding(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders",
                                                         "relationship", "code", "sync", "n_test"]), var)

    def relationship_closeness(self, table: pd.DataFrame | None = None) -> stats.Correlation:
        """Figure 5's test: Pearson r of closeness (the paper's five codes,
        :data:`synclib.scenarios.CLOSENESS_CODES`) with each category's mean SyncR² over
        :meth:`relationship_table`, one point per category (its subsets share its scenarios, so
        the category is the unit).  ``family_member`` stays out: the paper never places it."""
        from synclib.scenarios import CLOSENESS_CODES

        t = self.relationship_table() if table is None else table
        means = t[t["code"].isin(CLOSENESS_CODES)].groupby("code")["sync"].mean()
        return stats.pearson(means.index.to_numpy(float), means.to_numpy(float))

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

    def dataset_sizes(self) -> dict:
        """Per pair with a split, its genuine datasets' samples (training + test), the mean over its runs,
        directions and split seeds (:meth:`sample_counts`): figure 9's last point and its claim's number."""
        counts = self.sample_counts().query("condition == 'genuine'")
        pair_of = {r.name: r.pair for r in self.runs}
        n = (counts["n_train"] + counts["n_test"]).groupby(counts["run"].map(pair_of)).mean()
        return {p: int(round(n[p])) for p in self.pair_names if p in n.index}

    def sample_size_table(self) -> pd.DataFrame:
        """Figure 9: SyncR² per pair and dataset size (reference aggregation).

        The sweep's sizes (``point`` ``"sweep"``), then the pair's genuine SyncR² at the run's
        own full size (``point`` ``"full run"``, ``n_samples`` its mean training plus test
        samples per dataset) where that is larger than the sweep's largest size.
        """
        var = "sample_size_sync_r2"
        rows, sizes = [], self.dataset_sizes()
        for _, runs in self._units_with(var):
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
        return self._holding(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders",
                                                         "n_samples", "mean", "se", "point"]), var)

    def comparison_table(self, var: str, settings: tuple[str, str]) -> pd.DataFrame:
        """Table 2: genuine SyncR² (clipped) against ``var`` per pair, both with the
        reference's aggregation.

        ``settings`` names the two columns, e.g. ``("original", "persona-disjoint")``;
        ``var`` is e.g. ``persona_disjoint_sync_r2``.  Pairs without ``var`` are left out.
        """
        rows = []
        for _, runs in self._units_with(var):
            for setting, v in ((settings[0], "sync_r2"), (settings[1], var)):
                val = self.unit_value(runs, v, condition="genuine")
                rows.append({**self.unit_info(runs), "setting": setting, "mean": val["mean"], "se": val["se"]})
        return self._holding(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders",
                                                         "setting", "mean", "se"]), var)

    def _per_seed_pooled(self, runs, var: str, reduce=("layer_pair", "direction", "agent"), **sel) -> np.ndarray:
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

    def nonlinear_table(self, settings: tuple[str, str] = ("affine", "nonlinear")) -> pd.DataFrame:
        """Table 5: test R² of the affine and the MLP map on the same layer pairs.

        The analysis fits the MLP only on a few layer pairs per direction (``layer_pair``:
        evenly spaced source layers, each with its best affine target), so this is the mean
        test R² over those pairs (``affine_r2``, ``nonlinear_r2``), directions and runs
        averaged, per split seed; not a full SyncR².  Column ``n_layer_pairs`` says how many.
        """
        rows = []
        for _, runs in self._units_with("nonlinear_r2"):
            for setting, var in zip(settings, ("affine_r2", "nonlinear_r2")):
                n_lp = int(self.analysis(runs[0].name)[var].sizes.get("layer_pair", 1))
                m, s = stats.mean_se(self._per_seed_pooled(runs, var))
                rows.append({**self.unit_info(runs), "setting": setting, "mean": m, "se": s,
                             "n_layer_pairs": n_lp})
        return self._holding(pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "orders", "setting",
                                                         "mean", "se", "n_layer_pairs"]), "nonlinear_r2")

    def mlp_training(self) -> pd.DataFrame:
        """Table 5's MLPs, one row per fitted map (run, direction, split seed, layer pair): its
        ``epochs`` (early stopping, ``nonlinear_stopping``), ``steps`` (epochs x minibatches per
        epoch) and ``cap`` (the most epochs allowed)."""
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
        cols = ["run", "direction", "split_seed", "layer_pair", "epochs", "steps", "cap"]
        return self._holding(pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols),
                             "nonlinear_epochs")

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
        for name, runs in self._units_with("tom_kl_best"):
            first = self.analysis(runs[0].name)
            for kind, var in (("decoder", "tom_kl_best"), ("baseline", "tom_kl_baseline")):
                if var not in first:
                    continue
                for target in first[var]["tom_target"].values:
                    for rel in first[var]["tom_relation"].values:
                        m, s = stats.mean_se(self._per_seed_pooled(runs, var, tom_target=target,
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
        return self._holding(pd.DataFrame(rows, columns=cols), "tom_kl_best")

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
