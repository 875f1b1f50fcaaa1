"""How many samples a run's datasets will have, and whether SyncR² can leave zero with them.

SyncR² clips each source layer's best test R² at 0, and a ridge map fitted on too few samples predicts worse than the
mean: SyncR² is then exactly 0, whatever the models do.  The measured sample-size curves of the embedded pairs
(``bench/bench_sample_curve.py``, ``bench/results/sample_curve_*.json``) say where that ends.  This module turns a
run's settings into its dataset sizes before anything runs (:func:`planned_samples`: every dialog reaching
``max_utterances``, split by :func:`synclib.splits.episode_split`), holds them against those curves
(:func:`load_curves`, :func:`clip_size`; widths from :func:`synclib.shapes.model_shape`, no model loaded) and reports
them for a run config (:func:`run_sizes`, :func:`format_sizes`: a line per ordered run and a warning naming the
settings to change, printed by ``synclib run`` and its ``--dry-run``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from synclib.paths import BENCH_RESULTS
from synclib.shapes import model_shape
from synclib.splits import RidgeInputError, episode_split
from synclib.tasks.scenarios import count_tasks

__all__ = ["LEAVES_ZERO", "planned_samples", "Curve", "load_curves",
           "curve_table", "leaves_zero_range", "leaves_zero_text", "clip_size", "RunSize", "run_sizes",
           "format_sizes"]

#: a curve "leaves zero" at the first measured size whose genuine SyncR² reaches this
LEAVES_ZERO = 0.05
#: the settings that make a run's datasets bigger, named in the warning
_LEVERS = "simulate.episodes (more tasks), simulate.seeds (more seeds per task) or simulate.max_utterances"


# --------------------------------------------------------------------------- a run's datasets
def _per_dialog(max_utterances: int, direction: str, lag: int) -> int:
    """Samples one full-length dialog gives (:mod:`synclib.analysis.samples`): A->B pairs utterance 2k with
    2(k+lag)+1, B->A pairs 2k+1 with 2(k+1+lag)."""
    u = int(max_utterances)
    full = u // 2 if direction == "A->B" else (u - 1) // 2
    return max(0, full - int(lag))


def planned_samples(n_tasks: int, n_seeds: int, max_utterances: int, n_samples: int | None = None,
                    lags=(1, 2), split_seed: int = 0) -> dict:
    """Dataset sizes of one ordered run of ``n_tasks`` tasks (episodes) x ``n_seeds`` simulation seeds whose dialogs
    all reach ``max_utterances``, at the analysis' fixed ``n_samples`` (None: all), in split ``split_seed`` (with
    equal-sized episodes every seed gives the same).

    Returns ``{condition: {direction: {"total", "train", "test"}}}`` for ``genuine`` (the passive and shuffled
    datasets are the same size, the pseudo-dyads' at most as large) and ``lag{k}`` for ``lags``; ``train`` is 0 where
    the test set takes everything (the analysis then fits nothing).
    """
    out: dict = {}
    for cond, lag in [("genuine", 0)] + [(f"lag{int(k)}", int(k)) for k in lags]:
        out[cond] = {}
        for d in ("A->B", "B->A"):
            per_task = _per_dialog(max_utterances, d, lag) * int(n_seeds)
            groups = np.repeat(np.arange(int(n_tasks)), per_task)
            counts = {"total": int(groups.size), "train": 0, "test": int(groups.size)}
            if groups.size:
                try:
                    _, _, info = episode_split(groups, n_samples, split_seed, n_groups=int(n_tasks))
                    counts.update(train=int(info["n_train"]), test=int(info["n_test"]))
                except RidgeInputError:
                    pass
            out[cond][d] = counts
    return out


# --------------------------------------------------------------------------- measured curves
@dataclass
class Curve:
    """One measured sample-size curve (``bench/results/sample_curve_<pair>.json``); ``points``: ``(training samples,
    genuine SyncR²)`` per size, each the mean over both directions."""

    pair: str
    width: int
    points: list = field(default_factory=list)
    source: str = ""

    @property
    def leaves_zero(self) -> float | None:
        """The fewest measured training samples with genuine SyncR² >= :data:`LEAVES_ZERO`."""
        ok = [n for n, s in self.points if s is not None and s >= LEAVES_ZERO]
        return min(ok) if ok else None

    @property
    def last_zero(self) -> float | None:
        """The most training samples at which genuine SyncR² was still below :data:`LEAVES_ZERO`."""
        low = [n for n, s in self.points if s is not None and s < LEAVES_ZERO]
        return max(low) if low else None


def load_curves(bench_dir=BENCH_RESULTS) -> list[Curve]:
    """The measured curves in ``bench_dir`` (none when it holds none: an installed package)."""
    out = []
    for f in sorted(Path(bench_dir).glob("sample_curve_*.json")):
        try:
            d = json.loads(f.read_text())
            pts = []
            for p in d["curve"]["genuine"]:
                if p.get("sync_r2") is None:
                    continue
                pts.append((float(np.mean(list(p["n_train"].values()))), float(p["sync_r2"])))
            out.append(Curve(d["pair"], max(int(w) for w in d["d_model"]), sorted(pts), f.name))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def curve_table(bench_dir=BENCH_RESULTS):
    """Every condition of every measured curve in ``bench_dir`` as one long DataFrame: columns ``pair, condition,
    n_samples`` (the analysis' ``N``; -1 for all), ``n_train``, ``mean`` (as :class:`Curve`), ``se`` (mean of the
    directional SEs over split seeds), ``tasks``, ``source`` (file name); ``attrs["runs"]``: each pair's settings,
    wall times and machine."""
    import pandas as pd

    rows, runs = [], {}
    for f in sorted(Path(bench_dir).glob("sample_curve_*.json")):
        d = json.loads(f.read_text())
        runs[d["pair"]] = {k: d.get(k) for k in ("settings", "dialogs", "wall_s", "machine", "date")}
        for cond, pts in d["curve"].items():
            for p in pts:
                if p.get("sync_r2") is None:
                    continue
                rows.append({"pair": d["pair"], "condition": cond, "n_samples": int(p["n_samples"] or -1),
                             "n_train": float(np.mean(list(p["n_train"].values()))), "mean": float(p["sync_r2"]),
                             "se": float(p.get("se") or 0.0), "tasks": d["settings"]["tasks"], "source": f.name})
    out = pd.DataFrame(rows, columns=["pair", "condition", "n_samples", "n_train", "mean", "se", "tasks", "source"])
    out.attrs["runs"] = runs
    return out


def leaves_zero_range(curves: list[Curve] | None = None, step: int = 10) -> tuple[int, int] | None:
    """The training samples at which the measured curves' genuine SyncR² first reaches
    :data:`LEAVES_ZERO`, fewest and most over the pairs, rounded to ``step``: the "about 80-120"
    that the config and the book's static pages quote (a test holds them to it)."""
    pts = [c.leaves_zero for c in (load_curves() if curves is None else curves) if c.leaves_zero is not None]
    if not pts:
        return None
    return int(round(min(pts) / step) * step), int(round(max(pts) / step) * step)


def leaves_zero_text(curves: list[Curve] | None = None) -> str:
    """Where genuine SyncR² of the measured pairs leaves 0, in one sentence (every page that says
    it takes it from here); empty without a curve."""
    curves = [c for c in (load_curves() if curves is None else curves) if c.leaves_zero is not None]
    if not curves:
        return ""
    per = [f"{c.pair} (width {c.width}) " + (f"is still about 0 at {c.last_zero:.0f} and " if c.last_zero else "")
           + f"first reaches {LEAVES_ZERO} at {c.leaves_zero:.0f}" for c in sorted(curves, key=lambda c: c.leaves_zero)]
    lo, hi = leaves_zero_range(curves)
    return ("In the measured sample-size curves (`bench/results/sample_curve_*.json`) genuine SyncR² of "
            + " and ".join(per) + f" training samples per dataset: it leaves 0 at about {lo}-{hi}.")


def clip_size(width: int, curves: list[Curve]) -> tuple[float, str] | None:
    """Training samples per dataset below which SyncR² is still about 0 at ``width``, and how that was found; None
    without a usable curve.  The nearest width's curve gives the fewest training samples at which it reached
    :data:`LEAVES_ZERO`, for another width scaled in proportion to the width (an assumption: the ridge maps then
    have proportionally more inputs; the curves measure only the embedded models' widths)."""
    usable = [c for c in curves if c.leaves_zero is not None]
    if not usable or not width:
        return None
    c = min(usable, key=lambda c: (abs(c.width - width), c.pair))
    n = c.leaves_zero * (width / c.width)
    how = (f"the measured {c.pair} curve (width {c.width}, {c.source}): SyncR² "
           f"{'was still about 0 at ' + format(c.last_zero, '.0f') + ' and ' if c.last_zero else ''}"
           f"first reached {LEAVES_ZERO} at {c.leaves_zero:.0f} training samples")
    if c.width != width:
        how += f", scaled to width {width} in proportion to the width (an extrapolation)"
    return n, how


# --------------------------------------------------------------------------- a run config
@dataclass
class RunSize:
    """One ordered run's planned dataset sizes and its check against the curves."""

    run: str
    shapes: tuple                  # ((layers, width) or None, same for B)
    samples: dict                  # planned_samples()
    needed: float | None = None    # clip_size() samples, None when unknown
    how: str = ""
    warning: str = ""

    @property
    def train(self) -> int:
        """The fewer training samples of the two genuine datasets."""
        return min(v["train"] for v in self.samples["genuine"].values())


def _layers_width(spec: str) -> tuple[int, int] | None:
    shape = model_shape(spec)
    return None if shape is None else (shape.layers, shape.width)


def run_sizes(cfg: dict, ordered_runs, curves: list[Curve] | None = None) -> list[RunSize]:
    """:class:`RunSize` of each ordered run of a validated config; ``ordered_runs``: the config's runs
    (:func:`synclib.run.pipeline.runs`: ``name``, ``a``, ``b`` model keys); ``curves``: default
    :func:`load_curves`."""
    sim, ana = cfg["simulate"], cfg["analysis"]
    n_tasks = count_tasks(cfg["scenarios"], sim["episodes"])
    samples = planned_samples(n_tasks, len(sim["seeds"]), sim["max_utterances"], ana["n_samples"],
                              ana["lags"], ana["split_seeds"][0])
    curves = load_curves() if curves is None else curves
    out = []
    for r in ordered_runs:
        shapes = tuple(_layers_width(cfg["models"][k]["spec"]) for k in (r.a, r.b))
        rs = RunSize(r.name, shapes, samples)
        widths = [s[1] for s in shapes if s]
        got = clip_size(max(widths), curves) if len(widths) == 2 else None
        if got is not None:
            rs.needed, rs.how = got
            if rs.train < rs.needed:
                fix = _LEVERS
                if ana["n_samples"] is not None and rs.samples["genuine"]["A->B"]["total"] < ana["n_samples"]:
                    fix = "analysis.n_samples (null uses every sample), " + fix
                rs.warning = (f"{r.name}: at most {rs.train} training samples per dataset, fewer than the "
                              f"~{math.ceil(rs.needed)} at which SyncR² leaves 0 ({rs.how}); every SyncR² of "
                              f"this run will be about 0. Raise {fix}.")
        out.append(rs)
    return out


def format_sizes(sizes: list[RunSize]) -> str:
    """The dry run's dataset-size block: a line per ordered run, then any warnings."""
    lines = ["training samples per dataset, an upper bound (every dialog reaching simulate.max_utterances; "
             "dialogs that end early by LEAVE give fewer, and the book's first page gives the counts the analysis "
             "used); A->B / B->A, training + test:"]
    said: dict[str, list[str]] = {}  # a line's text -> the runs it holds for (a grid repeats them)
    for s in sizes:
        g = s.samples["genuine"]
        lags = "; ".join(f"{c} {v['A->B']['train']} / {v['B->A']['train']}"
                         for c, v in s.samples.items() if c != "genuine")
        need = (f"; SyncR² leaves 0 from ~{math.ceil(s.needed)}" if s.needed is not None else
                "; no measured curve for this width" if all(s.shapes) else
                "; model width unknown before loading (no check)")
        counts = f"{g['A->B']['train']} / {g['B->A']['train']} (+ {g['A->B']['test']} / {g['B->A']['test']} test)"
        said.setdefault(f"genuine/passive readers/shuffled/pseudo {counts}"
                        + (f"; {lags} (a lag's contrast fits genuine on the lag's rows)" if lags else "") + need,
                        []).append(s.run)
    for text, names in said.items():
        who = names[0] if len(names) == 1 else f"{len(names)} runs ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        lines.append(f"  {who:10s} {text}" if len(names) == 1 else f"  {who}: {text}")
    lines += [f"WARNING: {s.warning}" for s in sizes if s.warning]
    return "\n".join(lines)
