"""Reading a finished cube: lazy opening and hidden states as rows that may stream."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from synclib.cube.schema import CUBE_VERSION, CubeError, IncompleteCubeError, cube_version, is_complete, parts_dir

__all__ = ["open_cube", "HiddenRows", "DEFAULT_RESIDENT_BYTES", "READ_BATCH_BYTES"]


def open_cube(path: str | os.PathLike, chunks: dict | str | None = "native", **kwargs):
    """Open a finished cube lazily (dask arrays) with xarray.

    Parameters
    ----------
    path : path of the ``.nc`` file
    chunks : dask chunks, e.g. ``{"episode": 16}``; ``"native"``: the on-disk chunks (one unit each);
        ``None`` loads eagerly into numpy.
    **kwargs : passed to :func:`xarray.open_dataset`

    Returns
    -------
    xarray.Dataset
        Hidden states as dask arrays; the small variables (coordinates, texts, lengths, ToM) loaded.

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
    try:
        if chunks is None:
            ds = xr.open_dataset(path, engine="netcdf4", **kwargs).load()
        else:
            ds = xr.open_dataset(path, engine="netcdf4", chunks={} if chunks == "native" else chunks, **kwargs)
    except (OSError, ValueError, RuntimeError) as exc:
        raise CubeError(f"{path}: cannot be read as a cube ({exc}); re-run the simulation that writes it") from exc
    version = cube_version(ds.attrs.get("conventions", ""))
    if version > CUBE_VERSION:
        ds.close()
        raise CubeError(f"{path} is a synclib cube v{version}, written by a newer synclib; this one reads "
                        f"cubes up to v{CUBE_VERSION}: upgrade synclib")
    if chunks is None:
        return ds
    small = [n for n in ds.variables if not {"dim_a", "dim_b"} & set(ds[n].dims)]
    for n in small:
        ds[n] = ds[n].load()
    return ds


#: hidden-state variables up to this size are loaded whole; larger ones stream from disk
DEFAULT_RESIDENT_BYTES = 2 << 30
#: a streamed read fetches about this many bytes of chunks at a time
READ_BATCH_BYTES = 256 << 20


def _outer(a, index, axis: int):
    """``a`` indexed from ``axis`` on by ``index``, one axis at a time (outer indexing, which dask allows)."""
    for i in index:
        a = a[(slice(None),) * axis + (i,)]
        axis += isinstance(i, slice) or np.ndim(i) > 0
    return a


def _local(*arrays):
    """Compute dask arrays with threads in this process, even inside a ``dask.distributed`` task (the file is
    local to the worker)."""
    import dask

    return dask.compute(*arrays, scheduler="threads")


class HiddenRows:
    """One hidden-state variable of a cube as rows: ``(episode, sim_seed, round)`` -> ``(layer, dim)``, flattened
    in C order to ``shape = (E*S*R, L, D)``.

    A variable of at most ``max_resident_bytes`` (default :data:`DEFAULT_RESIDENT_BYTES`, 2 GiB) is loaded
    whole, once; a larger one (cube opened lazily) streams: :attr:`ok` is reduced chunk by chunk with dask and
    indexing reads only the on-disk chunks holding the requested rows.

    ``rows[idx]`` -> ``(len(idx), L, D)`` numpy in the stored dtype, ``idx`` an integer or 1-D integer array of
    flat rows (any order, repeats allowed); further indices select layers and dims, each on its own axis
    (outer indexing: ``rows[idx, 3]``, ``rows[idx, 2:5]``, ``rows[idx, [0, 2]]``).

    Raises
    ------
    CubeError
        if the variable is not 5-D ``(episode, sim_seed, round, layer, dim)`` floating point.
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
        """Rows of a streamed variable, read unit by unit (one chunk each) in batches of about
        :data:`READ_BATCH_BYTES`."""
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
