"""Cube writing, crash safety and lazy reading (real netCDF4 files)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from conftest import kill9_when
from synclib.cube import (
    EPISODE_COORDS, CubeError, CubeSpec, CubeWriter, IncompleteCubeError, Unit,
    bitround, is_complete, open_cube, parts_dir,
)

REPO = Path(__file__).resolve().parents[1]


def make_spec(**kw) -> CubeSpec:
    eps = [dict(task_index=i, env_id=f"env{i}", codename=f"code{i}", source="social_iqa",
                relationship=i % 6, agent1_id=f"p{i}", agent2_id=f"q{i}",
                agent1_name=f"Ann {i}", agent2_name=f"Bob {i}") for i in (4, 9, 2)]
    args = dict(episodes=eps, seeds=[0, 1], n_rounds=3, n_layers_a=3, d_model_a=8,
                n_layers_b=2, d_model_b=5, attrs=dict(model_a="ma", model_b="mb", temperature=0.7))
    args.update(kw)
    return CubeSpec(**args)


def make_unit(spec: CubeSpec, e: int, s: int) -> Unit:
    """A unit whose content depends only on (e, s); rounds >= 2 unreached."""
    rng = np.random.default_rng(1000 * e + s)
    u = Unit.empty(spec, e, s)
    reached = 2
    u.values["hidden_a"][:reached] = rng.standard_normal((reached, spec.n_layers_a, spec.d_model_a))
    u.values["hidden_b"][:reached - 1] = rng.standard_normal((reached - 1, spec.n_layers_b, spec.d_model_b))
    u.values["text_a"][:reached] = [f"a{e}.{s}.{k} é" for k in range(reached)]
    u.values["text_b"][:reached - 1] = [f"b{e}.{s}"]
    u.values["prompt_len_a"][:reached] = [100 + e, 200 + s]
    u.values["prompt_len_b"][:reached - 1] = [150]
    u.values["n_utterances"][...] = 3
    if spec.passive:
        u.values["hidden_a_passive"][:reached] = rng.standard_normal((reached, spec.n_layers_a, spec.d_model_a))
    if spec.tom:
        p = rng.random((reached, len(spec.emotions)))
        u.values["emotion_a"][:reached] = p / p.sum(-1, keepdims=True)
    return u


def write_all(path, spec, batch=2):
    w = CubeWriter(path, spec)
    units = [make_unit(spec, e, s) for e, s in spec.units()]
    for i in range(0, len(units), batch):
        w.write_part(i // batch, units[i:i + batch])
    return w.finalize()


def test_schema_coords_attrs_and_nan(tmp_path):
    spec = make_spec(passive=True, tom=True, emotions=["Joy", "Fear"], actions=["Assertive", "Directive"])
    path = write_all(tmp_path / "pair.nc", spec)
    assert not parts_dir(path).exists()
    ds = open_cube(path)
    assert ds.hidden_a.dims == ("episode", "sim_seed", "round", "layer_a", "dim_a")
    assert ds.hidden_b.dims == ("episode", "sim_seed", "round", "layer_b", "dim_b")
    assert ds.hidden_a.shape == (3, 2, 3, 3, 8) and ds.hidden_b.shape == (3, 2, 3, 2, 5)
    for name in ("hidden_a_passive", "hidden_b_passive", "hidden_a_tom", "text_b_tom",
                 "emotion_a", "action_b", "n_utterances_tom"):
        assert name in ds
    assert ds.emotion_a.dims[-1] == "emotion" and list(ds.emotion.values) == ["Joy", "Fear"]
    assert list(ds.episode.values) == [4, 9, 2] and list(ds.sim_seed.values) == [0, 1]
    for c in EPISODE_COORDS:
        assert c in ds.coords
    assert list(ds.codename.values) == ["code4", "code9", "code2"]
    assert ds.agent2_name.sel(episode=9).item() == "Bob 9"
    assert int(ds.relationship.sel(episode=9)) == 3
    for k in ("model_a", "model_b", "n_layers_a", "d_model_a", "n_layers_b", "d_model_b",
              "temperature", "store_dtype", "complete"):
        assert k in ds.attrs
    assert ds.attrs["n_layers_b"] == 2 and ds.attrs["store_dtype"] == "float32"
    # values and "unreached" fills
    u = make_unit(spec, 9, 1)
    h = ds.hidden_a.sel(episode=9, sim_seed=1).values
    np.testing.assert_array_equal(h[:2], u.values["hidden_a"][:2])
    assert np.isnan(h[2]).all()
    assert np.isnan(ds.hidden_b.sel(episode=9, sim_seed=1).values[1:]).all()
    assert np.isnan(ds.hidden_a_tom.values).all()
    assert list(ds.text_a.sel(episode=9, sim_seed=1).values) == ["a9.1.0 é", "a9.1.1 é", ""]
    assert list(ds.prompt_len_a.sel(episode=9, sim_seed=1).values) == [109, 201, -1]
    assert ds.prompt_len_a.dtype == np.int32
    np.testing.assert_allclose(ds.emotion_a.sel(episode=2, sim_seed=0).values[:2].sum(-1), 1, rtol=1e-6)


def test_lazy_dask_and_chunks(tmp_path):
    path = write_all(tmp_path / "c.nc", make_spec())
    ds = open_cube(path)
    import dask.array as da

    assert isinstance(ds.hidden_a.data, da.Array)
    assert ds.hidden_a.data.chunksize == (1, 1, 3, 3, 8)
    ds2 = open_cube(path, chunks={"episode": 3, "sim_seed": 2})
    assert ds2.hidden_a.data.chunksize[:2] == (3, 2)
    mean = ds2.hidden_a.mean(("episode", "sim_seed", "round")).compute()
    assert mean.shape == (3, 8) and np.isfinite(mean.values).all()
    eager = open_cube(path, chunks=None)
    assert isinstance(eager.hidden_a.data, np.ndarray)
    # on-disk compression and chunking
    import netCDF4

    with netCDF4.Dataset(path) as nc:
        assert nc["hidden_a"].filters()["zlib"] and nc["hidden_a"].chunking() == [1, 1, 3, 3, 8]


def test_bitround_error_bound_and_specials():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100_000) * 10.0 ** rng.integers(-6, 6, 100_000)).astype(np.float32)
    x[:3] = [np.nan, np.inf, -np.inf]
    for keep, bound in ((10, 2.0 ** -11), (7, 2.0 ** -8)):
        y = bitround(x, keep)
        assert y.dtype == np.float32
        assert np.isnan(y[0]) and y[1] == np.inf and y[2] == -np.inf
        rel = np.abs(y[3:] - x[3:]) / np.abs(x[3:])
        assert rel.max() <= bound
        # low mantissa bits are zero
        assert (y[3:].view(np.uint32) & np.uint32((1 << (23 - keep)) - 1)).max() == 0
    # large activations survive (a float16 cast would overflow to inf)
    big = np.array([1e5, -3e6], dtype=np.float32)
    assert np.isfinite(bitround(big, 10)).all()
    np.testing.assert_array_equal(bitround(x, None)[3:], x[3:])


def test_float16_store(tmp_path):
    spec32, spec16 = make_spec(), make_spec(store_dtype="float16")
    ds32 = open_cube(write_all(tmp_path / "a.nc", spec32), chunks=None)
    ds16 = open_cube(write_all(tmp_path / "b.nc", spec16), chunks=None)
    assert ds16.attrs["store_dtype"] == "float16"
    a, b = ds32.hidden_a.values, ds16.hidden_a.values
    fin = np.isfinite(a)
    assert (np.isnan(b) == ~fin).all()
    rel = np.abs(b[fin] - a[fin]) / np.abs(a[fin])
    assert 0 < rel.max() <= 2.0 ** -11


def test_bad_store_dtype_and_bad_unit_shape(tmp_path):
    with pytest.raises(CubeError, match="store_dtype"):
        make_spec(store_dtype="int8")
    spec = make_spec()
    w = CubeWriter(tmp_path / "x.nc", spec)
    u = Unit.empty(spec, 4, 0)
    u.values["hidden_a"] = np.zeros((3, 3, 7), np.float32)
    with pytest.raises(CubeError, match="hidden_a has shape"):
        w.write_part(0, [u])


def test_partial_file_refused_and_resume_state(tmp_path):
    spec = make_spec()
    path = tmp_path / "p.nc"
    w = CubeWriter(path, spec)
    w.write_part(0, [make_unit(spec, 4, 0), make_unit(spec, 4, 1)])
    with pytest.raises(IncompleteCubeError, match="resume"):
        open_cube(path)
    with pytest.raises(CubeError, match="missing"):
        w.finalize()
    # a leftover temporary file (crash during consolidation) is no cube either
    Path(str(path) + ".tmp").write_bytes(b"CDF\x01 partial")
    with pytest.raises(IncompleteCubeError, match="interrupted"):
        open_cube(path)
    with pytest.raises(IncompleteCubeError):
        open_cube(str(path) + ".tmp")
    with pytest.raises(FileNotFoundError):
        open_cube(tmp_path / "nothing.nc")
    # an HDF5/netCDF file without complete=1
    xr.Dataset({"hidden_a": ("x", np.zeros(3))}).to_netcdf(tmp_path / "foreign.nc")
    with pytest.raises(IncompleteCubeError, match="complete=1"):
        open_cube(tmp_path / "foreign.nc")
    assert not is_complete(tmp_path / "foreign.nc")
    # a new writer sees the finished units and a stale part temp file is ignored
    (parts_dir(path) / "part-00009.nc.tmp").write_bytes(b"garbage")
    w2 = CubeWriter(path, spec)
    assert w2.done == {(4, 0), (4, 1)}
    assert not (parts_dir(path) / "part-00009.nc.tmp").exists()
    # different settings cannot resume these parts
    with pytest.raises(CubeError, match="different settings.*attrs.temperature"):
        CubeWriter(path, make_spec(attrs=dict(model_a="ma", model_b="mb", temperature=1.0)))
    for i, (e, s) in enumerate(u for u in spec.units() if u not in w2.done):
        w2.write_part(10 + i, [make_unit(spec, e, s)])
    w2.finalize()
    assert is_complete(path)
    with pytest.raises(CubeError, match="already a finished cube"):
        CubeWriter(path, spec)


def test_parts_written_in_the_background_in_any_order_and_their_errors_reach_the_caller(tmp_path, monkeypatch):
    """submit_part writes a part in a background thread (one at a time): parts count once
    complete, in whatever order their ids come; an error in the thread is re-raised, with its
    message, at the next submit_part (which then writes nothing) or at finalize; the parts
    written before it survive, and a new writer resumes with exactly the missing ones."""
    spec = make_spec()
    path = tmp_path / "bg.nc"
    units = {u: make_unit(spec, *u) for u in spec.units()}  # six units: (4, 0) ... (2, 1)
    w = CubeWriter(path, spec)
    w.submit_part(5, [units[4, 0], units[4, 1]])
    w.submit_part(2, [units[9, 0]])  # waits for part 5 first
    w.wait()
    assert not w.writing and w.has_part(5) and w.has_part(2) and len(w.done) == 3
    real = CubeWriter.write_part

    def failing(self, part_id, us):
        if part_id == 7:
            raise OSError("no space left on device for part 7")
        return real(self, part_id, us)

    monkeypatch.setattr(CubeWriter, "write_part", failing)
    w.submit_part(7, [units[9, 1]])  # returns at once; the error comes with the next call
    with pytest.raises(OSError, match="no space left on device for part 7"):
        w.submit_part(8, [units[2, 0]])
    assert not w.has_part(7) and not w.has_part(8)
    w.submit_part(7, [units[9, 1]])
    with pytest.raises(OSError, match="part 7"):
        w.finalize()  # waits for the pending write, re-raises its error
    assert not path.exists()
    monkeypatch.undo()
    w2 = CubeWriter(path, spec)  # a resumed run sees exactly the parts written
    assert sorted(f.name for f in parts_dir(path).glob("part-*")) == ["part-00002.nc", "part-00005.nc"]
    assert w2.done == {(4, 0), (4, 1), (9, 0)}
    for i, u in enumerate(u for u in spec.units() if u not in w2.done):
        w2.submit_part(20 - i, [units[u]])
    assert w2.finalize() == path and is_complete(path)
    x, y = open_cube(path, chunks=None), open_cube(write_all(tmp_path / "ref.nc", spec), chunks=None)
    for name in x.data_vars:
        np.testing.assert_array_equal(x[name].values, y[name].values, err_msg=name)


_KILL_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    sys.path.insert(0, {here!r})
    from test_cube import make_spec, make_unit
    from synclib.cube import CubeWriter
    spec = make_spec()
    w = CubeWriter(sys.argv[1], spec)
    todo = [u for u in spec.units() if u not in w.done]
    for i, (e, s) in enumerate(todo):
        w.write_part(len(w.done) + 100 * i, [make_unit(spec, e, s)])
        print("part", flush=True)
        time.sleep(float(sys.argv[2]))
    w.finalize()
    print("done", flush=True)
""")


def test_kill9_then_resume_equals_uninterrupted(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(_KILL_SCRIPT.format(repo=str(REPO), here=str(Path(__file__).parent)))
    path = tmp_path / "k.nc"
    proc = subprocess.Popen([sys.executable, str(script), str(path), "30"], stdout=subprocess.PIPE, text=True)
    kill9_when(proc, lambda: proc.stdout.readline().strip() == "part")
    assert not path.exists()
    with pytest.raises(IncompleteCubeError):
        open_cube(path)
    done_before = CubeWriter(path, make_spec()).done
    assert len(done_before) == 1
    out = subprocess.run([sys.executable, str(script), str(path), "0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("part") == 5
    ref = write_all(tmp_path / "ref.nc", make_spec(), batch=3)
    a, b = open_cube(path, chunks=None), open_cube(ref, chunks=None)
    assert set(a.data_vars) == set(b.data_vars)
    for name in a.data_vars:
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
    xr.testing.assert_identical(a, b)


def test_var_name_is_the_one_spelling_of_the_schema():
    from synclib.cube import CubeError, CubeSpec, var_name

    assert var_name("hidden", "a") == "hidden_a"
    assert var_name("hidden", "b", "passive") == "hidden_b_passive"
    assert var_name("text", "a", "tom") == "text_a_tom"
    assert var_name("n_utterances") == "n_utterances" and var_name("n_utterances", view="tom") == "n_utterances_tom"
    assert var_name("emotion", "b", "tom") == "emotion_b" and var_name("tom_format", "a", "tom") == "tom_format_a"
    for bad in (("hidden", "c"), ("text", "a", "passive"), ("emotion", "a"), ("nope", "a"),
                ("n_utterances", "a"), ("hidden", "a", "other")):
        with pytest.raises(CubeError):
            var_name(*bad)
    ep = dict(task_index=0, env_id="e", codename="c", source="s", relationship=0, agent1_id="x",
              agent2_id="y", agent1_name="X", agent2_name="Y")
    spec = CubeSpec([ep], [0], 2, 2, 4, 3, 5, passive=True, tom=True, emotions=["Joy"], actions=["A"])
    names = set(spec.variables())
    expected = {var_name(k, s, v) for k in ("hidden", "text", "prompt_len") for s in "ab" for v in ("active", "tom")}
    expected |= {var_name("hidden", s, "passive") for s in "ab"} | {var_name("reader", view="passive")}
    expected |= {var_name(k, s, "tom") for k in ("emotion", "action", "tom_format") for s in "ab"}
    expected |= {var_name("n_utterances"), var_name("n_utterances", view="tom")}
    assert names == expected
