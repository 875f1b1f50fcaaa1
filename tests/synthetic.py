"""Synthetic activation cubes with planted synchrony, in the exact cube schema.

Used to develop and test the analysis without a simulation.  Generative model
for one (episode, sim_seed): a latent dialog state ``s_u`` (``latent_dim``) per
utterance ``u = 0 .. 2*n_rounds-1`` follows an AR(1) process
``s_{u+1} = rho s_u + sqrt(1 - rho^2) eps`` with ``rho = coupling +
relationship_effect * relationship / 5`` (clipped below 0.99), so closer
relationships synchronise more.  Then, with per-layer random mixing matrices
``P_l`` and per-layer noise,

* ``hidden_a[k] = P^A_l s_{2k} + noise`` (agent 1 before its utterance ``2k``),
* ``hidden_b[k] = P^B_l s_{2k+1} + noise``,
* ``hidden_a_passive[k] = P^A'_l s_{2k-1} + noise`` (the passive reader lacks the
  speaker's fresh innovation; ``s_{-1}`` is one AR step before ``s_0``),
  ``hidden_b_passive[k] = P^B'_l s_{2k} + noise``.

With ``shared > 0`` a part of every latent path is common to the dialogs of one task (its
simulation seeds; ``shared_by="task"``) or of one scenario (``shared_by="scenario"``):
``s = sqrt(shared) z + sqrt(1 - shared) w`` with ``z`` one AR(1) path (``rho = coupling``) per
task or scenario and ``w`` the dialog's own.  Dialogs that never interacted then share
structure, which the pseudo-dyads (:func:`synclib.analysis.samples.pseudo_partners`) recover.

The A->B map therefore predicts across one AR step (R^2 ~ rho^2 times the
layer's signal fraction), passive across two, lag j across ``2j + 1``: genuine
> passive > lag1 > lag2.  The ToM run has its own latent path; the emotion and
action distributions of the speaker of utterance ``u`` are ``softmax(Z s_u)``.

:func:`build_synthetic_results` writes a whole tiny results directory (cubes, analyses,
random judge scores) for the tests of the notebooks and the book.

Episodes mimic Sotopia: ``n_episodes // 5`` scenarios (at least 1) with 5
persona pairs each, pairs drawn from a small pool so that the same agent pair
recurs in different scenarios (what the persona-disjoint split must handle).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from synclib import __version__
from synclib.analysis.results import MANIFEST
from synclib.judge import DIMENSIONS, SCORE_RANGES, TABLE_COLUMNS, save_table
# the ToM words, in the cube's order, and Sotopia's eight scenario sources
from synclib.tasks.prompts import ACTIONS, EMOTIONS
from synclib.tasks.scenarios import SOURCES

__all__ = ["make_synthetic_cube", "Shapes", "Planted",
           "synthetic_judge_table", "build_synthetic_results", "SYNTHETIC_JUDGE",
           "SOURCES", "EMOTIONS", "ACTIONS"]

_FIRST = ("Ava", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea")


def _layer_maps(rng, n_layers, dim, latent_dim, signal):
    """Mixing matrices (L, latent, D) and noise scales (L,); signal peaks mid-depth."""
    P = rng.standard_normal((n_layers, latent_dim, dim)) / np.sqrt(latent_dim)
    depth = np.linspace(0, 1, n_layers)
    strength = signal * (0.35 + 0.65 * np.sin(np.pi * depth))  # weakest at the ends
    noise = 1.0 / np.maximum(strength, 1e-3)
    scale = np.exp(rng.normal(0, 0.5, size=(n_layers, 1, dim)))  # anisotropic features
    return P * scale, noise[:, None] * scale[:, 0], scale


def _latent_paths(rng, n, n_utt, latent_dim, rho):
    """AR(1) paths (n, n_utt + 1, latent): index 0 is the step before utterance 0."""
    s = np.empty((n, n_utt + 1, latent_dim))
    s[:, 0] = rng.standard_normal((n, latent_dim))
    r = rho[:, None]
    for u in range(1, n_utt + 1):
        s[:, u] = r * s[:, u - 1] + np.sqrt(1 - r ** 2) * rng.standard_normal((n, latent_dim))
    return s


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


#: the dimensions of a per-round variable
_DIMS3 = ("episode", "sim_seed", "round")


def _episode_coords(rng, E, S, R, layers_a, layers_b, n_personas, tom):
    """The cube's coordinates, and each episode's relationship (0-5).

    Episodes are scenarios x 5 persona pairs; the pairs are drawn from a pool of
    ``max(3, E // 3)`` so that the same agent pair recurs in different scenarios.
    """
    names = [f"{_FIRST[i % len(_FIRST)]} P{i:02d}" for i in range(n_personas)]
    pool = [tuple(rng.choice(n_personas, 2, replace=False)) for _ in range(max(3, E // 3))]
    env_of = np.arange(E) // 5
    src_of_env = rng.choice(len(SOURCES), size=env_of.max() + 1)
    pair_idx = rng.integers(0, len(pool), size=E)
    relationship = rng.integers(0, 6, size=E)
    a1 = np.array([pool[p][0] for p in pair_idx])
    a2 = np.array([pool[p][1] for p in pair_idx])
    coords = {
        "episode": np.arange(E, dtype=np.int64),
        "sim_seed": np.arange(S, dtype=np.int64),
        "round": np.arange(R, dtype=np.int32),
        "layer_a": np.arange(layers_a, dtype=np.int32),
        "layer_b": np.arange(layers_b, dtype=np.int32),
        "task_index": ("episode", np.arange(E, dtype=np.int64)),
        "env_id": ("episode", np.array([f"env{e:03d}" for e in env_of], dtype=object)),
        "codename": ("episode", np.array([f"scenario_{e}" for e in env_of], dtype=object)),
        "source": ("episode", np.array([SOURCES[src_of_env[e]] for e in env_of], dtype=object)),
        "relationship": ("episode", relationship.astype(np.int64)),
        "agent1_id": ("episode", np.array([f"agent{i:02d}" for i in a1], dtype=object)),
        "agent2_id": ("episode", np.array([f"agent{i:02d}" for i in a2], dtype=object)),
        "agent1_name": ("episode", np.array([names[i] for i in a1], dtype=object)),
        "agent2_name": ("episode", np.array([names[i] for i in a2], dtype=object)),
    }
    if tom:
        coords["emotion"] = np.array(EMOTIONS, dtype=object)
        coords["action"] = np.array(ACTIONS, dtype=object)
    return coords, relationship


def _hidden(rng, states, P, noise, off, reached):
    """states (E*S, R, latent) -> (E, S, R, L, D) float32 with NaN where unreached (E, S, R)."""
    E, S, R = reached.shape
    h = np.einsum("nrk,lkd->nrld", states, P) + off
    h += rng.standard_normal(h.shape) * noise
    h = h.reshape(E, S, R, *h.shape[2:]).astype(np.float32)
    h[~reached] = np.nan
    return h


def _texts(reached, who, tag=""):
    """Placeholder utterances ``[A e0 s1 u4]`` of agent ``who`` where reached, else ``""``."""
    E, S, R = reached.shape
    t = np.empty((E, S, R), dtype=object)
    for e, sd, k in np.ndindex(E, S, R):
        t[e, sd, k] = f"[{who}{tag} e{e} s{sd} u{2 * k + (who == 'B')}]" if reached[e, sd, k] else ""
    return t


def _prompt_lengths(reached, base):
    """Prompt lengths growing by 40 tokens a round from ``base``, -1 where unreached."""
    R = reached.shape[2]
    return np.where(reached, base + 40 * np.arange(R)[None, None, :], -1).astype(np.int32)


def _tom_readouts(rng, states, u_a, reached_a, reached_b, latent_dim) -> dict:
    """The ToM run's emotion and action distributions of each utterance's speaker,
    ``softmax(Z s_u)`` with random ``Z``, NaN where unreached: ``{name: (dims, array)}``."""
    E, S, R = reached_a.shape
    Ze = rng.standard_normal((latent_dim, len(EMOTIONS))) * 0.8
    Za = rng.standard_normal((latent_dim, len(ACTIONS))) * 0.8
    out = {}
    for who, u, reached in (("a", u_a, reached_a), ("b", u_a + 1, reached_b)):
        for var, Z in (("emotion", Ze), ("action", Za)):
            p = _softmax(states[:, u + 1] @ Z).reshape(E, S, R, -1).astype(np.float32)
            p[~reached] = np.nan
            out[f"{var}_{who}"] = (_DIMS3 + (var,), p)
    return out


def _cube_attrs(models: tuple[str, str], shapes: tuple[int, int, int, int], n_utt_max: int, views: dict,
                generator: dict) -> dict:
    """The synthetic cube's attributes (the cube schema's, plus the generator's settings).

    ``models``: (model_a, model_b); ``shapes``: (layers_a, dim_a, layers_b, dim_b); ``views``:
    ``{"passive": bool, "tom": bool}``; ``generator``: ``{"coupling", "seed",
    "relationship_effect"}``."""
    (model_a, model_b), (layers_a, dim_a, layers_b, dim_b) = models, shapes
    return {
        "title": "synclib synthetic activation cube",
        "conventions": "synclib cube v1 (see book/architecture.md)",
        "model_a": model_a, "model_b": model_b,
        "n_layers_a": layers_a, "d_model_a": dim_a, "n_layers_b": layers_b, "d_model_b": dim_b,
        "temperature": 0.7, "max_new_tokens": 0, "max_utterances": n_utt_max,
        "synclib_version": __version__, "store_dtype": "float32",
        "passive": int(views["passive"]), "tom": int(views["tom"]),
        "synthetic": 1, "synthetic_coupling": float(generator["coupling"]), "synthetic_seed": int(generator["seed"]),
        "synthetic_relationship_effect": float(generator["relationship_effect"]),
        "complete": 1,
    }


@dataclass(frozen=True)
class Shapes:
    """The hidden-state shapes of the synthetic models A and B: ``(layers, width)`` each."""

    layers_a: int = 6
    dim_a: int = 32
    layers_b: int = 6
    dim_b: int = 32

    def __post_init__(self):
        for name in ("layers_a", "dim_a", "layers_b", "dim_b"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"Shapes.{name} must be an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class Planted:
    """The generative model's settings besides the coupling (see the module docstring).

    Attributes
    ----------
    latent_dim : size of the shared latent state.
    signal : per-layer signal-to-noise scale of the hidden states.
    relationship_effect : added to ``coupling`` per relationship step / 5.
    min_utterances : shortest episode; lengths are uniform in [min, 2*n_rounds].
    n_personas : size of the persona pool.
    shared : part (0 .. 1) of each dialog's latent path common to the dialogs of its task
        (``shared_by="task"``: its simulation seeds) or scenario (``"scenario"``); 0: every
        dialog's path is its own.  Drawn from a separate random stream, so ``shared=0``
        gives the same cube as before the option existed.
    shared_by : {"task", "scenario"}
    """

    latent_dim: int = 8
    signal: float = 2.0
    relationship_effect: float = 0.1
    min_utterances: int = 4
    n_personas: int = 12
    shared: float = 0.0
    shared_by: str = "task"

    def __post_init__(self):
        if not 0 <= self.shared <= 1:
            raise ValueError(f"Planted.shared must be in [0, 1], got {self.shared}")
        if self.shared_by not in ("task", "scenario"):
            raise ValueError(f"Planted.shared_by must be 'task' or 'scenario', got {self.shared_by!r}")
        for name in ("latent_dim", "min_utterances", "n_personas"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"Planted.{name} must be an integer >= 1, got {v!r}")


def make_synthetic_cube(n_episodes: int = 40, n_seeds: int = 3, n_rounds: int = 8, shapes: Shapes = Shapes(),
                        coupling: float = 0.8, seed: int = 0, *, planted: Planted = Planted(),
                        passive: bool = True, tom: bool = True,
                        models: tuple[str, str] = ("synthetic-a", "synthetic-b")):
    """Build an in-memory cube (xarray.Dataset) in the schema of book/architecture.md.

    Parameters
    ----------
    n_episodes, n_seeds, n_rounds : sizes of the ``episode``, ``sim_seed``, ``round`` dims.
    shapes : Shapes
        Hidden-state shapes of models A and B (``layers_a``, ``dim_a``, ``layers_b``, ``dim_b``).
    coupling : AR(1) coefficient between consecutive utterances (0 <= coupling < 1).
    seed : random seed (the cube is a deterministic function of all arguments).
    planted : Planted
        The rest of the generative model: latent size, signal, relationship effect, shortest
        episode, persona pool, the part shared across a task's or scenario's dialogs.
    passive, tom : include the passive-reader and ToM variables.
    models : (str, str)
        The names of models A and B (``model_a``, ``model_b`` attributes).

    Returns
    -------
    xarray.Dataset with ``hidden_a`` (episode, sim_seed, round, layer_a, dim_a),
    ``hidden_b`` (..., layer_b, dim_b), passive/ToM variables, texts, lengths,
    episode coordinates and attributes; rounds an episode never reached are NaN.
    """

    if not 0 <= coupling < 1:
        raise ValueError(f"coupling must be in [0, 1), got {coupling}")
    if n_episodes < 1 or n_seeds < 1 or n_rounds < 1:
        raise ValueError("n_episodes, n_seeds and n_rounds must be positive")
    layers_a, dim_a, layers_b, dim_b = shapes.layers_a, shapes.dim_a, shapes.layers_b, shapes.dim_b
    latent_dim, signal, relationship_effect = planted.latent_dim, planted.signal, planted.relationship_effect
    min_utterances, n_personas = planted.min_utterances, planted.n_personas
    shared, shared_by = planted.shared, planted.shared_by
    model_a, model_b = models
    rng = np.random.default_rng(seed)
    E, S, R = n_episodes, n_seeds, n_rounds
    n_utt_max = 2 * R

    coords, relationship = _episode_coords(rng, E, S, R, layers_a, layers_b, n_personas, tom)
    rho = np.clip(coupling + relationship_effect * relationship / 5.0, 0.0, 0.99)
    rho_u = np.repeat(rho, S)  # per (episode, seed) unit
    PA, nA, _ = _layer_maps(rng, layers_a, dim_a, latent_dim, signal)
    PB, nB, _ = _layer_maps(rng, layers_b, dim_b, latent_dim, signal)
    PAp, _, _ = _layer_maps(rng, layers_a, dim_a, latent_dim, signal)
    PBp, _, _ = _layer_maps(rng, layers_b, dim_b, latent_dim, signal)
    off_a = rng.normal(0, 1, (layers_a, dim_a))
    off_b = rng.normal(0, 1, (layers_b, dim_b))
    n_utt = rng.integers(min(min_utterances, n_utt_max), n_utt_max + 1, size=(E, S))

    u_a = 2 * np.arange(R)  # utterance index of A's round k; B's is u_a + 1
    reached_a = u_a[None, None, :] < n_utt[..., None]
    reached_b = (u_a + 1)[None, None, :] < n_utt[..., None]
    data = {}

    def run(prefix: str, n_utt_run):
        s = _latent_paths(rng, E * S, n_utt_max, latent_dim, rho_u)  # s[:, u + 1] is s_u
        if shared > 0 and prefix == "":
            key = np.arange(E) if shared_by == "task" else np.unique(coords["env_id"][1], return_inverse=True)[1]
            z = _latent_paths(np.random.default_rng([seed, 1]), key.max() + 1, n_utt_max, latent_dim,
                              np.full(key.max() + 1, np.clip(coupling, 0.0, 0.99)))
            s = np.sqrt(shared) * np.repeat(z[key], S, axis=0) + np.sqrt(1 - shared) * s
        ra = u_a[None, None, :] < n_utt_run[..., None]
        rb = (u_a + 1)[None, None, :] < n_utt_run[..., None]
        data[f"hidden_a{prefix}"] = _hidden(rng, s[:, u_a + 1], PA, nA, off_a, ra)
        data[f"hidden_b{prefix}"] = _hidden(rng, s[:, u_a + 2], PB, nB, off_b, rb)
        return s, ra, rb

    s, _, _ = run("", n_utt)
    if passive:
        data["hidden_a_passive"] = _hidden(rng, s[:, u_a], PAp, nA, off_a, reached_a)
        data["hidden_b_passive"] = _hidden(rng, s[:, u_a + 1], PBp, nB, off_b, reached_b)

    dims3 = _DIMS3
    hdims_a = dims3 + ("layer_a", "dim_a")
    hdims_b = dims3 + ("layer_b", "dim_b")
    vars_ = {
        "hidden_a": (hdims_a, data["hidden_a"]), "hidden_b": (hdims_b, data["hidden_b"]),
        "text_a": (dims3, _texts(reached_a, "A")), "text_b": (dims3, _texts(reached_b, "B")),
        "prompt_len_a": (dims3, _prompt_lengths(reached_a, 300)),
        "prompt_len_b": (dims3, _prompt_lengths(reached_b, 320)),
        "n_utterances": (("episode", "sim_seed"), n_utt.astype(np.int32)),
    }
    if passive:
        vars_["hidden_a_passive"] = (hdims_a, data["hidden_a_passive"])
        vars_["hidden_b_passive"] = (hdims_b, data["hidden_b_passive"])
    if tom:
        n_utt_t = rng.integers(min(min_utterances, n_utt_max), n_utt_max + 1, size=(E, S))
        st, ra, rb = run("_tom", n_utt_t)
        vars_.update(_tom_readouts(rng, st, u_a, ra, rb, latent_dim))
        vars_["hidden_a_tom"] = (hdims_a, data["hidden_a_tom"])
        vars_["hidden_b_tom"] = (hdims_b, data["hidden_b_tom"])
        vars_["text_a_tom"] = (dims3, _texts(ra, "A", "_tom"))
        vars_["text_b_tom"] = (dims3, _texts(rb, "B", "_tom"))
        vars_["prompt_len_a_tom"] = (dims3, _prompt_lengths(ra, 360))
        vars_["prompt_len_b_tom"] = (dims3, _prompt_lengths(rb, 380))
        vars_["n_utterances_tom"] = (("episode", "sim_seed"), n_utt_t.astype(np.int32))

    attrs = _cube_attrs((model_a, model_b), (layers_a, dim_a, layers_b, dim_b), n_utt_max,
                        {"passive": passive, "tom": tom},
                        {"coupling": coupling, "seed": seed, "relationship_effect": relationship_effect})
    if shared > 0:
        attrs.update(synthetic_shared=float(shared), synthetic_shared_by=shared_by)
    return xr.Dataset({k: xr.DataArray(v, dims=d) for k, (d, v) in vars_.items()}, coords=coords, attrs=attrs)


# ---------------------------------------------------------------------- a results directory
#: the judge name of synthetic score tables
SYNTHETIC_JUDGE = "synthetic-test-rng"
#: (pair name, model A label, model B label, family, coupling) of the synthetic fixture
#: (run name, unordered pair, order, model A, model B, family, coupling): the cross pair is
#: played in both speaking orders, as ``orders: both`` runs it
SYNTHETIC_PAIRS = (("S-S", "S-S", 1, "synthetic-S", "synthetic-S", "S-family", 0.85),
                   ("S-G", "S-G", 1, "synthetic-S", "synthetic-G", "Cross", 0.75),
                   ("G-S", "S-G", 2, "synthetic-G", "synthetic-S", "Cross", 0.7),
                   ("G-G", "G-G", 1, "synthetic-G", "synthetic-G", "G-family", 0.65))
#: model label -> (layers, width) of the synthetic fixture's hidden states
SYNTHETIC_MODELS = {"synthetic-S": (5, 16), "synthetic-G": (4, 12)}
#: what the fixture asks of ``analyze``: every optional block, tiny MLPs
SYNTHETIC_ANALYSIS = dict(n_samples=None, split_seeds=(0, 1, 2), lags=(1, 2),
                          persona_disjoint=True, relationship=True, relationship_min=3,
                          sample_sizes=(40, 80, 120), nonlinear=True, surrogates=20, planted=8,
                          nonlinear_options={"epochs": 5, "hidden": 32}, progress=False)


def synthetic_judge_table(cube: xr.Dataset, seed: int) -> pd.DataFrame:
    """A judge table of random scores, for tests only (``judge = "synthetic-test-rng"``).

    One row per (episode, sim_seed, agent, dimension) of ``cube``, scores drawn uniformly
    from each dimension's range by ``numpy.random.default_rng(seed)``.
    """
    rng = np.random.default_rng(seed)
    tasks = np.asarray(cube["task_index"]) if "task_index" in cube.coords else np.arange(cube.sizes["episode"])
    rows = []
    for ep in range(cube.sizes["episode"]):
        for s in np.asarray(cube["sim_seed"]) if "sim_seed" in cube.coords else range(cube.sizes["sim_seed"]):
            for agent in (1, 2):
                for dim in DIMENSIONS:
                    lo, hi = SCORE_RANGES[dim]
                    rows.append({"episode": ep, "task_index": int(tasks[ep]), "sim_seed": int(s),
                                 "agent": agent, "agent_name": f"agent {agent}",
                                 "dimension": dim, "score": int(rng.integers(lo, hi + 1)),
                                 "expected": math.nan, "reasoning": "synthetic test data",
                                 "judge": SYNTHETIC_JUDGE, "mode": "synthetic", "error": "",
                                 "raw": ""})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def build_synthetic_results(root: str | os.PathLike, pairs=SYNTHETIC_PAIRS, seed: int = 0,
                            cube_kwargs: dict | None = None,
                            analyze_kwargs: dict | None = None, n_episodes: int = 60, n_seeds: int = 2,
                            n_rounds: int = 6) -> Path:
    """Write a tiny results directory for tests: synthetic cubes, ``analyze``, random judge.

    Parameters
    ----------
    root : path
        Directory to create (``manifest.json``, ``cubes/``, ``analysis/``, ``judge/``).
    pairs : sequence of (name, pair, order, model_a, model_b, family, coupling)
        Ordered runs (:data:`SYNTHETIC_PAIRS`); model labels must be keys of
        :data:`SYNTHETIC_MODELS`.
    seed : int
        Seeds the cubes (``seed + i`` for pair ``i``) and the judge tables.
    cube_kwargs, analyze_kwargs : dict, optional
        Extra arguments for :func:`make_synthetic_cube` and
        :func:`synclib.analysis.analyze` (the latter on top of :data:`SYNTHETIC_ANALYSIS`;
        the ToM block is added when ``synclib.analysis.tom`` exists).
    n_episodes, n_seeds, n_rounds : int
        Episodes per cube, simulation seeds per episode and rounds per dialog (the dialogs end
        between utterance ``Planted.min_utterances`` (``cube_kwargs["planted"]``, default 4) and
        ``2 * n_rounds``).
        60 episodes leave the lag 2 contrast's fits (genuine and lag 2 on lag 2's rows) 100-170
        training samples, where the synthetic SyncR² is above 0.

    Returns
    -------
    Path
        ``root``.  Its manifest has ``"synthetic": true``; nothing in it is a model result.
    """
    import importlib.util

    # lazy: torch loads only when the synthetic results are analysed
    from synclib.analysis import analyze

    root = Path(root)
    for sub in ("cubes", "analysis", "judge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    akw = {**SYNTHETIC_ANALYSIS, "tom": importlib.util.find_spec("synclib.analysis.tom") is not None,
           **(analyze_kwargs or {})}
    entries = []
    for i, (name, pair, order, model_a, model_b, family, coupling) in enumerate(pairs):
        (la, da), (lb, db) = SYNTHETIC_MODELS[model_a], SYNTHETIC_MODELS[model_b]
        cube = make_synthetic_cube(n_episodes=n_episodes, n_seeds=n_seeds, n_rounds=n_rounds,
                                   shapes=Shapes(la, da, lb, db), coupling=coupling, seed=seed + i,
                                   models=(model_a, model_b), **(cube_kwargs or {}))
        cube.to_netcdf(root / "cubes" / f"{name}.nc")
        analyze(cube, **akw).to_netcdf(root / "analysis" / f"{name}.nc")
        save_table(synthetic_judge_table(cube, seed + i), root / "judge" / f"{name}.judge.csv")
        entries.append({"name": name, "pair": pair, "order": order, "model_a": model_a,
                        "model_b": model_b, "family": family,
                        "cube": f"cubes/{name}.nc", "analysis": f"analysis/{name}.nc",
                        "judge": f"judge/{name}.judge.csv"})
    manifest = {"name": "synthetic-test-fixture", "synthetic": True, "embedded": False,
                "pairs": entries,
                "config": {"scenarios": "synthetic (tests/synthetic.py)",
                           "simulate": {"episodes": n_episodes, "seeds": list(range(n_seeds)),
                                        "max_utterances": 2 * n_rounds},
                           "analysis": {k: v for k, v in akw.items() if k != "progress"}}}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
    return root
