"""Loading a results directory for the notebooks, as tidy tables.

Layout of a results directory (what ``synclib run`` writes; paths in the manifest are
relative to it)::

    RESULTS/
      manifest.json            {"name": ..., "embedded": bool, "config": {...},
                                "pairs": [{"name": "S-G", "model_a": label, "model_b": label,
                                           "spec_a": ..., "spec_b": ..., "family": "Cross",
                                           "cube": "cubes/S-G.nc",
                                           "analysis": "analysis/S-G.nc",
                                           "judge": "judge/S-G.judge.csv"}, ...]}
      cubes/PAIR.nc            activation cube (book/architecture.md, "The cube")
      analysis/PAIR.nc         analysis Dataset (book/architecture.md, "Analysis results")
      judge/PAIR.judge.csv     judge scores (book/architecture.md, "Judge scores")

:func:`load_results` returns a :class:`Results`; its ``*_table`` methods return the tidy
:class:`pandas.DataFrame` each notebook draws with :mod:`synclib.plots`.  Every value is
summarised over split seeds as a mean and standard error (:func:`synclib.stats.mean_se`);
a pair's SyncR² is the mean of its two directions, per split seed.

:func:`synclib.synthetic.build_synthetic_results` writes a tiny results directory for tests;
its manifest says ``"synthetic": true``.
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
from synclib.paths import PUBLISHED_NUMBERS, display, in_repo
from synclib.scenarios import RELATIONSHIPS

MANIFEST = "manifest.json"
PAIR_KEYS = ("name", "model_a", "model_b", "family", "analysis", "judge")
#: analysis variable holding SyncR² with the persona-disjoint split (table 2)
PERSONA_VAR = "persona_disjoint_sync_r2"


class ResultsError(ValueError):
    """A results directory is missing or malformed; the message names the file and field."""


@dataclass(frozen=True)
class PairInfo:
    """One model pair of a run; paths are absolute."""

    name: str
    model_a: str
    model_b: str
    family: str
    analysis: Path
    judge: Path
    cube: Path | None = None
    spec_a: str | None = None
    spec_b: str | None = None


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
    try:
        manifest = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{mpath}: not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("pairs"), list):
        raise ResultsError(f"{mpath}: expected an object with a list 'pairs'")
    pairs = []
    for i, entry in enumerate(manifest["pairs"]):
        missing = [k for k in PAIR_KEYS if k not in entry]
        if missing:
            raise ResultsError(f"{mpath}: pairs[{i}] lacks field(s) {missing}")
        pairs.append(PairInfo(
            name=str(entry["name"]), model_a=str(entry["model_a"]), model_b=str(entry["model_b"]),
            family=str(entry["family"]), analysis=root / entry["analysis"],
            judge=root / entry["judge"], cube=root / entry["cube"] if entry.get("cube") else None,
            spec_a=entry.get("spec_a"), spec_b=entry.get("spec_b")))
    if not pairs:
        raise ResultsError(f"{mpath}: 'pairs' is empty")
    return Results(root=root, manifest=manifest, pairs=pairs)


def load_ability_scores(path: str | os.PathLike) -> pd.DataFrame:
    """Read a CSV of per-model ability scores for table 1.

    Columns (case-insensitive): ``model`` (a model label or spec as in the manifest),
    ``ifeval``, ``musr``; any other column (e.g. ``source``) is kept.
    """
    path = Path(path)
    if not path.is_file():
        raise ResultsError(f"ability_scores: file not found: {path}")
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
    pairs : list of PairInfo
    """

    root: Path
    manifest: dict
    pairs: list
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
    def pair_names(self) -> list[str]:
        return [p.name for p in self.pairs]

    def pair(self, name: str) -> PairInfo:
        for p in self.pairs:
            if p.name == name:
                return p
        raise KeyError(f"pair {name!r} not in {self.root / MANIFEST}; pairs: {self.pair_names}")

    def analysis(self, name: str) -> xr.Dataset:
        """The pair's analysis Dataset, loaded into memory (cached)."""
        if name not in self._analysis:
            path = self.pair(name).analysis
            if not path.is_file():
                raise ResultsError(f"analysis file missing for pair {name}: {path}")
            with xr.open_dataset(path) as ds:
                self._analysis[name] = ds.load()
        return self._analysis[name]

    def judge(self, name: str) -> pd.DataFrame | None:
        """The pair's judge table, or ``None`` when the run has none for it."""
        if name not in self._judge:
            from synclib.judge import read_table

            path = self.pair(name).judge
            self._judge[name] = read_table(path) if path.is_file() else None
        return self._judge[name]

    def pairs_with(self, var: str) -> list[str]:
        """Names of the pairs whose analysis has variable ``var``."""
        return [p.name for p in self.pairs if var in self.analysis(p.name)]

    def _info(self, name: str) -> dict:
        p = self.pair(name)
        return {"pair": p.name, "family": p.family, "model_a": p.model_a, "model_b": p.model_b}

    def describe(self) -> str:
        """One line naming the run, e.g. for a notebook's first output."""
        kind = ("SYNTHETIC TEST DATA (not results)" if self.synthetic else
                "embedded tiny models" if self.embedded else "configured models")
        return (f"results: {self.root} ({self.manifest.get('name', 'unnamed')}, {kind}); "
                f"pairs: {', '.join(self.pair_names)}")

    # ------------------------------------------------------------------ fig 2, 3
    def heatmap_frame(self, name: str, condition: str = "genuine",
                      direction: str = "A->B") -> pd.DataFrame:
        """Test R² per layer pair, averaged over split seeds, with each source's best target.

        Returns
        -------
        DataFrame
            Columns ``src_layer, tgt_layer, r2, best`` (layers 1-based, padding dropped).
        """
        ds = self.analysis(name)
        if "r2" not in ds:
            raise ResultsError(f"{self.pair(name).analysis}: no variable 'r2'")
        grid = ds["r2"].sel(condition=condition, direction=direction)
        if "split_seed" in grid.dims:
            grid = grid.mean("split_seed")
        grid = grid.transpose("src_layer", "tgt_layer")
        vals = grid.to_numpy().astype(float)
        src = np.asarray(grid["src_layer"]); tgt = np.asarray(grid["tgt_layer"])
        offset = 1 if (src.size and src.min() == 0) else 0
        rows = []
        for i in range(vals.shape[0]):
            row = vals[i]
            if not np.isfinite(row).any():
                continue
            best = int(np.nanargmax(row))
            for j in range(vals.shape[1]):
                if np.isfinite(row[j]):
                    rows.append({"src_layer": int(src[i]) + offset, "tgt_layer": int(tgt[j]) + offset,
                                 "r2": float(row[j]), "best": j == best})
        return pd.DataFrame(rows)

    def example_pair(self) -> str:
        """A pair to show as the example: the first cross-family pair, else the first pair."""
        for p in self.pairs:
            if p.family.lower().startswith("cross"):
                return p.name
        return self.pairs[0].name

    def heatmap_frames(self, pairs=None, conditions=("genuine",), direction: str = "A->B",
                       max_pairs: int = 3) -> dict[str, pd.DataFrame]:
        """:meth:`heatmap_frame` for several pairs and conditions, keyed by a panel title.

        ``pairs=None`` takes the first ``max_pairs`` pairs of the manifest.  A title reads
        e.g. ``"S-G genuine: SmolLM2 → Gemma"`` (source model first).
        """
        names = list(pairs) if pairs else self.pair_names[:max_pairs]
        out = {}
        for name in names:
            p = self.pair(name)
            src, tgt = (p.model_a, p.model_b) if direction == "A->B" else (p.model_b, p.model_a)
            for cond in conditions:
                out[f"{name} {cond}: {src} → {tgt}"] = self.heatmap_frame(name, cond, direction)
        return out

    # ------------------------------------------------------------------ SyncR² summaries
    def _pair_seeds(self, name: str, var: str = "sync_r2", **sel) -> np.ndarray:
        """Per-split-seed pair SyncR² (mean of the directions) for ``var`` at ``sel``."""
        da = self.analysis(name)[var]
        da = da.sel(**{k: v for k, v in sel.items() if k in da.dims})
        if "direction" in da.dims:
            da = da.mean("direction")
        rest = [d for d in da.dims if d != "split_seed"]
        if rest:
            raise ResultsError(f"{self.pair(name).analysis}: {var} has unexpected dims {rest} "
                               f"after selecting {sel}")
        return np.atleast_1d(da.to_numpy().astype(float))

    def sync_table(self, condition: str = "genuine") -> pd.DataFrame:
        """Per pair: SyncR² mean and SE over split seeds (columns ``pair, family, ..., mean, se, n_seeds``)."""
        rows = []
        for p in self.pairs:
            v = self._pair_seeds(p.name, "sync_r2", condition=condition)
            m, s = stats.mean_se(v)
            rows.append({**self._info(p.name), "condition": condition, "mean": m, "se": s,
                         "n_seeds": int(np.isfinite(v).sum())})
        return pd.DataFrame(rows)

    def conditions(self) -> list[str]:
        """The conditions present in every pair's ``sync_r2``."""
        sets = [list(self.analysis(n)["sync_r2"]["condition"].values) for n in self.pair_names]
        return [c for c in sets[0] if all(c in s for s in sets)]

    def control_table(self, conditions=None) -> pd.DataFrame:
        """Figure 4a: per family and condition, mean and SE over all (pair, split seed) values.

        ``conditions`` default: genuine and passive, those the run has.
        """
        if conditions is None:
            conditions = [c for c in ("genuine", "passive") if c in self.conditions()]
        rows = []
        for cond in conditions:
            fam_vals: dict[str, list] = {}
            for p in self.pairs:
                fam_vals.setdefault(p.family, []).extend(self._pair_seeds(p.name, condition=cond))
            for fam, vals in fam_vals.items():
                m, s = stats.mean_se(vals)
                rows.append({"family": fam, "condition": cond, "mean": m, "se": s,
                             "n_values": int(np.isfinite(vals).sum())})
        return pd.DataFrame(rows)

    def lag_table(self) -> pd.DataFrame:
        """Figure 4b: SyncR² per pair at lag k = 0 (genuine), 1, 2, ... (columns ``pair, family, k, mean, se``)."""
        conds = self.conditions()
        lags = [(0, "genuine")] + sorted((int(c[3:]), c) for c in conds
                                         if c.startswith("lag") and c[3:].isdigit())
        rows = []
        for p in self.pairs:
            for k, cond in lags:
                m, s = stats.mean_se(self._pair_seeds(p.name, condition=cond))
                rows.append({**self._info(p.name), "k": k, "mean": m, "se": s})
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ fig 6, table 1
    def social_table(self) -> pd.DataFrame:
        """Per pair: social performance (``synclib.judge.social_performance``) or NaN without a judge table."""
        from synclib.judge import social_performance

        rows = []
        for p in self.pairs:
            table = self.judge(p.name)
            social = float(social_performance(table)) if table is not None else math.nan
            n_ep = int(table["episode"].nunique()) if table is not None and "episode" in table else 0
            rows.append({**self._info(p.name), "social": social, "judged_episodes": n_ep})
        return pd.DataFrame(rows)

    def pair_table(self, min_fit: int = stats.MIN_N_CORR) -> pd.DataFrame:
        """Per pair: SyncR² (``sync``, ``sync_se``) and social performance, with ``fit``:
        whether the pair's family has at least ``min_fit`` pairs with both numbers."""
        sync = self.sync_table().rename(columns={"mean": "sync", "se": "sync_se"})
        social = self.social_table()[["pair", "social", "judged_episodes"]]
        t = sync.merge(social, on="pair")
        ok = t["sync"].notna() & t["social"].notna()
        counts = t[ok].groupby("family")["pair"].count()
        t["fit"] = t["family"].map(counts).fillna(0).ge(min_fit) & ok
        return t

    def ability_table(self, scores: pd.DataFrame) -> pd.DataFrame:
        """:meth:`pair_table` plus ``ifeval`` and ``musr`` per pair (mean of the two models;
        models are matched by manifest label, then spec)."""
        t = self.pair_table()
        lookup = scores.set_index("model")
        keyed = t.copy()
        for side in ("a", "b"):
            specs = {p.name: getattr(p, f"spec_{side}") for p in self.pairs}
            keyed[f"model_{side}"] = [m if m in lookup.index else (specs.get(n) or m)
                                      for n, m in zip(t["pair"], t[f"model_{side}"])]
        withab = stats.pair_ability(keyed, scores)
        t["ifeval"] = withab["ifeval"].to_numpy()
        t["musr"] = withab["musr"].to_numpy()
        return t

    # ------------------------------------------------------------------ fig 7, 8
    def topk_table(self) -> pd.DataFrame:
        """Figure 7: per pair and k, SyncR² with the top-k target layers (no clipping)."""
        rows = []
        for p in self.pairs:
            da = self.analysis(p.name)["sync_r2_topk"]
            for k in da["k"].values:
                m, s = stats.mean_se(self._pair_seeds(p.name, "sync_r2_topk", condition="genuine",
                                                      k=k))
                if np.isfinite(m):  # k beyond the target model's depth is NaN
                    rows.append({**self._info(p.name), "k": int(k), "mean": m, "se": s})
        return pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "k",
                                           "mean", "se"])

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

    def clipping_table(self) -> pd.DataFrame:
        """Figure 8: per pair, SyncR² with negatives clipped and kept (mean, SE over split seeds)."""
        rows = []
        for p in self.pairs:
            for method, var in (("clipped at 0", "sync_r2"), ("kept", "sync_r2_noclip")):
                m, s = stats.mean_se(self._pair_seeds(p.name, var, condition="genuine"))
                rows.append({**self._info(p.name), "method": method, "mean": m, "se": s})
        return pd.DataFrame(rows)

    # ------------------------------------------------------------------ optional blocks
    def _optional(self, var: str) -> list[str]:
        names = self.pairs_with(var)
        return names

    def relationship_table(self) -> pd.DataFrame:
        """Figure 5: SyncR² samples by relationship (one row per pair, relationship, sample).

        Samples are the values over every dimension other than relationship and direction
        (split seeds, subsampling seeds); directions are averaged.  ``code`` is Sotopia's
        relationship code (0 stranger .. 5 family_member), for ordering.
        """
        var = "relationship_sync_r2"
        codes = {name: code for code, name in RELATIONSHIPS.items()}
        rows = []
        for name in self.pairs_with(var):
            da = self.analysis(name)[var]
            if "relationship" not in da.dims:
                raise ResultsError(f"{self.pair(name).analysis}: {var} has no 'relationship' "
                                   f"dim (dims {da.dims})")
            if "direction" in da.dims:
                da = da.mean("direction")
            for rel in da["relationship"].values:
                label = (RELATIONSHIPS.get(int(rel), str(rel))
                         if isinstance(rel, (int, np.integer)) else str(rel))
                vals = da.sel(relationship=rel).to_numpy().ravel().astype(float)
                for v in vals[np.isfinite(vals)]:
                    rows.append({**self._info(name), "relationship": label,
                                 "code": codes.get(label, -1), "sync": float(v)})
        return pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b",
                                           "relationship", "code", "sync"])

    def sample_size_table(self) -> pd.DataFrame:
        """Figure 9: SyncR² per pair and training-set size (mean, SE over split seeds)."""
        var = "sample_size_sync_r2"
        rows = []
        for name in self._optional(var):
            da = self.analysis(name)[var]
            sdim = next(d for d in da.dims if d not in ("direction", "split_seed"))
            for n in da[sdim].values:
                m, s = stats.mean_se(self._pair_seeds(name, var, **{sdim: n}))
                rows.append({**self._info(name), "n_samples": int(n), "mean": m, "se": s})
        return pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b",
                                           "n_samples", "mean", "se"])

    def comparison_table(self, var: str, settings: tuple[str, str]) -> pd.DataFrame:
        """Table 2: genuine SyncR² (clipped) against ``var`` per pair.

        ``settings`` names the two columns, e.g. ``("original", "persona-disjoint")``.
        ``var`` is e.g. ``persona_disjoint_sync_r2`` (dims ``direction, split_seed``,
        optionally ``condition``).  Pairs without ``var`` are left out.
        """
        rows = []
        for name in self._optional(var):
            for setting, v in ((settings[0], "sync_r2"), (settings[1], var)):
                m, s = stats.mean_se(self._pair_seeds(name, v, condition="genuine"))
                rows.append({**self._info(name), "setting": setting, "mean": m, "se": s})
        return pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b",
                                           "setting", "mean", "se"])

    def nonlinear_table(self, settings: tuple[str, str] = ("affine", "nonlinear")) -> pd.DataFrame:
        """Table 5: test R² of the affine and the MLP map on the same layer pairs.

        The analysis fits the MLP only on a few layer pairs per direction (``layer_pair``:
        evenly spaced source layers, each with its best affine target), so this is the mean
        test R² over those pairs (``affine_r2``, ``nonlinear_r2``), directions averaged, per
        split seed; not a full SyncR².  Column ``n_layer_pairs`` says how many.
        """
        rows = []
        for name in self.pairs_with("nonlinear_r2"):
            ds = self.analysis(name)
            for setting, var in zip(settings, ("affine_r2", "nonlinear_r2")):
                da = ds[var]
                n_lp = int(da.sizes.get("layer_pair", 1))
                if "layer_pair" in da.dims:
                    da = da.mean("layer_pair")
                if "direction" in da.dims:
                    da = da.mean("direction")
                m, s = stats.mean_se(da.to_numpy())
                rows.append({**self._info(name), "setting": setting, "mean": m, "se": s,
                             "n_layer_pairs": n_lp})
        return pd.DataFrame(rows, columns=["pair", "family", "model_a", "model_b", "setting",
                                           "mean", "se", "n_layer_pairs"])

    def tom_table(self) -> pd.DataFrame:
        """Figure 11: test KL of the ToM decoders and of the train-mean baseline.

        Uses ``tom_kl_best`` (each probe at its validation-chosen layer) and
        ``tom_kl_baseline`` (dims ``tom_target, tom_relation, agent, split_seed``); the two
        reading agents are averaged per split seed, then mean and SE over split seeds.

        Returns
        -------
        DataFrame
            ``pair, family, model_a, model_b, target, relation, panel`` (pair and target,
            for faceting), ``decoder_or_baseline`` (``"decoder"`` / ``"baseline"``),
            ``mean``, ``se``.
        """
        cols = ["pair", "family", "model_a", "model_b", "target", "relation", "panel",
                "decoder_or_baseline", "mean", "se"]
        rows = []
        for name in self.pairs_with("tom_kl_best"):
            ds = self.analysis(name)
            for kind, var in (("decoder", "tom_kl_best"), ("baseline", "tom_kl_baseline")):
                if var not in ds:
                    continue
                da = ds[var]
                if "agent" in da.dims:
                    da = da.mean("agent")
                for target in da["tom_target"].values:
                    for rel in da["tom_relation"].values:
                        m, s = stats.mean_se(da.sel(tom_target=target, tom_relation=rel).to_numpy())
                        rows.append({**self._info(name), "target": str(target),
                                     "relation": str(rel).replace("_", " "),
                                     "panel": f"{name} · {target}", "decoder_or_baseline": kind,
                                     "mean": m, "se": s})
        return pd.DataFrame(rows, columns=cols)


# ---------------------------------------------------------------------- published numbers
def load_published(path: str | os.PathLike | None = None) -> dict:
    """The paper's published numbers (``data/published.json``), each with its source."""
    path = Path(path) if path else PUBLISHED_NUMBERS
    if not path.is_file():
        raise ResultsError(f"published numbers not found: {path}")
    return json.loads(path.read_text())
