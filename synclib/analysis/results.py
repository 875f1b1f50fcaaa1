"""A results directory, loaded for the pages: :func:`load_results` -> :class:`Results`.

Layout (what ``synclib run`` writes; the manifest's paths are relative to it)::

    RESULTS/
      manifest.json            {"name", "embedded", "config", "created",
                                "pairs": [{"name": "G-S", "pair": "S-G", "order": 2, "model_a", "model_b",
                                           "spec_a", "spec_b", "family": "Cross", "cube": "cubes/G-S.nc",
                                           "analysis": "analysis/G-S.nc", "judge": "judge/G-S.judge.csv"}, ...]}
      cubes/RUN.nc             the activation cube of one ordered run (book/architecture.md)
      analysis/RUN.nc          its analysis
      judge/RUN.judge.csv      its judge scores
      claims.json              the claims judged on the run and their tests (:mod:`synclib.analysis.claims`)

A table's *unit* is a model pair (its ordered runs pooled, as the paper's figures pool both speaking orders)
or, with ``separate=True``, one ordered run.  As the paper's code: a pair's SyncR² is the mean of its
directional values (two directions x both orders, each aggregated over split seeds by the analysis), its
band the mean of their standard errors, its social performance the mean over its orders.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from synclib import stats
from synclib.judge import read_table, social_performance
from synclib.judge.table import overall_scores
from synclib.paths import CLAIMS_FILE, PUBLISHED_NUMBERS, display, in_repo
from synclib.penalty import Penalty
from synclib.analysis.tables import Tables, grid_frame

MANIFEST = "manifest.json"
#: fields every manifest entry has; ``pair`` and ``order`` are optional (default: the run's name, order 1)
PAIR_KEYS = ("name", "model_a", "model_b", "family", "analysis", "judge")
#: analysis variable holding SyncR² with the persona-disjoint split (table 2)
PERSONA_VAR = "persona_disjoint_sync_r2"


class ResultsError(ValueError):
    """A results directory is missing or malformed; the message names the file and field."""


@dataclass(frozen=True)
class RunInfo:
    """One ordered run: a cube, its analysis and judge table (absolute paths).  ``pair`` is the config's
    unordered pair (``"S-G"``); ``order`` is 1 as written (first model is agent 1), 2 reversed (``"G-S"``)."""

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
class Results(Tables):
    """A loaded results directory: ``root``, ``manifest`` and ``runs`` (:class:`RunInfo`, manifest order)."""

    root: Path
    manifest: dict
    runs: list
    _analysis: dict = field(default_factory=dict, repr=False)
    _judge: dict = field(default_factory=dict, repr=False)
    _claims: dict = field(default_factory=dict, repr=False)

    @property
    def embedded(self) -> bool:
        """True when the run used the embedded tiny models."""
        return bool(self.manifest.get("embedded", False))

    @property
    def synthetic(self) -> bool:
        """True for a test fixture (tests/synthetic.py): its manifest says ``"synthetic": true``."""
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

    def _claims_file(self) -> dict:
        if not self._claims:
            path = self.root / CLAIMS_FILE
            if not path.is_file():
                raise ResultsError(f"{display(path)} is missing: the claims step writes it (`synclib run --steps "
                                   "notebooks`, or `synclib notebooks`)")
            data = json.loads(path.read_text())
            for name, t in data.get("tests", {}).items():
                data["tests"][name] = pd.DataFrame(t["rows"], columns=t["columns"])
                data["tests"][name].attrs.update(t.get("attrs") or {})
            self._claims.update(data)
        return self._claims

    def claims(self) -> list[dict]:
        """Every claim judged on this run (``claims.json``), in the paper's order: records with ``id``, ``page``,
        ``keys``, ``what``, ``verdict``, ``reason``, ``measures``, ``numbers``."""
        return self._claims_file()["claims"]

    def claim_inputs(self) -> dict:
        """The files besides the run that the claims step read: ``ability_scores`` (table 1), ``ratings`` and
        ``judge_scores`` (table 4), each relative to the repository where it lies there, or None."""
        return dict(self._claims_file()["inputs"])

    @property
    def n_claim_tests(self) -> int:
        """How many tests the claims' verdicts were Holm-adjusted across."""
        return int(self._claims_file()["n_claim_tests"])

    def claim(self, id: str) -> dict:
        """The claim ``id`` (e.g. ``"passive"``) of :meth:`claims`."""
        found = {c["id"]: c for c in self.claims()}
        if id not in found:
            raise KeyError(f"no claim {id!r}; claims: {', '.join(found)}")
        return found[id]

    def tests(self, name: str) -> pd.DataFrame:
        """A table of the claims step's tests (:func:`synclib.analysis.claims.test_tables`), e.g. ``"trends"``."""
        tables = self._claims_file()["tests"]
        if name not in tables:
            raise KeyError(f"no table of tests {name!r}; tables: {', '.join(tables)}")
        return tables[name].copy()

    def runs_with(self, var: str) -> list[str]:
        """Names of the runs whose analysis has variable ``var``."""
        return [r.name for r in self.runs if var in self.analysis(r.name)]

    def unit_info(self, runs: list[RunInfo], separate: bool = False) -> dict:
        """A unit's row description: ``pair`` (the run's name if ``separate``), ``family``, ``model_a``,
        ``model_b``, ``orders``."""
        first = runs[0]
        return {"pair": first.name if separate else first.pair, "family": first.family,
                "model_a": first.model_a, "model_b": first.model_b, "orders": len(runs)}

    def orders_played(self) -> str:
        """``"both"``, ``"first"`` or ``"mixed"``: the orders pairs of two different models were played in."""
        mixed = [p for p in self.pair_names if self.runs_of(p)[0].model_a != self.runs_of(p)[0].model_b]
        n = {len(self.runs_of(p)) for p in mixed}
        return "both" if n == {2} else "first" if n <= {1} else "mixed"

    def model_table(self) -> pd.DataFrame:
        """Table 3 (appendix F): per configured model ``abbreviation`` (its key), ``model``, ``spec``, ``family``,
        and ``layers`` and ``width`` as its cubes record them (NaN without a cube)."""
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

    def heatmap_frame(self, name: str, condition: str = "genuine",
                      direction: str = "A->B") -> pd.DataFrame:
        """Figures 2-3: test R² per layer pair of one ordered run, averaged over split seeds (the reference's
        ``r2_mean``): ``src_layer, tgt_layer, r2, best`` (1-based layers, padding dropped; ``best`` marks each source
        layer's best target); empty when ``condition`` has no finite value."""
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
        """:meth:`heatmap_frame` per run and condition, keyed by a panel title (``"S-G genuine: SmolLM2 → Gemma"``,
        source model first); ``runs``: a name, a list, or None for the manifest's first ``max_runs``."""
        names = [runs] if isinstance(runs, str) else list(runs) if runs else self.run_names[:max_runs]
        out = {}
        for name in names:
            r = self.run(name)
            src, tgt = (r.model_a, r.model_b) if direction == "A->B" else (r.model_b, r.model_a)
            for cond in conditions:
                out[f"{name} {cond}: {src} → {tgt}"] = self.heatmap_frame(name, cond, direction)
        return out

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
        """``mean`` of the unit's finite directional values (the paper's pair SyncR²), ``se`` the mean of their
        standard errors (the reference's band), ``n_values`` how many were finite."""
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
        """Every dataset's samples as the analyses record them (the one count every page quotes): per split (run,
        condition, direction, split seed), ``n_train``, ``n_test``, ``n_available`` (samples before the split)."""
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

    def run_social(self, name: str) -> float:
        """An ordered run's social performance (:func:`synclib.judge.social_performance`); NaN unjudged."""
        table = self.judge(name)
        return float(social_performance(table)) if table is not None else math.nan

    def social_table(self, separate: bool = False) -> pd.DataFrame:
        """Figure 6, table 1: per pair, social performance, the mean over its ordered runs (the reference's
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
        """Every judged dialog's social performance, the mean of both agents' overall scores (dialogs with
        both scored): ``run, pair, episode, sim_seed, score``."""
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
        """Per ordered run: dialogs judged (``judged`` of ``dialogs`` in the cube) and social performance with a 95 %
        t interval over them (``mean``, ``lo``, ``hi``; with ``judge.sample``, what the sample says of the run)."""
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

    def penalty(self):
        """The run's ridge penalty (figure 8) as its analyses recorded it (:class:`synclib.penalty.Penalty`)."""
        return Penalty.from_attrs(self.analysis(self.runs[0].name).attrs)

    def penalty_label(self) -> str:
        """The run's ridge penalty in words: ``"λ = 0.1"`` or ``"λ chosen by cross-validation"``."""
        return self.penalty().label()


def load_ability_scores(path: str | os.PathLike) -> pd.DataFrame:
    """Table 1's per-model ability scores: a CSV with columns (any case) ``model`` (a label or spec of
    the manifest), ``ifeval``, ``musr``; other columns are kept.  Errors name the file and column."""
    path = in_repo(path)
    if not path.is_file():
        raise ResultsError(f"ability_scores: file not found: {display(path)}")
    df = pd.read_csv(path)
    df.columns = [c.strip().lower() for c in df.columns]
    if missing := [c for c in ("model", "ifeval", "musr") if c not in df.columns]:
        raise ResultsError(f"{display(path)}: missing column(s) {missing}; have {list(df.columns)}")
    for c in ("ifeval", "musr"):
        bad = pd.to_numeric(df[c], errors="coerce").isna() & df[c].notna()
        if bad.any():
            raise ResultsError(f"{display(path)}: column {c!r} has non-numeric value(s) {df.loc[bad, c].tolist()}")
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def load_published(path: str | os.PathLike | None = None) -> dict:
    """The paper's published numbers (``data/published.json``), each with its source."""
    path = Path(path) if path else PUBLISHED_NUMBERS
    if not path.is_file():
        raise ResultsError(f"published numbers not found: {path}")
    return json.loads(path.read_text())
