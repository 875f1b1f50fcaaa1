"""The cube's schema: dimensions, variables and their names (built by :func:`var_name` only), identity, file
layout.  The table of variables is in :mod:`synclib.cube`."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

# views: "active" (the played dialog; the analysis' "genuine" condition), "passive" (the reader), "tom"
from synclib.tasks.prompts import VIEWS

__all__ = ["CubeError", "IncompleteCubeError", "StalePartsError", "CubeSpec", "Unit", "EPISODE_COORDS", "STORE_DTYPES",
           "VIEWS", "CUBE_VERSION", "var_name", "parts_dir", "is_complete", "cube_version", "check_passive_seeds"]

#: per-episode coordinates (besides the ``episode`` dimension coordinate itself)
EPISODE_COORDS = (
    "task_index", "env_id", "codename", "source", "relationship",
    "agent1_id", "agent2_id", "agent1_name", "agent2_name",
)
_INT_COORDS = {"task_index", "relationship"}

#: store_dtype -> explicit mantissa bits kept (None: lossless float32)
STORE_DTYPES = {"float32": None, "float16": 10, "bfloat16": 7}

_ZLIB_LEVEL = 4

#: the layout written (attribute ``conventions``); v2 added ``passive_reader`` and ``passive_seeds``, v1 is still read
CUBE_VERSION = 2
_CONVENTIONS = "synclib cube v{} (see book/architecture.md)"


class CubeError(ValueError):
    """A cube or its parts cannot be written or read as asked."""


class IncompleteCubeError(CubeError):
    """The file is not a finished cube (no ``complete = 1`` attribute)."""


class StalePartsError(CubeError):
    """The parts folder ``parts`` holds parts of a run with other settings (the message names them)."""

    def __init__(self, message: str, parts: Path):
        super().__init__(message)
        self.parts = parts


def parts_dir(path: str | os.PathLike) -> Path:
    """The folder that holds the finished batches of an unfinished cube."""
    path = Path(path)
    return path.with_name(path.name + ".parts")


_SIDED = ("hidden", "text", "prompt_len")          # one per agent and view
_TOM_ONLY = ("emotion", "action", "tom_format")    # one per agent, ToM run only


def check_passive_seeds(passive_seeds, seeds) -> None:
    """Raise ValueError unless the passive reader's seeds are among the simulated ones (None: all); the one
    rule for the config, the command line, :class:`Passes` and the cube, each re-raising as its own error."""
    if passive_seeds is None:
        return
    extra = sorted(set(int(s) for s in passive_seeds) - set(int(s) for s in seeds))
    if extra:
        raise ValueError(f"passive_seeds {extra} are not among the seeds {[int(s) for s in seeds]}")


def var_name(kind: str, side: str | None = None, view: str = "active") -> str:
    """The name of a cube variable.

    Parameters
    ----------
    kind : {"hidden", "text", "prompt_len", "n_utterances", "reader", "emotion", "action", "tom_format"}
        ``reader`` is the passive reader's persona id (``view="passive"``, no side).
    side : {"a", "b"}
        The agent (``a`` = agent 1, model A); ``None`` for ``n_utterances`` and ``reader``.
    view : {"active", "passive", "passive_own", "tom"}
        ``passive`` and ``passive_own`` (the reader told it is the agent it replaces) exist for ``hidden`` only;
        ``emotion``, ``action`` and ``tom_format`` for ``tom`` only
        (their names carry no suffix).

    Returns
    -------
    str, e.g. ``("hidden", "a", "passive")`` -> ``hidden_a_passive``, ``("n_utterances", view="tom")`` ->
    ``n_utterances_tom``, ``("emotion", "b", "tom")`` -> ``emotion_b``,
    ``("reader", view="passive")`` -> ``passive_reader``.

    Raises
    ------
    CubeError
        for an unknown kind, side or view, or a combination the cube does not have.
    """
    if view not in VIEWS + ("passive_own",):
        raise CubeError(f"view must be one of {VIEWS + ('passive_own',)}, got {view!r}")
    if view == "passive_own" and kind != "hidden":
        raise CubeError(f"the passive reader records hidden states only, not {kind!r}")
    suffix = "" if view == "active" else f"_{view}"
    if kind == "n_utterances":
        if side is not None or view == "passive":
            raise CubeError(f"n_utterances has no side and no passive view (got side={side!r}, view={view!r})")
        return kind + suffix
    if kind == "reader":
        if side is not None or view != "passive":
            raise CubeError(f"reader exists for the passive view only, without a side (got side={side!r}, "
                            f"view={view!r})")
        return "passive_reader"
    if side not in ("a", "b"):
        raise CubeError(f"side must be 'a' or 'b', got {side!r}")
    if kind in _TOM_ONLY:
        if view != "tom":
            raise CubeError(f"{kind} exists for the ToM run only (view='tom'), got view={view!r}")
        return f"{kind}_{side}"
    if kind not in _SIDED:
        raise CubeError(f"unknown cube variable kind {kind!r}; kinds: {_SIDED + ('n_utterances',) + _TOM_ONLY}")
    if view == "passive" and kind != "hidden":
        raise CubeError(f"the passive reader records hidden states only, not {kind!r}")
    return f"{kind}_{side}{suffix}"


@dataclasses.dataclass
class CubeSpec:
    """Everything that fixes a cube's layout and identity.

    Parameters
    ----------
    episodes : list of dict
        One per episode, keys :data:`EPISODE_COORDS` (``task_index`` unique), in ``episode`` order.
    seeds : list of int
        Simulation seeds, in ``sim_seed`` order.
    n_rounds : int
        Rounds per agent (``ceil(max_utterances / 2)``).
    n_layers_a, d_model_a, n_layers_b, d_model_b : int
        Shapes of the recorded states of model A (agent 1) and B (agent 2).
    passive, tom : bool
        Whether the passive-reader and ToM variables exist.
    passive_own : bool
        With ``passive``: a second reader, told it is the agent it replaces (``hidden_*_passive_own``).
    passive_seeds : list of int, optional
        The seeds the passive reader read (None: all); elsewhere ``hidden_*_passive`` is NaN, ``passive_reader`` "".
    emotions, actions : sequence of str
        Candidate words of the ToM distributions (used only when ``tom``).
    store_dtype : {"float32", "float16", "bfloat16"}
    attrs : dict
        Further global attributes (model names, generation settings, ...): str, int, float or bool values.
    """

    episodes: list
    seeds: list
    n_rounds: int
    n_layers_a: int
    d_model_a: int
    n_layers_b: int
    d_model_b: int
    passive: bool = False
    tom: bool = False
    emotions: Sequence[str] = ()
    actions: Sequence[str] = ()
    store_dtype: str = "float32"
    attrs: dict = dataclasses.field(default_factory=dict)
    passive_seeds: list | None = None
    passive_own: bool = False

    def __post_init__(self):
        if self.store_dtype not in STORE_DTYPES:
            raise CubeError(f"store_dtype must be one of {sorted(STORE_DTYPES)}, got {self.store_dtype!r}")
        self.episodes = [dict(e) for e in self.episodes]
        for i, e in enumerate(self.episodes):
            missing = [k for k in EPISODE_COORDS if k not in e]
            if missing:
                raise CubeError(f"episode {i} lacks coordinate(s) {missing}")
        idx = [int(e["task_index"]) for e in self.episodes]
        if len(set(idx)) != len(idx):
            raise CubeError("episodes: task_index values are not unique")
        self.seeds = [int(s) for s in self.seeds]
        if len(set(self.seeds)) != len(self.seeds):
            raise CubeError(f"seeds are not unique: {self.seeds}")
        if self.passive_seeds is not None:
            self.passive_seeds = [int(x) for x in self.passive_seeds]
            try:
                check_passive_seeds(self.passive_seeds, self.seeds)
            except ValueError as exc:
                raise CubeError(str(exc)) from None
        self.emotions = list(self.emotions)
        self.actions = list(self.actions)
        if self.tom and (not self.emotions or not self.actions):
            raise CubeError("a ToM cube needs the emotion and action words")

    # ------------------------------------------------------------------ layout
    def read_passive_seeds(self) -> list[int]:
        """The seeds the passive reader reads (none without ``passive``)."""
        if not self.passive:
            return []
        return list(self.seeds if self.passive_seeds is None else self.passive_seeds)

    @property
    def keepbits(self) -> int | None:
        return STORE_DTYPES[self.store_dtype]

    def dims(self) -> dict[str, int]:
        """Dimension sizes of the final cube."""
        d = {
            "episode": len(self.episodes), "sim_seed": len(self.seeds), "round": self.n_rounds,
            "layer_a": self.n_layers_a, "dim_a": self.d_model_a,
            "layer_b": self.n_layers_b, "dim_b": self.d_model_b,
        }
        if self.tom:
            d["emotion"] = len(self.emotions)
            d["action"] = len(self.actions)
        return d

    def variables(self) -> dict[str, tuple[tuple[str, ...], str]]:
        """Per-unit variables: name -> (dims without episode/sim_seed, kind); kind is ``"hidden"`` or ``"prob"``
        (float32, NaN fill), ``"text"`` (str, ``""`` fill) or ``"int"`` (int32, ``-1`` fill)."""
        h = {"a": ("round", "layer_a", "dim_a"), "b": ("round", "layer_b", "dim_b")}
        r = ("round",)
        views = ("active",) + (("tom",) if self.tom else ())
        v = {}
        for view in views:
            for s in "ab":
                v[var_name("hidden", s, view)] = (h[s], "hidden")
            for s in "ab":
                v[var_name("text", s, view)] = (r, "text")
            for s in "ab":
                v[var_name("prompt_len", s, view)] = (r, "int")
            v[var_name("n_utterances", view=view)] = ((), "int")
            if view == "active" and self.passive:
                for s in "ab":
                    v[var_name("hidden", s, "passive")] = (h[s], "hidden")
                v[var_name("reader", view="passive")] = ((), "text")
                for s in "ab" if self.passive_own else "":
                    v[var_name("hidden", s, "passive_own")] = (h[s], "hidden")
        if self.tom:
            for s in "ab":
                v[var_name("tom_format", s, "tom")] = (r, "int")
            for kind, dim in (("emotion", "emotion"), ("action", "action")):
                for s in "ab":
                    v[var_name(kind, s, "tom")] = (r + (dim,), "prob")
        return v

    def units(self) -> list[tuple[int, int]]:
        """All (task_index, seed) units, episode-major."""
        return [(int(e["task_index"]), s) for e in self.episodes for s in self.seeds]

    # ------------------------------------------------------------------ identity
    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["attrs"] = {k: _attr_value(v) for k, v in self.attrs.items()}
        if not self.passive_own:  # a cube without the second reader keeps its identity
            del d["passive_own"]
        return json.loads(json.dumps(d, sort_keys=True, default=_json_default))


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON-serialisable: {o!r}")


def _attr_value(v):
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, np.generic):
        return v.item()
    if v is None:
        return ""
    if isinstance(v, (str, int, float)):
        return v
    return str(v)


@dataclasses.dataclass
class Unit:
    """One finished (episode, seed): ``values[name]`` has the variable's dims without ``episode``/``sim_seed``,
    e.g. ``hidden_a`` float32 ``(n_rounds, n_layers_a, d_model_a)``, ``text_a`` object ``(n_rounds,)``."""

    episode: int
    seed: int
    values: dict

    @classmethod
    def empty(cls, spec: CubeSpec, episode: int, seed: int) -> "Unit":
        """A unit filled with the "unreached" values (NaN, ``""``, ``-1``)."""
        sizes = spec.dims()
        vals = {}
        for name, (dims, kind) in spec.variables().items():
            shape = tuple(sizes[d] for d in dims)
            if kind in ("hidden", "prob"):
                vals[name] = np.full(shape, np.nan, dtype=np.float32)
            elif kind == "int":
                vals[name] = np.full(shape, -1, dtype=np.int32)
            else:
                vals[name] = np.full(shape, "", dtype=object)
        return cls(int(episode), int(seed), vals)


def cube_version(conventions: str) -> int:
    """The layout version of a cube's ``conventions`` attribute (1 when it names none)."""
    import re

    m = re.search(r"synclib cube v(\d+)", str(conventions))
    return int(m[1]) if m else 1


def is_complete(path: str | os.PathLike) -> bool:
    """True if ``path`` is a netCDF file carrying ``complete = 1``."""
    import netCDF4

    path = Path(path)
    if not path.is_file():
        return False
    try:
        with netCDF4.Dataset(path, "r") as ds:
            return int(getattr(ds, "complete", 0)) == 1
    except (OSError, ValueError, TypeError):
        return False


def _describe(spec: CubeSpec) -> dict[str, str]:
    d = {
        "hidden_a": "model A (agent 1): every decoder layer's output at the last prompt token of utterance 2*round",
        "hidden_b": "model B (agent 2): every decoder layer's output at the last prompt token of utterance 2*round+1",
        "text_a": "agent 1's post-processed utterance 2*round",
        "text_b": "agent 2's post-processed utterance 2*round+1",
        "prompt_len_a": "prompt tokens of agent 1 at utterance 2*round (-1: unreached)",
        "prompt_len_b": "prompt tokens of agent 2 at utterance 2*round+1 (-1: unreached)",
        "n_utterances": "utterances the episode reached",
    }
    if spec.passive:
        d["hidden_a_passive"] = "model A as passive reader in agent 1's slot on the genuine dialog"
        d["hidden_b_passive"] = "model B as passive reader in agent 2's slot on the genuine dialog"
        d[var_name("reader", view="passive")] = ("persona id the passive reader was told it is ('' where the seed was not "
                               "read, or the reader was the replaced agent); rule in attribute "
                               "passive_persona_rule")
    if spec.passive and spec.passive_own:
        d["hidden_a_passive_own"] = "as hidden_a_passive, the reader told it is agent 1 (the agent it replaces)"
        d["hidden_b_passive_own"] = "as hidden_b_passive, the reader told it is agent 2 (the agent it replaces)"
    if spec.tom:
        d.update({
            "hidden_a_tom": "as hidden_a, in the Theory-of-Mind run",
            "hidden_b_tom": "as hidden_b, in the Theory-of-Mind run",
            "text_a_tom": "agent 1's utterance in the ToM run (with emotion and action words)",
            "text_b_tom": "agent 2's utterance in the ToM run (with emotion and action words)",
            "prompt_len_a_tom": "prompt tokens of agent 1 in the ToM run",
            "prompt_len_b_tom": "prompt tokens of agent 2 in the ToM run",
            "n_utterances_tom": "utterances the ToM episode reached",
            "tom_format_a": "1: agent 1's ToM reply opened with an emotion and an action word (distributions "
                            "read where generated); 0: read at the canonical positions; -1: unreached",
            "tom_format_b": "as tom_format_a, for agent 2",
            "emotion_a": "agent 1's probabilities over the emotion words where its emotion word is generated",
            "emotion_b": "agent 2's probabilities over the emotion words where its emotion word is generated",
            "action_a": "agent 1's probabilities over the action words where its action word is generated",
            "action_b": "agent 2's probabilities over the action words where its action word is generated",
        })
    return d


