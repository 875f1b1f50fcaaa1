"""Figure 1: the framework, drawn from the run's own dialog, states and one refitted map.

The notebook ``notebooks/fig01_framework.md`` draws this page from the functions here.

The paper's figure 1 is a drawing of the framework: (1) two agents talk, (2) every layer's
hidden state is read at every turn, (3) an affine map predicts one agent's next state from the
other's current one.  :func:`figure1` returns the three parts from a results directory:

``turns``
    The first utterances of one dialog of the example run (the first dialog, in cube order,
    that reached the utterance limit; else the longest): utterance, speaker, text.
``states``
    That dialog's states: for every layer of each agent, its state at each of the agent's
    utterances projected on the layer's first principal component over all of the run's
    states of that agent and layer, standardised per layer (so the colours show how the
    representation moves from turn to turn, layer by layer).
``scatter``
    One map of the genuine A->B dataset, the one the analysis found best (the source layer
    whose best target layer has the highest seed-mean test R²): refitted on the first split seed
    that fitted it (seed 0 unless that split was not possible) with
    the analysis' split and penalty, its test predictions against the partner's actual next
    states, both projected on the target layer's first principal component over the training
    targets.  ``info["r2"]`` is the refitted map's test R², which equals the analysis' own
    value for that layer pair and split (a test checks it).  Where the analysis fitted no
    genuine A->B map (too few samples to split), the scatter is empty, ``info["fitted"]`` is
    False and ``info["reason"]`` says why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import altair as alt
import numpy as np
import pandas as pd
import xarray as xr

from synclib.analysis.samples import build_dataset
from synclib.figures.charts import need_columns, placeholder_if_empty, axis_ticks, wrap_title
from synclib.figures.report import paper_note, readable
from synclib.stats import fmt as _f

__all__ = ["Figure1", "figure1", "state_heatmaps", "prediction_scatter", "sentence", "readable"]


@dataclass
class Figure1:
    """The three parts of figure 1 (module doc) and what they were drawn from."""

    turns: pd.DataFrame     # utterance, speaker, text
    states: pd.DataFrame    # agent, layer (1-based), utterance, value
    scatter: pd.DataFrame   # actual, predicted (first principal component), episode
    info: dict = field(default_factory=dict)  # run, episode, task, sim_seed, fitted, src_layer, tgt_layer (1-based), r2, ...

    @property
    def scatter_title(self) -> str:
        """The scatter's title: the layer pair and split drawn, or that none was fitted."""
        i = self.info
        if not i.get("fitted"):
            return "No A→B map was fitted in this run"
        return (f"Agent 1 layer {i['src_layer']} → agent 2 layer {i['tgt_layer']}, test samples of split seed "
                f"{i['split_seed']}")


def _first_pc(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean (D,) and unit first principal direction (D,) of the rows of M (n, D)."""
    mu = M.mean(0)
    _, _, vt = np.linalg.svd(M - mu, full_matrices=False)
    return mu, vt[0]


def _dialog(cube: xr.Dataset) -> tuple[int, int]:
    """(episode, sim_seed) positions of the dialog to show: the first that reached the
    utterance limit, else the longest."""
    n = np.asarray(cube["n_utterances"].values)
    limit = int(cube.attrs.get("max_utterances", n.max()))
    full = np.argwhere(n >= limit)
    e, s = (full[0] if len(full) else np.unravel_index(int(np.argmax(n)), n.shape))
    return int(e), int(s)


def _turns(cube: xr.Dataset, e: int, s: int, n_turns: int) -> pd.DataFrame:
    names = (str(cube["agent1_name"].values[e]), str(cube["agent2_name"].values[e]))
    n = int(cube["n_utterances"].values[e, s])
    rows = []
    for t in range(min(n, n_turns)):
        side = "a" if t % 2 == 0 else "b"
        rows.append({"utterance": t, "speaker": names[t % 2], "text": str(cube[f"text_{side}"].values[e, s, t // 2])})
    return pd.DataFrame(rows, columns=["utterance", "speaker", "text"])


def _states(cube: xr.Dataset, e: int, s: int) -> pd.DataFrame:
    names = (str(cube["agent1_name"].values[e]), str(cube["agent2_name"].values[e]))
    n = int(cube["n_utterances"].values[e, s])
    rows = []
    for i, side in enumerate(("a", "b")):
        H = np.asarray(cube[f"hidden_{side}"].values, dtype=np.float64)  # (E, S, R, L, D)
        E, S, R, L, D = H.shape
        flat = H.reshape(E * S * R, L, D)
        ok = np.isfinite(flat).all(axis=(1, 2))
        for layer in range(L):
            mu, v = _first_pc(flat[ok, layer])
            proj = (flat[ok, layer] - mu) @ v
            scale = proj.std() or 1.0
            for k in range(R):
                t = 2 * k + i
                if t < n and np.isfinite(H[e, s, k, layer]).all():
                    rows.append({"agent": f"{names[i]} ({'A' if i == 0 else 'B'})", "layer": layer + 1,
                                 "utterance": t, "value": float((H[e, s, k, layer] - mu) @ v / scale)})
    return pd.DataFrame(rows, columns=["agent", "layer", "utterance", "value"])


#: the scatter's columns (empty when no map was fitted)
SCATTER_COLUMNS = ["actual", "predicted", "episode"]


def _not_fitted(ana: xr.Dataset) -> str:
    """Why the run has no genuine A->B map, from the analysis' counts and its first note."""
    gen = dict(condition="genuine", direction="A->B")
    n = int(ana["n_available"].sel(**gen)) if "n_available" in ana else 0
    note = next((line for line in str(ana.attrs.get("notes", "")).splitlines()
                 if line.startswith("genuine A->B split")), "")
    why = note.split("not split (", 1)[1].rsplit("); left NaN", 1)[0] if "not split (" in note else ""
    return (f"the genuine A→B dataset holds {n} samples, and no split seed could fit a map"
            + (f" ({why})" if why else ""))


def _best_map(res, run: str, cube: xr.Dataset) -> tuple[pd.DataFrame, dict]:
    """The scatter of the run's best genuine A->B map (module doc) and what it was drawn from;
    an empty scatter and ``info["fitted"] = False`` with the reason where no map was fitted."""
    import torch  # the analysis' imports load only for the figure, not with every figure's claims

    # lazy: torch loads only for this figure, not with every figure's claims
    from synclib.analysis.core import analysis_split
    # lazy: torch loads only for this figure, not with every figure's claims
    from synclib.analysis.ridge import ridge_solve

    ana = res.analysis(run)
    grid = ana["r2_mean"].sel(condition="genuine", direction="A->B").to_numpy()
    per_seed = ana["r2"].sel(condition="genuine", direction="A->B").to_numpy()  # (split_seed, L, L)
    if not np.isfinite(grid).any():
        return pd.DataFrame(columns=SCATTER_COLUMNS), {"fitted": False, "reason": _not_fitted(ana)}
    best = np.nanmax(np.where(np.isnan(grid), -np.inf, grid), axis=1)
    src = int(np.argmax(best))
    tgt = int(np.nanargmax(grid[src]))
    seed = int(ana["split_seed"].values[int(np.flatnonzero(np.isfinite(per_seed[:, src, tgt]))[0])])
    samples = build_dataset(cube, "A->B")
    train, test = analysis_split(cube, ana, "A->B", seed)
    alpha = float(ana["alpha"].sel(condition="genuine", direction="A->B", split_seed=seed).values[src])
    X, Y = samples.take(np.concatenate([train, test]))
    Xs = torch.as_tensor(X[:, src], dtype=torch.float64)
    Ys = torch.as_tensor(Y[:, tgt], dtype=torch.float64)
    ntr = len(train)
    pred = ridge_solve(Xs[:ntr], Xs[ntr:], alpha, Ys[:ntr]).numpy()
    actual = Ys[ntr:].numpy()
    ss_res = ((actual - pred) ** 2).sum(0)
    ss_tot = ((actual - actual.mean(0)) ** 2).sum(0)
    r2 = float(np.mean(np.where(ss_tot > 0, 1 - ss_res / np.where(ss_tot > 0, ss_tot, 1), 0.0)))
    mu, v = _first_pc(Ys[:ntr].numpy())
    scatter = pd.DataFrame({"actual": (actual - mu) @ v, "predicted": (pred - mu) @ v,
                            "episode": samples.episode[test]})
    info = {"fitted": True, "src_layer": src + 1, "tgt_layer": tgt + 1, "split_seed": seed, "alpha": alpha, "r2": r2,
            "analysis_r2": float(ana["r2"].sel(condition="genuine", direction="A->B", split_seed=seed)
                                 .values[src, tgt]),
            "r2_mean": float(grid[src, tgt]), "n_train": ntr, "n_test": len(test)}
    return scatter, info


def figure1(res, run: str | None = None, n_turns: int = 4) -> Figure1:
    """Figure 1's three parts from ``res`` (:class:`synclib.analysis.results.Results`; module doc).

    Parameters
    ----------
    res : synclib.analysis.results.Results
    run : str, optional
        The ordered run (default :meth:`~synclib.analysis.results.Results.example_run`); its cube file
        must be there.
    n_turns : int
        Utterances of the dialog shown as text.
    """
    run = run or res.example_run()
    path = res.run(run).cube
    if path is None or not path.is_file():
        raise FileNotFoundError(f"figure 1 needs the cube of run {run!r}, which is not in the results directory")
    with xr.open_dataset(path) as c:
        cube = c.load()
    e, s = _dialog(cube)
    scatter, info = _best_map(res, run, cube)
    info.update(run=run, episode=e, sim_seed=int(cube["sim_seed"].values[s]) if "sim_seed" in cube.coords else s,
                task=str(cube["codename"].values[e]) if "codename" in cube.coords else "",
                utterances=int(cube["n_utterances"].values[e, s]),
                model_a=str(res.run(run).model_a), model_b=str(res.run(run).model_b))
    if info["fitted"]:
        info["rounded_equal"] = math.isclose(info["r2"], info["analysis_r2"], abs_tol=1e-3)
    return Figure1(_turns(cube, e, s, n_turns), _states(cube, e, s), scatter, info)


# --------------------------------------------------------------------------- charts
@placeholder_if_empty
def state_heatmaps(frame: pd.DataFrame, title: str, width: int = 250) -> alt.Chart:
    """Figure 1 (2): each agent's states over one dialog, layer by layer.

    ``frame`` columns: ``agent``, ``layer`` (1-based), ``utterance``, ``value`` (the state
    projected on the layer's first principal component, standardised per layer).
    """
    need_columns(frame, ["agent", "layer", "utterance", "value"], "state_heatmaps")
    lim = float(np.nanmax(np.abs(frame["value"]))) or 1.0
    return alt.Chart(frame).mark_rect().encode(
        x=alt.X("utterance:O", title="utterance", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("layer:O", title="layer", sort="descending", axis=alt.Axis(values=axis_ticks(frame["layer"]))),
        color=alt.Color("value:Q", title="first PC (sd)", scale=alt.Scale(scheme="redblue", domain=[-lim, lim])),
        column=alt.Column("agent:N", title=None, sort=None),
        tooltip=[alt.Tooltip("agent:N"), alt.Tooltip("layer:O"), alt.Tooltip("utterance:O"),
                 alt.Tooltip("value:Q", format=".2f")],
    ).properties(width=width, height=200, title=title)


@placeholder_if_empty
def prediction_scatter(frame: pd.DataFrame, title: str, x_title: str, y_title: str, size: int = 300) -> alt.LayerChart:
    """Figure 1 (3): a map's test predictions against the actual states (``actual``,
    ``predicted``; ``episode`` on hover), with the identity line."""
    need_columns(frame, ["actual", "predicted"], "prediction_scatter")
    lo = float(min(frame["actual"].min(), frame["predicted"].min()))
    hi = float(max(frame["actual"].max(), frame["predicted"].max()))
    points = alt.Chart(frame).mark_circle(size=28, opacity=0.6).encode(
        x=alt.X("actual:Q", title=x_title, scale=alt.Scale(domain=[lo, hi])),
        y=alt.Y("predicted:Q", title=y_title, scale=alt.Scale(domain=[lo, hi])),
        tooltip=[alt.Tooltip(c) for c in frame.columns])
    line = alt.Chart(pd.DataFrame({"x": [lo, hi], "y": [lo, hi]})).mark_line(color="grey", strokeDash=[4, 3]).encode(
        x="x:Q", y="y:Q")
    return alt.layer(points, line).properties(title=wrap_title(title, size + 60), width=size, height=size)


# --------------------------------------------------------------------------- sentence
def sentence(figure: Figure1, published: dict, embedded: bool) -> str:
    """What figure 1's map is (:func:`figure1`), or why the run has none, with the paper's caption."""
    i = figure.info
    p = published["fig1"]
    if not i["fitted"]:
        return (f"No map is drawn: {i['reason']}. A run with more samples per dataset (more tasks or seeds, longer "
                "dialogs, or `analysis.n_samples: null`, which splits all samples 80/20 by episode) fits one; "
                "`synclib run --dry-run` prints how many samples each dataset will have."
                + paper_note(p, p["caption"]))
    same = ("the analysis' own value for this layer pair and split" if i["rounded_equal"]
            else "which differs from the analysis' value for this layer pair and split")
    s = (f"The ridge map from agent 1's layer {i['src_layer']} to agent 2's layer {i['tgt_layer']} (the A→B layer "
         f"pair with the highest mean test R² in this run, {_f(i['r2_mean'])} over split seeds), refitted on split seed "
         f"{i['split_seed']} with the analysis' split ({i['n_train']} training and {i['n_test']} test samples) and "
         f"penalty (λ = {i['alpha']:.2g}). Each point is one test sample: agent 2's actual state at the next utterance "
         "against the map's prediction from agent 1's current state, both on the target layer's first principal "
         f"component. Its test R² over all {i['n_test']} samples and every dimension is {i['r2']:.3f}, {same} "
         f"({i['analysis_r2']:.3f}). SyncR² (figure 2) takes each source layer's best target like this one, clips at "
         "0 and averages over layers, directions and speaking orders."
         + (" These are the embedded tiny models, not the paper's." if embedded else ""))
    return s + paper_note(p, p["caption"])
