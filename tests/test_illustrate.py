"""synclib.figures.fig01_framework: figure 1 drawn from a run's own dialog, states and map."""
from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from book_fixtures import tiny_results
from synclib.analysis import results
from synclib.figures import fig01_framework


@pytest.fixture(scope="session")
def res(tmp_path_factory):
    return results.load_results(tiny_results(tmp_path_factory.getbasetemp()))


def test_figure1_is_the_runs_own_dialog_states_and_map(res):
    fig = fig01_framework.figure1(res, n_turns=3)
    info = fig.info
    assert info["run"] == res.example_run()
    with xr.open_dataset(res.run(info["run"]).cube) as cube:
        e = info["episode"]
        s = int(np.flatnonzero(cube["sim_seed"].values == info["sim_seed"])[0])
        # (1) the dialog's first utterances, as the cube stores them
        assert list(fig.turns["utterance"]) == [0, 1, 2]
        assert fig.turns["text"].iloc[1] == str(cube["text_b"].values[e, s, 0])
        assert fig.turns["speaker"].iloc[0] == str(cube["agent1_name"].values[e])
        n = int(cube["n_utterances"].values[e, s])
        assert n == int(cube["n_utterances"].values.max())  # a dialog that reached the limit (or the longest)
        # (2) every layer of both agents at each of their utterances
        for i, side in enumerate("ab"):
            a = fig.states[fig.states["agent"].str.endswith("(A)" if i == 0 else "(B)")]
            assert a["layer"].nunique() == cube.sizes[f"layer_{side}"]
            assert sorted(a["utterance"].unique()) == list(range(i, n, 2))
    # (3) the refitted map scores what the analysis scored for that layer pair and split
    assert info["r2"] == pytest.approx(info["analysis_r2"], abs=1e-3) and info["rounded_equal"]
    grid = res.analysis(info["run"])["r2_mean"].sel(condition="genuine", direction="A->B").values
    assert info["r2_mean"] == pytest.approx(np.nanmax(grid))
    assert len(fig.scatter) == info["n_test"] and np.isfinite(fig.scatter[["actual", "predicted"]]).all(axis=None)


def test_figure1_needs_the_cube(res, tmp_path):
    from dataclasses import replace

    run = res.runs[0]
    moved = results.Results(res.root, res.manifest, [replace(run, cube=tmp_path / "missing.nc")] + res.runs[1:])
    with pytest.raises(FileNotFoundError, match="cube of run"):
        fig01_framework.figure1(moved, run.name)
