"""Writing a cube crash-safely: parts of whole units, then one streamed finalisation (:mod:`synclib.cube`,
"Crash safety" and "Storage")."""
from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from typing import Iterable

import numpy as np

from synclib.cube.schema import (_CONVENTIONS, _INT_COORDS, _ZLIB_LEVEL, CUBE_VERSION, EPISODE_COORDS, CubeError,
                                 CubeSpec, StalePartsError, Unit, _attr_value, _describe, is_complete, parts_dir)

__all__ = ["CubeWriter", "bitround"]


def _tmp_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def bitround(x: np.ndarray, keepbits: int | None) -> np.ndarray:
    """Round float32 values to ``keepbits`` explicit mantissa bits (round-to-nearest-even, float32 range kept;
    NaN and infinities unchanged; ``keepbits=None`` returns ``x`` as float32).

    Parameters
    ----------
    x : array, any shape
    keepbits : int in 0..23, or None

    Returns a float32 array ``y`` of the same shape, ``|y - x| <= 2**-(keepbits+1) * |x|``.
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


class CubeWriter:
    """Write a cube crash-safely, one batch of whole units at a time.

    Parameters
    ----------
    path : path of the final ``.nc`` file
    spec : CubeSpec
    overwrite : bool
        Replace an existing finished cube at ``path``.

    Raises
    ------
    CubeError
        if ``path`` is finished (and not ``overwrite``) or parts of a run with other settings are present.

    Examples
    --------
    >>> w = CubeWriter("pair.nc", spec)              # doctest: +SKIP
    >>> todo = [u for u in spec.units() if u not in w.done]   # doctest: +SKIP
    >>> w.write_part(batch_id, [unit, ...])           # doctest: +SKIP
    >>> w.submit_part(batch_id, [unit, ...])          # doctest: +SKIP
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
                raise StalePartsError(
                    f"{self.parts} holds parts of a run with different settings ({', '.join(diff)}); "
                    "re-run with the original settings to resume, or delete that folder to start over", self.parts)
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
        self._writing: threading.Thread | None = None  # the background write (submit_part)
        self._failed: BaseException | None = None  # its error, for wait() to re-raise

    @staticmethod
    def existing_spec(path: str | os.PathLike) -> dict | None:
        """The JSON spec of an unfinished run at ``path``, or None."""
        f = parts_dir(path) / "spec.json"
        return json.loads(f.read_text()) if f.exists() else None

    def has_part(self, part_id: int) -> bool:
        return part_id in self._part_files

    # ------------------------------------------------------------------ parts
    def write_part(self, part_id: int, units: Iterable[Unit]) -> Path:
        """Write finished units atomically as ``part-{part_id:05d}.nc``; each unit has every variable of the
        spec, shapes as in :meth:`Unit.empty`."""
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
                    for i, u in enumerate(units):  # a slice: netCDF4 refuses a bare str per element
                        var[i:i + 1] = np.asarray(u.values[name], dtype=object).reshape((1,) + shape)
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

    def submit_part(self, part_id: int, units: Iterable[Unit]) -> None:
        """:meth:`write_part` in a background thread; return at once.  One write at a time: first waits for
        the previous one (:meth:`wait`, re-raising its error).  The part counts once its file is complete."""
        self.wait()
        units = list(units)
        self._writing = threading.Thread(target=self._write_in_background, args=(part_id, units),
                                         name=f"{self.path.name} part {part_id}")
        self._writing.start()

    def _write_in_background(self, part_id: int, units: list) -> None:
        try:
            self.write_part(part_id, units)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread by wait()
            self._failed = exc

    @property
    def writing(self) -> bool:
        """Whether a submitted part is still being written."""
        return self._writing is not None and self._writing.is_alive()

    def wait(self) -> None:
        """Wait for the part being written in the background, if any; re-raise its error."""
        if self._writing is not None:
            self._writing.join()
            self._writing = None
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    # ------------------------------------------------------------------ final
    def finalize(self) -> Path:
        """Wait for the background write (re-raising its error), stream all parts into the final cube, mark it
        complete, remove the parts.  Raises :class:`CubeError` if units are missing."""
        import netCDF4

        self.wait()
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
                            var[a:a + 1, b:b + 1] = np.asarray(part[name][i:i + 1])[None]
            attrs = {
                "title": "synclib activation cube",
                "conventions": _CONVENTIONS.format(CUBE_VERSION),
                "store_dtype": spec.store_dtype,
                "passive": int(spec.passive),
                "passive_seeds": " ".join(str(x) for x in spec.read_passive_seeds()),
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


def _read_part_units(f: Path) -> list[tuple[int, int]]:
    import netCDF4

    try:
        with netCDF4.Dataset(f, "r") as ds:
            return [(int(e), int(s)) for e, s in zip(ds["unit_episode"][:], ds["unit_seed"][:])]
    except (OSError, KeyError, IndexError) as exc:  # renamed parts are whole; this is corruption
        raise CubeError(f"cannot read part {f}: {exc}; delete it to recompute its units") from exc


