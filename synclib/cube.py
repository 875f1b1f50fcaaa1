"""Activation cubes: crash-safe netCDF4 writing and lazy opening.

One cube per model pair (and condition set) holds, for every episode (task
index) and simulation seed, the hidden states of both agents at the last
prompt token of each of their utterances, the utterance texts and the prompt
lengths, plus the optional passive-reader and Theory-of-Mind variables.  The
schema is the one in ``book/architecture.md`` ("The cube"):

=====================================  ==============================================
variable                               dims
=====================================  ==============================================
``hidden_a`` (``_passive``, ``_tom``)  episode, sim_seed, round, layer_a, dim_a
``hidden_b`` (``_passive``, ``_tom``)  episode, sim_seed, round, layer_b, dim_b
``text_a``, ``text_b`` (``_tom``)      episode, sim_seed, round   (``""`` unreached)
``prompt_len_a``, ``prompt_len_b``     episode, sim_seed, round   (``-1`` unreached)
``n_utterances`` (``_tom``)            episode, sim_seed
``emotion_a``, ``emotion_b``           episode, sim_seed, round, emotion
``action_a``, ``action_b``             episode, sim_seed, round, action
=====================================  ==============================================

(``prompt_len_a_tom``, ``prompt_len_b_tom``, ``n_utterances_tom`` and
``tom_format_a``, ``tom_format_b`` are additions for the ToM run.)  Rounds an episode never reached are NaN.

Crash safety
------------
A run writes *parts*: every finished batch of whole (episode, seed) *units*
goes to ``PATH.parts/part-NNNNN.nc``, written under a temporary name, fsynced
and atomically renamed, so a part either exists completely or not at all, even
after ``kill -9``.  ``PATH.parts/spec.json`` records the run's settings; a
re-run with the same settings skips the units already in parts.  When every
unit is in, :meth:`CubeWriter.finalize` streams the parts into ``PATH.tmp``
(one unit at a time, never the whole cube in memory), sets the global
attribute ``complete = 1``, fsyncs, renames to ``PATH`` and removes the parts.
:func:`open_cube` refuses any file without ``complete = 1``.

Storage
-------
Hidden states are float32 on disk, chunked one (episode, seed) unit per chunk
(``(1, 1, rounds, layers, dim)``; 4 MiB at 8 x 32 x 4096) and compressed with
zlib + shuffle.  ``store_dtype="float16"`` (or ``"bfloat16"``) keeps float32's
range but rounds the mantissa to float16's 10 (bfloat16's 7) bits, IEEE
round-to-nearest-even ("bit rounding"); the zeroed low bits then compress
away.  The relative error of every value is at most 2**-11 (2**-8), and there
is no overflow for large activations, unlike a cast to IEEE float16.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

__all__ = [
    "CubeError",
    "IncompleteCubeError",
    "CubeSpec",
    "Unit",
    "CubeWriter",
    "EPISODE_COORDS",
    "STORE_DTYPES",
    "bitround",
    "open_cube",
    "is_complete",
    "parts_dir",
    "HiddenRows",
    "DEFAULT_RESIDENT_BYTES",
]

#: per-episode coordinates (besides the ``episode`` dimension coordinate itself)
EPISODE_COORDS = (
    "task_index", "env_id", "codename", "source", "relationship",
    "agent1_id", "agent2_id", "agent1_name", "agent2_name",
)
_INT_COORDS = {"task_index", "relationship"}

#: store_dtype -> explicit mantissa bits kept (None: lossless float32)
STORE_DTYPES = {"float32": None, "float16": 10, "bfloat16": 7}

_ZLIB_LEVEL = 4


class CubeError(ValueError):
    """A cube or its parts cannot be written or read as asked."""


class IncompleteCubeError(CubeError):
    """The file is not a finished cube (no ``complete = 1`` attribute)."""


def parts_dir(path: str | os.PathLike) -> Path:
    """The folder that holds the finished batches of an unfinished cube."""
    path = Path(path)
    return path.with_name(path.name + ".parts")


def _tmp_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def bitround(x: np.ndarray, keepbits: int | None) -> np.ndarray:
    """Round float32 values to ``keepbits`` explicit mantissa bits.

    IEEE round-to-nearest-even on the mantissa, float32 range kept; NaN and
    infinities pass unchanged.  ``keepbits=None`` returns ``x`` as float32.

    Parameters
    ----------
    x : array, any shape
    keepbits : int in 0..23, or None

    Returns
    -------
    float32 array, same shape; ``|y - x| <= 2**-(keepbits+1) * |x|``.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if keepbits is None or keepbits >= 23:
        return x
    drop = 23 - int(keepbits)
    bits = x.view(np.uint32)
    half = np.uint32((1 << (drop - 1)) - 1)
    odd = (bits >> np.uint32(drop)) & np.uint32(1)
    rounded = (bits + half + odd) & np.uint32(~((1 << drop) - 1) & 0xFFFFFFFF)
    out = np.where(np.isfinite(x), rounded, bits).view(np.float32)
    return out.reshape(x.shape)


@dataclasses.dataclass
class CubeSpec:
    """Everything that fixes a cube's layout and identity.

    Parameters
    ----------
    episodes : list of dict
        One dict per episode with the keys of :data:`EPISODE_COORDS`
        (``task_index`` unique); order = order along ``episode``.
    seeds : list of int
        Simulation seeds, order = order along ``sim_seed``.
    n_rounds : int
        Rounds per agent (``ceil(max_utterances / 2)``).
    n_layers_a, d_model_a, n_layers_b, d_model_b : int
        Shapes of the recorded states of model A (agent 1) and B (agent 2).
    passive, tom : bool
        Whether the passive-reader and ToM variables exist.
    emotions, actions : sequence of str
        Candidate words of the ToM distributions (used only when ``tom``).
    store_dtype : {"float32", "float16", "bfloat16"}
    attrs : dict
        Further global attributes (model names, generation settings, ...):
        str, int, float or bool values.
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
        self.emotions = list(self.emotions)
        self.actions = list(self.actions)
        if self.tom and (not self.emotions or not self.actions):
            raise CubeError("a ToM cube needs the emotion and action words")

    # ------------------------------------------------------------------ layout
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
        """Per-unit variables: name -> (dims without episode/sim_seed, kind).

        kind is ``"hidden"`` (float32, NaN fill), ``"prob"`` (float32, NaN
        fill), ``"text"`` (str, ``""`` fill) or ``"int"`` (int32, ``-1`` fill).
        """
        ha, hb = ("round", "layer_a", "dim_a"), ("round", "layer_b", "dim_b")
        r = ("round",)
        v = {
            "hidden_a": (ha, "hidden"), "hidden_b": (hb, "hidden"),
            "text_a": (r, "text"), "text_b": (r, "text"),
            "prompt_len_a": (r, "int"), "prompt_len_b": (r, "int"),
            "n_utterances": ((), "int"),
        }
        if self.passive:
            v["hidden_a_passive"] = (ha, "hidden")
            v["hidden_b_passive"] = (hb, "hidden")
        if self.tom:
            v.update({
                "hidden_a_tom": (ha, "hidden"), "hidden_b_tom": (hb, "hidden"),
                "text_a_tom": (r, "text"), "text_b_tom": (r, "text"),
                "prompt_len_a_tom": (r, "int"), "prompt_len_b_tom": (r, "int"),
                "n_utterances_tom": ((), "int"),
                "tom_format_a": (r, "int"), "tom_format_b": (r, "int"),
                "emotion_a": (r + ("emotion",), "prob"), "emotion_b": (r + ("emotion",), "prob"),
                "action_a": (r + ("action",), "prob"), "action_b": (r + ("action",), "prob"),
            })
        return v

    def units(self) -> list[tuple[int, int]]:
        """All (task_index, seed) units, episode-major."""
        return [(int(e["task_index"]), s) for e in self.episodes for s in self.seeds]

    # ------------------------------------------------------------------ identity
    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["attrs"] = {k: _attr_value(v) for k, v in self.attrs.items()}
        return json.loads(json.dumps(d, sort_keys=True, default=_json_default))

    @classmethod
    def from_json(cls, d: Mapping) -> "CubeSpec":
        return cls(**dict(d))


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
    """One finished (episode, seed): every per-unit variable of the spec.

    ``values[name]`` has the shape of the variable's dims without
    ``episode``/``sim_seed``, e.g. ``hidden_a`` is ``(n_rounds, n_layers_a,
    d_model_a)`` float32 and ``text_a`` an object array ``(n_rounds,)``.
    """

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


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    _fsync_file(tmp)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


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


class CubeWriter:
    """Write a cube crash-safely, one batch of whole units at a time.

    Parameters
    ----------
    path : path of the final ``.nc`` file
    spec : CubeSpec
    overwrite : bool
        Replace an existing finished cube at ``path``; without it a finished
        cube raises :class:`CubeError`.

    Raises
    ------
    CubeError
        if ``path`` is finished (and not ``overwrite``) or if parts from a run
        with different settings are present.

    Examples
    --------
    >>> w = CubeWriter("pair.nc", spec)              # doctest: +SKIP
    >>> todo = [u for u in spec.units() if u not in w.done]   # doctest: +SKIP
    >>> w.write_part(batch_id, [unit, ...])           # doctest: +SKIP
    >>> w.finalize()                                  # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike, spec: CubeSpec, *, overwrite: bool = False):
        self.path = Path(path)
        self.spec = spec
        self.parts = parts_dir(self.path)
        if self.path.exists():
            if is_complete(self.path) and not overwrite:
                raise CubeError(f"{self.path} is already a finished cube; pass overwrite=True "
                                "(CLI: --overwrite) to replace it")
        self.parts.mkdir(parents=True, exist_ok=True)
        spec_file = self.parts / "spec.json"
        new = spec.to_json()
        if spec_file.exists():
            old = json.loads(spec_file.read_text())
            if old != new:
                diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                if "attrs" in diff:
                    a, b = old.get("attrs", {}), new.get("attrs", {})
                    diff.remove("attrs")
                    diff += [f"attrs.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
                raise CubeError(
                    f"{self.parts} holds parts of a run with different settings ({', '.join(diff)}); "
                    "re-run with the original settings to resume, or delete that folder to start over")
        else:
            _atomic_write_text(spec_file, json.dumps(new, indent=1, sort_keys=True))
        for stale in self.parts.glob("*.tmp"):
            stale.unlink()
        self.done: set[tuple[int, int]] = set()
        self._part_files: dict[int, Path] = {}
        for f in sorted(self.parts.glob("part-*.nc")):
            self._part_files[int(f.stem.split("-")[1])] = f
            self.done.update(_read_part_units(f))
        valid = set(spec.units())
        foreign = self.done - valid
        if foreign:
            raise CubeError(f"{self.parts} holds units not in this run: {sorted(foreign)[:5]}")

    @staticmethod
    def existing_spec(path: str | os.PathLike) -> dict | None:
        """The JSON spec of an unfinished run at ``path``, or None."""
        f = parts_dir(path) / "spec.json"
        return json.loads(f.read_text()) if f.exists() else None

    def has_part(self, part_id: int) -> bool:
        return part_id in self._part_files

    # ------------------------------------------------------------------ parts
    def write_part(self, part_id: int, units: Iterable[Unit]) -> Path:
        """Write finished units atomically as part ``part_id``.

        Parameters
        ----------
        part_id : int
            Identifies the batch (file ``part-{part_id:05d}.nc``).
        units : iterable of Unit
            Each with every variable of the spec, shapes as in :meth:`Unit.empty`.
        """
        import netCDF4

        units = list(units)
        if not units:
            raise CubeError("write_part: no units")
        spec = self.spec
        sizes = spec.dims()
        final = self.parts / f"part-{int(part_id):05d}.nc"
        tmp = final.with_name(final.name + ".tmp")
        with netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
            ds.createDimension("unit", len(units))
            for d, n in sizes.items():
                if d not in ("episode", "sim_seed"):
                    ds.createDimension(d, n)
            ds.createVariable("unit_episode", "i8", ("unit",))[:] = [u.episode for u in units]
            ds.createVariable("unit_seed", "i8", ("unit",))[:] = [u.seed for u in units]
            for name, (dims, kind) in spec.variables().items():
                shape = tuple(sizes[d] for d in dims)
                if kind == "text":
                    var = ds.createVariable(name, str, ("unit",) + dims)
                    for i, u in enumerate(units):
                        var[i] = np.asarray(u.values[name], dtype=object).reshape(shape)
                    continue
                dtype = "i4" if kind == "int" else "f4"
                var = ds.createVariable(name, dtype, ("unit",) + dims)
                for i, u in enumerate(units):
                    a = np.asarray(u.values[name])
                    if a.shape != shape:
                        raise CubeError(f"unit ({u.episode}, {u.seed}): {name} has shape {a.shape}, "
                                        f"expected {shape}")
                    if kind == "hidden":
                        a = bitround(a, spec.keepbits)
                    var[i] = a
        _fsync_file(tmp)
        os.replace(tmp, final)
        _fsync_dir(self.parts)
        self._part_files[int(part_id)] = final
        self.done.update((u.episode, u.seed) for u in units)
        return final

    # ------------------------------------------------------------------ final
    def finalize(self) -> Path:
        """Stream all parts into the final cube, mark it complete, clean up.

        Raises
        ------
        CubeError
            if units are missing.
        """
        import netCDF4

        spec = self.spec
        missing = [u for u in spec.units() if u not in self.done]
        if missing:
            raise CubeError(f"cannot finalize {self.path}: {len(missing)} unit(s) missing, "
                            f"e.g. {missing[:3]}")
        sizes = spec.dims()
        ep_pos = {int(e["task_index"]): i for i, e in enumerate(spec.episodes)}
        seed_pos = {s: j for j, s in enumerate(spec.seeds)}
        tmp = _tmp_path(self.path)
        if tmp.exists():
            tmp.unlink()
        coords_attr = " ".join(EPISODE_COORDS)
        with netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
            for d, n in sizes.items():
                ds.createDimension(d, n)
            ds.createVariable("episode", "i8", ("episode",))[:] = [int(e["task_index"]) for e in spec.episodes]
            ds.createVariable("sim_seed", "i8", ("sim_seed",))[:] = spec.seeds
            ds.createVariable("round", "i4", ("round",))[:] = np.arange(spec.n_rounds)
            ds.createVariable("layer_a", "i4", ("layer_a",))[:] = np.arange(spec.n_layers_a)
            ds.createVariable("layer_b", "i4", ("layer_b",))[:] = np.arange(spec.n_layers_b)
            if spec.tom:
                ds.createVariable("emotion", str, ("emotion",))[:] = np.array(spec.emotions, dtype=object)
                ds.createVariable("action", str, ("action",))[:] = np.array(spec.actions, dtype=object)
            for c in EPISODE_COORDS:
                vals = [e[c] for e in spec.episodes]
                if c in _INT_COORDS:
                    ds.createVariable(c, "i8", ("episode",))[:] = np.array(vals, dtype=np.int64)
                else:
                    ds.createVariable(c, str, ("episode",))[:] = np.array([str(v) for v in vals], dtype=object)
            out = {}
            for name, (dims, kind) in spec.variables().items():
                full = ("episode", "sim_seed") + dims
                if kind == "text":
                    var = ds.createVariable(name, str, full)
                elif kind == "int":
                    var = ds.createVariable(name, "i4", full, fill_value=False)
                else:
                    chunks = (1, 1) + tuple(sizes[d] for d in dims)
                    var = ds.createVariable(name, "f4", full, zlib=True, complevel=_ZLIB_LEVEL,
                                            shuffle=True, chunksizes=chunks, fill_value=np.float32(np.nan))
                    if kind == "hidden" and spec.keepbits is not None:
                        var.bitround_keepbits = spec.keepbits
                var.coordinates = coords_attr
                out[name] = (var, kind)
            for k, v in _describe(spec).items():
                out[k][0].long_name = v
            for f in sorted(self._part_files.values()):
                with netCDF4.Dataset(f, "r") as part:
                    part.set_auto_mask(False)
                    eps = part["unit_episode"][:]
                    seeds = part["unit_seed"][:]
                    for i, (e, s) in enumerate(zip(eps, seeds)):
                        a, b = ep_pos[int(e)], seed_pos[int(s)]
                        for name, (var, kind) in out.items():
                            var[a, b] = part[name][i]
            attrs = {
                "title": "synclib activation cube",
                "conventions": "synclib cube v1 (see book/architecture.md)",
                "store_dtype": spec.store_dtype,
                "passive": int(spec.passive),
                "tom": int(spec.tom),
                **{k: _attr_value(v) for k, v in spec.attrs.items()},
            }
            attrs.setdefault("n_layers_a", spec.n_layers_a)
            attrs.setdefault("d_model_a", spec.d_model_a)
            attrs.setdefault("n_layers_b", spec.n_layers_b)
            attrs.setdefault("d_model_b", spec.d_model_b)
            ds.setncatts(attrs)
            ds.complete = 1
        _fsync_file(tmp)
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        shutil.rmtree(self.parts, ignore_errors=True)
        return self.path


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


def _read_part_units(f: Path) -> list[tuple[int, int]]:
    import netCDF4

    try:
        with netCDF4.Dataset(f, "r") as ds:
            return [(int(e), int(s)) for e, s in zip(ds["unit_episode"][:], ds["unit_seed"][:])]
    except (OSError, KeyError, IndexError) as exc:  # renamed parts are whole; this is corruption
        raise CubeError(f"cannot read part {f}: {exc}; delete it to recompute its units") from exc


def open_cube(path: str | os.PathLike, chunks: dict | str | None = "native", **kwargs):
    """Open a finished cube lazily (dask arrays) with xarray.

    Parameters
    ----------
    path : path of the ``.nc`` file
    chunks : dask chunks, e.g. ``{"episode": 16}``; default ``"native"`` = the
        on-disk chunks (one (episode, seed) unit per chunk); ``None`` loads
        eagerly into numpy.
    **kwargs : passed to :func:`xarray.open_dataset`

    Returns
    -------
    xarray.Dataset
        The hidden-state variables are dask arrays; the small ones
        (coordinates, texts, lengths, ToM distributions) are loaded.

    Raises
    ------
    FileNotFoundError
        if neither the cube nor its parts exist.
    IncompleteCubeError
        if the file lacks ``complete = 1`` or only parts exist.
    """
    import xarray as xr

    path = Path(path)
    if not path.exists():
        if parts_dir(path).exists():
            raise IncompleteCubeError(
                f"{path} is not finished: only the parts of an interrupted run are in "
                f"{parts_dir(path)}; re-run the same `synclib simulate` command to resume it")
        raise FileNotFoundError(f"no cube at {path}")
    if not is_complete(path):
        raise IncompleteCubeError(
            f"{path} is not a finished cube (no complete=1 attribute); it is a partial or foreign "
            "file; re-run the simulation that writes it")
    if chunks is None:
        return xr.open_dataset(path, engine="netcdf4", **kwargs).load()
    ds = xr.open_dataset(path, engine="netcdf4", chunks={} if chunks == "native" else chunks, **kwargs)
    # coordinates, texts, lengths and distributions are small: load them now
    small = [n for n in ds.variables if not {"dim_a", "dim_b"} & set(ds[n].dims)]
    for n in small:
        ds[n] = ds[n].load()
    return ds


#: hidden-state variables up to this size are loaded whole; larger ones stream from disk
DEFAULT_RESIDENT_BYTES = 2 << 30
#: a streamed read fetches about this many bytes of chunks at a time
READ_BATCH_BYTES = 256 << 20


def _outer(a, index, axis: int):
    """``a`` indexed from ``axis`` on by ``index``, one axis at a time (outer indexing;
    numpy would broadcast several index arrays together, dask refuses them)."""
    for i in index:
        a = a[(slice(None),) * axis + (i,)]
        axis += isinstance(i, slice) or np.ndim(i) > 0
    return a


def _local(*arrays):
    """Compute dask arrays with threads in this process, even inside a task of a
    ``dask.distributed`` cluster (the file is local to the worker; nothing to ship)."""
    import dask

    return dask.compute(*arrays, scheduler="threads")


class HiddenRows:
    """One hidden-state variable of a cube as rows: sample ``(episode, sim_seed, round)``
    -> ``(layer, dim)``, flattened in C order to ``shape = (E*S*R, L, D)``.

    A variable of at most ``max_resident_bytes`` (default
    :data:`DEFAULT_RESIDENT_BYTES`, 2 GiB) is loaded whole, once.  A larger
    one (only possible when the cube was opened lazily, see :func:`open_cube`)
    streams from disk: :attr:`ok` is reduced chunk by chunk with dask, and
    indexing reads only the on-disk chunks that hold the requested rows, so
    memory follows the rows asked for, not the cube.

    Indexing: ``rows[idx]`` -> ``(len(idx), L, D)``, with ``idx`` an integer or
    a 1-D integer array of flat row numbers (any order, repeats allowed);
    further indices select layers and dims, each on its own axis (outer
    indexing: ``rows[idx, 3]``, ``rows[idx, 2:5]``, ``rows[idx, [0, 2]]``).
    Results are numpy, in the stored dtype.

    Raises
    ------
    CubeError
        if the variable is not 5-D ``(episode, sim_seed, round, layer, dim)`` or not
        floating point.
    """

    def __init__(self, var, max_resident_bytes: int | None = None):
        name = var.name
        if var.ndim != 5 or tuple(var.dims[:3]) != ("episode", "sim_seed", "round"):
            raise CubeError(f"cube variable {name!r} has dims {var.dims}; expected "
                            "(episode, sim_seed, round, layer, dim)")
        if np.dtype(var.dtype).kind != "f":
            raise CubeError(f"cube variable {name!r} is not floating point ({var.dtype})")
        self.name = name
        self.grid = tuple(int(n) for n in var.shape[:3])
        self.shape = (int(np.prod(self.grid)),) + tuple(int(n) for n in var.shape[3:])
        self.dtype = np.dtype(var.dtype)
        self.nbytes = int(np.prod(var.shape)) * self.dtype.itemsize
        #: the budget: larger variables stream (default :data:`DEFAULT_RESIDENT_BYTES`)
        self.max_resident_bytes = DEFAULT_RESIDENT_BYTES if max_resident_bytes is None else int(max_resident_bytes)
        self.resident = var.chunks is None or self.nbytes <= self.max_resident_bytes
        if self.resident:
            data = var.data
            if var.chunks is not None:  # dask: read it here, in this process (see _local)
                (data,) = _local(data)
            self._array = np.asarray(data).reshape(self.shape)
            self._data = None
        else:
            self._array = None
            self._data = var.data  # dask array (E, S, R, L, D)
        self._ok = None

    ndim = 3

    @property
    def array(self) -> np.ndarray | None:
        """The whole variable as (E*S*R, L, D) when resident, else None."""
        return self._array

    @property
    def ok(self) -> np.ndarray:
        """(E*S*R,) bool: the row is finite everywhere (False for unreached rounds)."""
        if self._ok is None:
            if self.resident:
                self._ok = np.isfinite(self._array).reshape(self.shape[0], -1).all(1)
            else:
                import dask.array as da

                (ok,) = _local(da.isfinite(self._data).all(axis=(3, 4)))
                self._ok = ok.reshape(-1)
        return self._ok

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        rows, rest = np.asarray(key[0]), key[1:]
        if rows.dtype.kind not in "iu" or rows.ndim > 1:
            raise IndexError(f"{self.name}: rows must be an integer or a 1-D integer array")
        if self.resident:
            if not any(np.ndim(i) > 0 for i in rest):  # rows the only index array: numpy is outer
                return self._array[(rows,) + rest]
            return _outer(self._array[rows], rest, rows.ndim)
        out = self._read(np.atleast_1d(rows), rest)
        return out[0] if rows.ndim == 0 else out

    def _read(self, rows: np.ndarray, rest: tuple) -> np.ndarray:
        """Rows of a streamed variable, read unit by unit (one on-disk chunk each) in
        batches of about :data:`READ_BATCH_BYTES`, into one preallocated array."""
        data = _outer(self._data, rest, 3)  # lazy (E, S, R, ...)
        out = np.empty((len(rows),) + data.shape[3:], dtype=self.dtype)
        if len(rows) == 0:
            return out
        if rows.min() < 0 or rows.max() >= self.shape[0]:
            raise IndexError(f"{self.name}: rows outside 0..{self.shape[0] - 1}")
        E, S, R = self.grid
        unit, k = np.divmod(rows, R)
        order = np.argsort(unit, kind="stable")
        units, first = np.unique(unit[order], return_index=True)
        bounds = np.append(first, len(order))
        unit_bytes = max(1, R * int(np.prod(data.shape[3:])) * self.dtype.itemsize)
        step = max(1, READ_BATCH_BYTES // unit_bytes)
        for b0 in range(0, len(units), step):
            blocks = _local(*[data[u // S, u % S] for u in units[b0:b0 + step]])
            for j, blk in enumerate(blocks, start=b0):
                idx = order[bounds[j]:bounds[j + 1]]
                out[idx] = blk[k[idx]]
        return out

    def __repr__(self):
        how = "resident" if self.resident else "streamed"
        return f"<HiddenRows {self.name} {self.shape} {self.dtype} {how}, {self.nbytes / 2**20:.1f} MiB>"
