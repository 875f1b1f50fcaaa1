"""synclib.analysis.tom: index arithmetic and decoding on a synthetic ToM cube."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import write_chunked_cube
from synthetic import Planted, Shapes, make_synthetic_cube
from synclib.analysis.tom import ToMError, kl_divergence, tom_dataset, tom_decode


@pytest.fixture(scope="module")
def cube():
    return make_synthetic_cube(n_episodes=60, n_seeds=2, n_rounds=5,
                               shapes=Shapes(layers_a=3, dim_a=16, layers_b=2, dim_b=16), coupling=0.8, seed=3,
                               planted=Planted(signal=4.0))


def test_kl_divergence_basics():
    p = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    assert np.allclose(kl_divergence(p, p), 0)
    q = np.array([[0.25, 0.25, 0.5]])
    assert np.isclose(kl_divergence(p[:1], q)[0], np.log(2))


def test_tom_dataset_index_arithmetic(cube):
    ha = cube.hidden_a_tom.values
    eb = cube.emotion_b.values
    ea = cube.emotion_a.values
    # partner_previous for reader A: hidden_a_tom[k] with emotion_b[k-1]
    X, P, ep = tom_dataset(cube, "A", "partner_previous", "emotion")
    e, s = 0, 0
    ok = [k for k in range(1, 5) if np.isfinite(ha[e, s, k]).all() and np.isfinite(eb[e, s, k - 1]).all()]
    rows = np.flatnonzero(ep == e)[: len(ok)]
    for r, k in zip(rows, ok):
        assert np.array_equal(X[r], ha[e, s, k]) and np.allclose(P[r], eb[e, s, k - 1])
    # partner_next for reader B: hidden_b_tom[k] with emotion_a[k+1]
    X, P, ep = tom_dataset(cube, "B", "partner_next", "emotion")
    hb = cube.hidden_b_tom.values
    ok = [k for k in range(4) if np.isfinite(hb[0, 0, k]).all() and np.isfinite(ea[0, 0, k + 1]).all()]
    for r, k in zip(np.flatnonzero(ep == 0)[: len(ok)], ok):
        assert np.array_equal(X[r], hb[0, 0, k]) and np.allclose(P[r], ea[0, 0, k + 1])
    assert np.isfinite(X).all() and np.allclose(P.sum(1), 1, atol=1e-5)


def test_decoding_beats_baseline_on_planted_states(cube):
    ds = tom_decode(cube, split_seeds=(0, 1), alphas=(1.0, 100.0))
    assert ds.tom_kl.dims == ("tom_target", "tom_relation", "agent", "split_seed", "tom_layer")
    best = ds.tom_kl_best_mean
    base = ds.tom_kl_baseline_mean
    # the speaker's own state is encoded: self decoding far below the baseline
    assert (best.sel(tom_relation="self_current") < 0.75 * base.sel(tom_relation="self_current")).all()
    # the partner's neighbouring states are correlated (AR coupling 0.8): above chance too
    assert (best.sel(tom_relation="partner_next") < base.sel(tom_relation="partner_next")).all()
    assert (ds.tom_n_train > ds.tom_n_test).all()


def test_missing_tom_variables_error():
    c = make_synthetic_cube(n_episodes=6, n_seeds=1, n_rounds=2,
                            shapes=Shapes(layers_a=2, dim_a=4, layers_b=2, dim_b=4), tom=False)
    with pytest.raises(ToMError, match="ToM variable"):
        tom_dataset(c, "A", "self_current", "emotion")


def test_streamed_states_in_layer_blocks_equal_in_memory(cube, tmp_path):
    """A lazily opened cube over the budget is probed in blocks of layers, same results."""
    lazy = write_chunked_cube(cube, tmp_path / "tom.nc")
    budget = lazy.hidden_a_tom.nbytes // 2  # streamed, read in blocks smaller than all layers
    ref = tom_decode(cube, split_seeds=(0,), alphas=(1.0, 100.0))
    got = tom_decode(lazy, split_seeds=(0,), alphas=(1.0, 100.0), max_resident_bytes=budget)
    for name in ref.data_vars:
        np.testing.assert_allclose(got[name].values, ref[name].values, rtol=1e-10, err_msg=name)


def test_tom_does_not_import_the_analysis():
    """No import cycle: the analysis' blocks use synclib.analysis.tom; tom needs only ridge (with its CV,
    ridge_cv), stats and cube (the package's __init__ loads nothing until a name is asked for)."""
    code = ("import sys, synclib.analysis.tom; "
            "print(sorted(m for m in sys.modules if m.startswith('synclib.analysis.')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "['synclib.analysis.ridge', 'synclib.analysis.ridge_cv', 'synclib.analysis.tom']", \
        out.stdout


def test_format_filter_drops_unformatted_targets_and_counts_them(cube):
    """Samples whose target utterance did not follow "Emotion. Action type." are dropped."""
    c = cube.copy()
    rng = np.random.default_rng(0)
    for side in "ab":
        reached = np.isfinite(c[f"emotion_{side}"].values).all(-1)
        fmt = np.where(reached, (rng.random(reached.shape) > 0.3).astype(np.int64), -1)
        c[f"tom_format_{side}"] = (("episode", "sim_seed", "round"), fmt)
    fb = c.tom_format_b.values
    # reader A, partner_next: target emotion_b[k]; the reader's own format does not matter
    X_all, _, _ = tom_dataset(cube, "A", "partner_next", "emotion")
    X, P, _ = tom_dataset(c, "A", "partner_next", "emotion")
    ha, eb = c.hidden_a_tom.values, c.emotion_b.values
    keep = [(e, s, k) for e in range(60) for s in range(2) for k in range(5)
            if np.isfinite(ha[e, s, k]).all() and np.isfinite(eb[e, s, k]).all()]
    assert len(X_all) == len(keep)
    kept = [t for t in keep if fb[t] == 1]
    assert len(X) == len(kept) < len(keep)
    for r, (e, s, k) in enumerate(kept):
        assert np.array_equal(X[r], ha[e, s, k]) and np.allclose(P[r], eb[e, s, k])
    ds = tom_decode(c, split_seeds=(0,), alphas=(1.0,))
    assert ds.tom_n_kept.dims == ("tom_target", "tom_relation", "agent")
    sel = dict(tom_target="emotion", tom_relation="partner_next", agent="A")
    assert int(ds.tom_n_kept.sel(**sel)) == len(kept)
    assert int(ds.tom_n_dropped.sel(**sel)) == len(keep) - len(kept)
    # self_current for reader B: the target is B's own utterance (tom_format_b)
    _, _, ep_self = tom_dataset(c, "B", "self_current", "action")
    sel = dict(tom_target="action", tom_relation="self_current", agent="B")
    assert int(ds.tom_n_kept.sel(**sel)) == len(ep_self)
    hb = c.hidden_b_tom.values
    n_self = sum(1 for e in range(60) for s in range(2) for k in range(5)
                 if np.isfinite(hb[e, s, k]).all() and fb[e, s, k] == 1)
    assert len(ep_self) == n_self
    assert ds.attrs["tom_format_filter"].startswith("applied")
    # a cube without the format variables: nothing dropped, and said so
    ds0 = tom_decode(cube, split_seeds=(0,), alphas=(1.0,))
    assert (ds0.tom_n_dropped == 0).all() and ds0.attrs["tom_format_filter"].startswith("not applied")
    assert int(ds0.tom_n_kept.sel(**sel)) > int(ds.tom_n_kept.sel(**sel))


def test_format_filter_off_decodes_every_sample_and_still_counts(cube):
    """format_filter=False (analysis.tom_format_filter: false): every sample is decoded, the
    counts still say how many followed the format, and the attribute says the filter is off."""
    c = cube.copy()
    rng = np.random.default_rng(1)
    for side in "ab":
        reached = np.isfinite(c[f"emotion_{side}"].values).all(-1)
        c[f"tom_format_{side}"] = (("episode", "sim_seed", "round"),
                                   np.where(reached, (rng.random(reached.shape) > 0.5).astype(np.int64), -1))
    on = tom_decode(c, split_seeds=(0,), alphas=(1.0,))
    off = tom_decode(c, split_seeds=(0,), alphas=(1.0,), format_filter=False)
    whole = tom_decode(cube, split_seeds=(0,), alphas=(1.0,))
    assert off.attrs["tom_format_filter"].startswith("not applied (format_filter=False)")
    assert (off.tom_n_kept == on.tom_n_kept).all() and (off.tom_n_dropped == on.tom_n_dropped).all()
    assert (off.tom_n_dropped > 0).any()
    # every sample enters: the same train/test counts as a cube without format variables
    assert (off.tom_n_train == whole.tom_n_train).all() and (off.tom_n_test == whole.tom_n_test).all()
    assert (on.tom_n_train < off.tom_n_train).any()


def test_emotion_and_action_probes_keep_their_own_sample_counts(cube):
    """An action distribution exists only where the reply generated a '.' to read it after, so
    the action probes can rest on fewer samples than the emotion probes; each keeps its own
    counts (they used to share one count, the action probes' overwriting the emotion ones')."""
    c = cube.copy()
    act = c.action_a.values.copy()
    act[: c.sizes["episode"] // 2] = np.nan  # half the episodes: no action distribution for agent A
    c["action_a"] = (c.action_a.dims, act)
    ds = tom_decode(c, split_seeds=(0,), alphas=(1.0,))
    assert ds.tom_n_train.dims == ("tom_target", "tom_relation", "agent", "split_seed")
    at = dict(tom_relation="self_current", agent="A", split_seed=0)
    n = {(k, t): int(ds[f"tom_n_{k}"].sel(tom_target=t, **at)) for k in ("train", "test")
         for t in ("emotion", "action")}
    # each count is its own probe's split of its own samples
    assert n["train", "action"] + n["test", "action"] == len(tom_dataset(c, "A", "self_current", "action")[2])
    assert n["train", "emotion"] + n["test", "emotion"] == len(tom_dataset(c, "A", "self_current", "emotion")[2])
    assert n["train", "action"] < 0.7 * n["train", "emotion"]
