"""The dialog loop, its cube, resume after kill -9, and the CLI.

Mechanics run on tiny Llama models built from a config with the SmolLM2
tokenizer (random weights); one slow test runs the embedded SmolLM2.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import kill9_when
from synclib import cli
from synclib.cli.argtypes import index_list as parse_index_list
from synclib.cube import IncompleteCubeError, open_cube, parts_dir
from synclib.simulate import Batching, Passes, RunOptions, Sampling, TomReadout, simulate
from synclib.tasks.prompts import ACTIONS, EMOTIONS, is_leave, postprocess_reply, render_prompt
from synclib.tasks.scenarios import load_tasks

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


# ----------------------------------------------------------------------------- models

def _build_tiny(path: Path, tok, *, layers: int, width: int, leave_word: str | None = None, seed: int = 0):
    """A random tiny Llama saved as a Hugging Face directory.

    With ``leave_word`` the last block's MLP output bias pushes the residual
    stream along dimension 0 and the output head maps that dimension to the
    word's token, so the model says that word whatever the prompt.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
                      mlp_bias=leave_word is not None)
    model = LlamaForCausalLM(cfg).eval()
    if leave_word is not None:
        (tid,) = tok(leave_word, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            model.model.layers[-1].mlp.down_proj.bias[0] = 1e4
            model.lm_head.weight[tid, 0] = 50.0
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tasks():
    return load_tasks("embedded")


def _fresh_states(lm, prompt: str) -> np.ndarray:
    """Every decoder block's output at the last token of ``prompt`` run alone (no padding)."""
    got = []
    hooks = [layer.register_forward_hook(
        lambda m, a, o: got.append((o[0] if isinstance(o, tuple) else o)[0, -1].float().cpu()))
        for layer in lm.decoder_layers]
    try:
        with torch.no_grad():
            lm.model(torch.tensor([lm.encode(prompt)], device=lm.device))
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(got).numpy()


# ----------------------------------------------------------------------------- pure parts

def test_parse_index_list():
    assert parse_index_list("0-3,7") == [0, 1, 2, 3, 7]
    assert parse_index_list("5") == [5]
    for bad in ("3-1", "a", "1,,2", "1,1", "-2"):
        with pytest.raises(ValueError):
            parse_index_list(bad)


# ----------------------------------------------------------------------------- CLI

def test_cli_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["simulate", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for opt in ("--model-a", "--model-b", "--scenarios", "--episodes", "--tasks", "--seeds", "--out",
                "--passive", "--tom", "--max-new-tokens", "--max-utterances", "--temperature",
                "--units-per-part", "--max-rows", "--max-in-flight", "--device", "--dtype", "--store-dtype", "--overwrite", "--no-progress"):
        assert opt in text, opt


def test_cli_dtype_defaults_to_the_run_configs_auto(tiny_models, tmp_path, monkeypatch):
    """`synclib simulate` and `synclib run` compute in the same dtype by default ("auto":
    bfloat16 on CPUs with native bf16 products), not float32 on every CPU."""
    import synclib.cli.simulate

    seen = {}
    monkeypatch.setattr(synclib.cli.simulate, "simulate", lambda *a, **k: seen.update(k) or str(tmp_path / "x.nc"))
    assert cli.main(["simulate", "--model-a", tiny_models[0], "--episodes", "1", "--out",
                     str(tmp_path / "x.nc"), "--no-progress"]) == 0
    assert seen["options"].dtype == "auto"
    from synclib.config import load_config

    assert load_config(None, [])["dtype"] == "auto"


@pytest.mark.parametrize("argv, needle", [
    (["--seeds", "a,b"], "--seeds"),
    (["--tasks", "5-1"], "--tasks"),
    (["--episodes", "0"], "--episodes"),
    (["--store-dtype", "int8"], "--store-dtype"),
    (["--max-new-tokens", "-3"], "--max-new-tokens"),
    (["--temperature", "-1"], "--temperature"),
    (["--episodes", "2", "--tasks", "1"], "not allowed with"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_cli_bad_options_name_the_option(argv, needle, capsys, tmp_path):
    base = ["simulate", "--model-a", "smollm2-135m", "--out", str(tmp_path / "x.nc")]
    with pytest.raises(SystemExit) as e:
        cli.main(base + argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["--tasks", "0,99999"], "--tasks: index 99999 out of range"),
    (["--episodes", "99999"], "--episodes"),
    (["--scenarios", "/nonexistent/dir"], "--scenarios"),
    (["--out-suffix"], "--out"),
])
def test_cli_bad_values_checked_before_loading(argv, needle, capsys, tmp_path):
    out = str(tmp_path / ("x.txt" if argv == ["--out-suffix"] else "x.nc"))
    argv = [] if argv == ["--out-suffix"] else argv
    rc = cli.main(["simulate", "--model-a", "no-such-model", "--out", out] + argv)
    assert rc == 2
    assert needle in capsys.readouterr().err


def test_cli_unknown_model_is_a_clear_error(capsys, tmp_path):
    rc = cli.main(["simulate", "--model-a", str(tmp_path / "missing-model"), "--episodes", "1",
                   "--out", str(tmp_path / "x.nc"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--model-a" in err and "missing-model" in err


# ----------------------------------------------------------------------------- ToM read-out

def test_tom_readout_at_the_generated_positions(tiny_model_dir, monkeypatch):
    """The ToM read-out rides its request as a probe: the emotion word is read at the reply's
    first position, the action word after the first generated "." (each equal to
    the reference word_distributions on those tokens); a reply without a "." in time has a NaN
    action row."""
    from reference_engine import word_distributions
    from synclib.engine import Engine, Request, Result
    from synclib.models import load_model

    lm = load_model(tiny_model_dir)
    (dot,) = lm.tokenizer(".", add_special_tokens=False)["input_ids"]
    real = lm.model.forward

    def forward(*args, **kwargs):  # "." likely, so that the replies hold one
        out = real(*args, **kwargs)
        out.logits[..., dot] += 8.0
        return out

    monkeypatch.setattr(lm.model, "forward", forward)
    prompts = [lm.chat_prompt(f"Imagine you are Ann.\nTurn 0: Ann said: cake{' cake' * i}\nTurn 1: Bob said:")
               for i in range(3)]
    tom = TomReadout(lm)
    st = Engine(lm, max_rows=3).stream(max_new_tokens=10, temperature=0.7)
    for i, p in enumerate(prompts):
        st.submit(i, Request(p, seed=i), tom.probe)
    res = dict(st.run())
    read = 0
    for i, p in enumerate(prompts):
        emo, act, formatted = tom.from_scores(res[i])
        np.testing.assert_allclose(emo, word_distributions(lm, [p], EMOTIONS)[0], rtol=1e-4, atol=1e-7)
        k = next((k for k, t in enumerate(res[i].token_ids[:tom.probe.within]) if tom.ends_emotion(t)), None)
        if k is None:
            assert np.isnan(act).all()
            continue
        read += 1
        np.testing.assert_allclose(act, word_distributions(lm, [lm.encode(p) + res[i].token_ids[:k + 1]], ACTIONS)[0],
                                   rtol=1e-4, atol=1e-7)
    assert read >= 2
    first, _ = res[0].scores
    no_dot = Result(text=" Joy. Assertive. Fine.", token_ids=[], prompt_ids=[], states=None, finish_reason="stop",
                    scores=(first, None))
    emo, act, formatted = tom.from_scores(no_dot)
    assert np.isnan(act).all() and np.isclose(emo.sum(), 1.0) and formatted == 1
    assert tom.from_scores(Result(text="cake", token_ids=[], prompt_ids=[], states=None, finish_reason="stop",
                                  scores=(first, None)))[2] == 0


# ----------------------------------------------------------------------------- the loop

SIM = dict(max_utterances=4, sampling=Sampling(max_new_tokens=6, temperature=0.7), batching=Batching(units_per_part=2),
           options=RunOptions(progress=False))
BOTH = Passes(passive=True, tom=True)


@pytest.fixture(scope="module")
def cube_ab(tiny_models, tasks, tmp_path_factory):
    """A (4x64) vs B (3x48) on tasks 0 and 3, seeds 0 and 2, with passive and ToM."""
    a, b = tiny_models
    out = tmp_path_factory.mktemp("cube") / "ab.nc"
    simulate(a, b, [tasks[i] for i in (0, 3)], [0, 2], out, passes=BOTH, **SIM)
    return out


def test_cube_schema_and_values(cube_ab, tiny_models, tasks):
    from synclib.models import load_model

    ds = open_cube(cube_ab)
    assert ds.hidden_a.shape == (2, 2, 2, 4, 64) and ds.hidden_b.shape == (2, 2, 2, 3, 48)
    assert list(ds.episode.values) == [0, 3] and list(ds.sim_seed.values) == [0, 2]
    assert ds.attrs["model_a"] == tiny_models[0] and ds.attrs["n_layers_b"] == 3
    assert ds.attrs["max_utterances"] == 4 and ds.attrs["max_new_tokens"] == 6
    assert ds.codename.sel(episode=3).item() == tasks[3].codename
    assert ds.agent2_name.sel(episode=3).item() == tasks[3].names[1]
    n = ds.n_utterances.values
    assert ((1 <= n) & (n <= 4)).all()
    lm_a, lm_b = load_model(tiny_models[0]), load_model(tiny_models[1])
    for e in (0, 3):
        for s in (0, 2):
            cell = ds.sel(episode=e, sim_seed=s)
            nu = int(cell.n_utterances)
            texts = [cell.text_a.values[t // 2] if t % 2 == 0 else cell.text_b.values[t // 2]
                     for t in range(nu)]
            # texts are post-processed replies and only the last may be a leave
            assert all(postprocess_reply(x) == x for x in texts)
            assert not any(is_leave(x, tasks[e], t) for t, x in enumerate(texts[:-1]))
            for t in range(nu):
                side, k = "ab"[t % 2], t // 2
                h = cell[f"hidden_{side}"].values[k]
                lm = (lm_a, lm_b)[t % 2]
                prompt = lm.chat_prompt(render_prompt(tasks[e], t % 2, texts[:t]))
                assert int(cell[f"prompt_len_{side}"].values[k]) == len(lm.encode(prompt))
                # batched, cache-reusing state == the prompt read alone
                np.testing.assert_allclose(h, _fresh_states(lm, prompt), rtol=1e-4, atol=1e-4)
                hp = cell[f"hidden_{side}_passive"].values[k]
                pprompt = lm.chat_prompt(render_prompt(tasks[e], t % 2, texts[:t], "passive"))
                np.testing.assert_allclose(hp, _fresh_states(lm, pprompt), rtol=1e-4, atol=1e-4)
            # unreached rounds are NaN / "" / -1
            ra, rb = (nu + 1) // 2, nu // 2
            assert np.isnan(cell.hidden_a.values[ra:]).all() and np.isnan(cell.hidden_b.values[rb:]).all()
            assert np.isnan(cell.hidden_a_passive.values[ra:]).all()
            assert (cell.prompt_len_a.values[ra:] == -1).all() and (cell.text_b.values[rb:] == "").all()
            assert np.isfinite(cell.hidden_a.values[:ra]).all() and np.isfinite(cell.hidden_b.values[:rb]).all()


def test_tom_variables(cube_ab):
    ds = open_cube(cube_ab, chunks=None)
    assert list(ds.emotion.values) == list(EMOTIONS) and ds.action_a.shape[-1] == 5
    nt = ds.n_utterances_tom.values
    for side, first in (("a", 0), ("b", 1)):
        reached = ds[f"prompt_len_{side}_tom"].values >= 0
        emo, act = ds[f"emotion_{side}"].values, ds[f"action_{side}"].values
        assert reached.any()
        np.testing.assert_allclose(emo[reached].sum(-1), 1, atol=1e-5)
        # the action word is read after the first generated "." (NaN where none came)
        act_read = np.isfinite(act).all(-1)
        assert not (act_read & ~reached).any()
        np.testing.assert_allclose(act[act_read].sum(-1), 1, atol=1e-5)
        assert (emo[reached] >= 0).all() and np.isnan(emo[~reached]).all()
        assert np.isfinite(ds[f"hidden_{side}_tom"].values[reached]).all()
        assert set(np.unique(ds[f"tom_format_{side}"].values[reached])) <= {0, 1}
    assert ((1 <= nt) & (nt <= 4)).all()
    # the ToM run is its own dialog, not a copy of the genuine one
    assert (ds.text_a_tom.values != ds.text_a.values).any()


def test_same_seeds_same_cube_and_other_seed_differs(cube_ab, tiny_models, tasks, tmp_path):
    a, b = tiny_models
    sel = [tasks[i] for i in (0, 3)]
    x = open_cube(cube_ab, chunks=None)
    out = tmp_path / "again.nc"
    simulate(a, b, sel, [0, 2], out, passes=BOTH, **SIM)
    y = open_cube(out, chunks=None)
    for name in x.data_vars:
        np.testing.assert_array_equal(x[name].values, y[name].values, err_msg=name)
    assert (x.text_a.sel(sim_seed=0).values != x.text_a.sel(sim_seed=2).values).any()
    # another batch size changes which rows share a batch, not the dialogs
    out4 = tmp_path / "batch4.nc"
    simulate(a, b, sel, [0, 2], out4, **{**SIM, "batching": Batching(units_per_part=4)})
    z = open_cube(out4, chunks=None)
    for name in ("text_a", "text_b", "prompt_len_a", "prompt_len_b", "n_utterances"):
        np.testing.assert_array_equal(x[name].values, z[name].values, err_msg=name)
    np.testing.assert_allclose(x.hidden_b.values, z.hidden_b.values, rtol=1e-4, atol=1e-4)


def test_tom_episodes_plays_the_tom_dialogs_of_the_first_tasks_only(cube_ab, tiny_models, tasks, tmp_path):
    """tom_episodes=1: the first task's ToM dialogs equal the full run's, the second task's
    are unreached (n_utterances_tom -1); the genuine dialogs do not change; engine_stats
    returns the engine counters (prefix reuse included)."""
    a, b = tiny_models
    out, stats = tmp_path / "tom1.nc", {}
    simulate(a, b, [tasks[i] for i in (0, 3)], [0, 2], out, passes=Passes(passive=True, tom=True, tom_episodes=1),
             **{**SIM, "options": RunOptions(progress=False, engine_stats=stats)})
    x, y = open_cube(cube_ab, chunks=None), open_cube(out, chunks=None)
    np.testing.assert_array_equal(x.text_a.values, y.text_a.values)
    np.testing.assert_array_equal(x.text_a_tom.values[0], y.text_a_tom.values[0])
    np.testing.assert_array_equal(x.hidden_a_tom.values[0], y.hidden_a_tom.values[0])
    assert (y.n_utterances_tom.values[1] == -1).all() and (y.n_utterances_tom.values[0] >= 1).all()
    assert np.isnan(y.hidden_a_tom.values[1]).all()
    assert stats["generated_tokens"] > 0 and stats["reused_tokens"] > 0 and stats["prefill_tokens"] > 0


def test_leave_ends_the_episode(tiny_models, tasks, tmp_path, smollm2_tokenizer):
    tok = smollm2_tokenizer
    leaver = _build_tiny(tmp_path / "leaver", tok, layers=2, width=32, leave_word=" left", seed=3)
    out = tmp_path / "leave.nc"
    simulate(tiny_models[0], str(leaver), [tasks[1], tasks[2]], [0], out, **SIM)
    ds = open_cube(out, chunks=None)
    assert (ds.n_utterances.values == 2).all()
    assert all(is_leave(t, tasks[e], 1) and "left" in t
               for e, t in zip(ds.episode.values, ds.text_b.values[:, 0, 0]))
    assert np.isfinite(ds.hidden_b.values[:, :, 0]).all() and np.isnan(ds.hidden_b.values[:, :, 1:]).all()
    assert np.isfinite(ds.hidden_a.values[:, :, 0]).all() and np.isnan(ds.hidden_a.values[:, :, 1:]).all()


def test_passive_reader_persona_and_seeds(tiny_models, tasks, tmp_path):
    """The passive reader reads only ``passive_seeds`` and is told it is the persona drawn
    for (task, seed), as the reference draws it; the cube records who."""
    from synclib.models import load_model
    from synclib.tasks.prompts import passive_persona

    a, b = tiny_models
    out = tmp_path / "p.nc"
    simulate(a, b, [tasks[i] for i in (1, 4)], [0, 2], out,
             passes=Passes(passive=True, passive_seeds=[2], taskset=tasks), **SIM)
    ds = open_cube(out, chunks=None)
    assert ds.attrs["conventions"].startswith("synclib cube v2")
    assert "random.Random" in ds.attrs["passive_persona_rule"] and ds.attrs["passive_seeds"] == "2"
    assert np.isnan(ds.hidden_a_passive.sel(sim_seed=0).values).all()
    assert (ds.passive_reader.sel(sim_seed=0).values == "").all()
    lm_a = load_model(a)
    for e in (1, 4):
        persona = passive_persona(tasks, e, 2)
        cell = ds.sel(episode=e, sim_seed=2)
        assert cell.passive_reader.item() == persona.pk
        prompt = lm_a.chat_prompt(render_prompt(tasks[e], 0, [], "passive", persona=persona))
        assert persona.name in prompt
        np.testing.assert_allclose(cell.hidden_a_passive.values[0], _fresh_states(lm_a, prompt),
                                   rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"Passes.passive_seeds \[1\] are not among the seeds \[0\]"):
        simulate(a, b, [tasks[0]], [0], tmp_path / "bad.nc", passes=Passes(passive=True, passive_seeds=[1]), **SIM)
    assert not (tmp_path / "bad.nc").exists()


@pytest.mark.parametrize("scheduling", ["turns", "continuous"])
def test_the_own_persona_reader_reads_the_same_dialogs_as_the_agent_it_replaces(tiny_models, tasks, tmp_path,
                                                                                scheduling):
    """``passive_own``: a second reader of the same dialogs, told it is the agent it replaces; its states are a
    fresh forward of that prompt (both agents' slots), while the drawn-persona reader's differ from it; the
    genuine dialogs and the drawn reader are those of a run without it."""
    from synclib.models import load_model

    a, b = tiny_models
    kw = {**SIM, "batching": Batching(units_per_part=2, scheduling=scheduling)}
    base, own = tmp_path / "base.nc", tmp_path / "own.nc"
    simulate(a, b, [tasks[1]], [0, 1], base, passes=Passes(passive=True, taskset=tasks), **kw)
    simulate(a, b, [tasks[1]], [0, 1], own, passes=Passes(passive=True, passive_own=True, taskset=tasks), **kw)
    x, y = open_cube(base, chunks=None), open_cube(own, chunks=None)
    assert "hidden_a_passive_own" not in x and "hidden_b_passive_own" in y
    np.testing.assert_array_equal(x.text_b.values, y.text_b.values)
    np.testing.assert_allclose(x.hidden_a_passive.values, y.hidden_a_passive.values, rtol=1e-4, atol=1e-4)
    lm_a, lm_b = load_model(a), load_model(b)
    cell = y.sel(episode=1, sim_seed=1)
    history = [str(cell.text_a.values[0])]
    for lm, agent, got, hist in ((lm_a, 0, cell.hidden_a_passive_own.values[0], []),
                                 (lm_b, 1, cell.hidden_b_passive_own.values[0], history)):
        prompt = lm.chat_prompt(render_prompt(tasks[1], agent, hist, "passive"))
        np.testing.assert_allclose(got, _fresh_states(lm, prompt), rtol=1e-4, atol=1e-4)
    assert not np.allclose(cell.hidden_a_passive_own.values[0], cell.hidden_a_passive.values[0], atol=1e-4)


def test_the_passive_seeds_rule_is_one_rule_in_every_spelling():
    """passive_seeds within seeds: one check (``check_passive_seeds``), raised by the config
    (naming the key), the cube (and, in the tests above, ``simulate`` and the command line)."""
    from synclib.config import ConfigError, load_config
    from synclib.cube import CubeError, CubeSpec, check_passive_seeds

    check_passive_seeds(None, [0])  # None: all seeds
    check_passive_seeds([0], [0, 1])
    with pytest.raises(ConfigError, match=r"simulate.passive_seeds=\[0, 2\]: simulate.passive_seeds \[2\] are not among "
                                          r"the seeds \[0, 1\] \(simulate.seeds\)"):
        load_config(None, ["simulate.seeds=[0, 1]", "simulate.passive_seeds=[0, 2]"])
    with pytest.raises(CubeError, match=r"passive_seeds \[2\] are not among the seeds \[0\]"):
        CubeSpec(episodes=[], seeds=[0], n_rounds=1, n_layers_a=1, d_model_a=1, n_layers_b=1, d_model_b=1,
                 passive=True, passive_seeds=[2])


def test_sampling_settings_recorded(tiny_models, tasks, tmp_path):
    """'model' resolves to the checkpoint's generation_config (transformers' top-k 50 where
    it sets none); the cube records what each agent sampled with and its prompt format."""
    from synclib.models import load_model
    from synclib.simulate import resolve_sampling

    lm = load_model(tiny_models[0])
    assert resolve_sampling(lm) == {"top_k": 50, "top_p": None}
    assert resolve_sampling(lm, top_k=None, top_p=0.9) == {"top_k": None, "top_p": 0.9}
    assert resolve_sampling(lm, top_k=7, top_p=1.0) == {"top_k": 7, "top_p": None}
    with pytest.raises(ValueError, match=r"Sampling.top_p must be .*got 1.5 \(config key simulate.top_p\)"):
        resolve_sampling(lm, top_p=1.5)  # the key's one rule
    out = tmp_path / "s.nc"
    simulate(tiny_models[0], tiny_models[1], [tasks[0]], [0], out,
             **{**SIM, "sampling": Sampling(max_new_tokens=6, top_k=5, top_p="model")})
    ds = open_cube(out, chunks=None)
    assert ds.attrs["top_k_a"] == 5 and ds.attrs["top_k_b"] == 5 and ds.attrs["top_p_a"] == 1.0
    assert ds.attrs["prompt_format_a"] == "chat_template" and ds.attrs["stop_at_first_line"] == 1


def test_newer_or_foreign_cube_is_refused_clearly(tmp_path, cube_ab):
    import shutil

    import netCDF4

    from synclib.cube import CubeError

    newer = tmp_path / "newer.nc"
    shutil.copy(cube_ab, newer)
    with netCDF4.Dataset(newer, "a") as ds:
        ds.conventions = "synclib cube v99 (see book/architecture.md)"
    with pytest.raises(CubeError, match="v99.*newer synclib"):
        open_cube(newer)
    truncated = tmp_path / "truncated.nc"
    truncated.write_bytes(Path(cube_ab).read_bytes()[:5000])
    with pytest.raises(CubeError, match="truncated.nc"):
        open_cube(truncated)
    foreign = tmp_path / "foreign.nc"
    with netCDF4.Dataset(foreign, "w") as ds:
        ds.createDimension("x", 2)
        ds.createVariable("x", "f4", ("x",))[:] = [1, 2]
    with pytest.raises(CubeError, match="foreign.nc.*not a finished cube"):
        open_cube(foreign)


_RUN = """
import sys
sys.path.insert(0, {repo!r})
from synclib.simulate import Batching, Passes, RunOptions, Sampling, simulate
from synclib.tasks.scenarios import load_tasks
t = load_tasks("embedded")
simulate({a!r}, {b!r}, [t[i] for i in (0, 3)], [0, 2], sys.argv[1], passes=Passes(passive=True, tom=True),
         max_utterances=4, sampling=Sampling(max_new_tokens=6, temperature=0.7), batching=Batching(units_per_part=2),
         options=RunOptions(progress=False))
print("finished", flush=True)
"""


@pytest.mark.long
def test_kill9_mid_run_then_resume_equals_uninterrupted(tiny_models, tmp_path):
    """A run killed after its first part and resumed writes the cube an uninterrupted run writes.

    The claim is bitwise equality *for the same numeric settings*: both runs are the same
    script in a subprocess with the same environment (one BLAS/OpenMP thread), so they take
    the same reduction orders.  A run under other thread settings may differ by float
    rounding (about 1e-7 relative in float32), which is not what this test is about.
    """
    script = tmp_path / "run.py"
    script.write_text(_RUN.format(repo=str(REPO), a=tiny_models[0], b=tiny_models[1]))
    out = tmp_path / "killed.nc"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    ref = tmp_path / "uninterrupted.nc"
    res = subprocess.run([PY, str(script), str(ref)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    proc = subprocess.Popen([PY, str(script), str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    kill9_when(proc, lambda: bool(list(parts_dir(out).glob("part-*.nc"))))
    assert not out.exists()
    with pytest.raises(IncompleteCubeError):
        open_cube(out)
    n_parts = len(list(parts_dir(out).glob("part-*.nc")))
    assert n_parts == 1
    res = subprocess.run([PY, str(script), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert not parts_dir(out).exists()
    x, y = open_cube(ref, chunks=None), open_cube(out, chunks=None)
    assert set(x.data_vars) == set(y.data_vars)
    for name in x.data_vars:
        np.testing.assert_array_equal(x[name].values, y[name].values, err_msg=name)


def test_same_model_loaded_once_and_cli_roundtrip(tiny_models, tmp_path, capsys):
    out = tmp_path / "cli.nc"
    rc = cli.main(["simulate", "--model-a", tiny_models[0], "--tasks", "2,4", "--seeds", "1",
                   "--out", str(out), "--max-utterances", "3", "--max-new-tokens", "4",
                   "--store-dtype", "float16", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    ds = open_cube(out)
    assert ds.attrs["model_a"] == ds.attrs["model_b"] == tiny_models[0]
    assert ds.attrs["store_dtype"] == "float16" and "hidden_a_passive" not in ds
    assert list(ds.episode.values) == [2, 4] and ds.hidden_a.shape[:3] == (2, 1, 2)
    bits = ds.hidden_a.values[np.isfinite(ds.hidden_a.values)].view(np.uint32)
    assert (bits & np.uint32((1 << 13) - 1)).max() == 0
    # a finished cube is left alone
    assert cli.main(["simulate", "--model-a", tiny_models[0], "--tasks", "2,4", "--seeds", "1",
                     "--out", str(out), "--no-progress"]) == 0
    assert "already a finished cube" in capsys.readouterr().err


@pytest.mark.slow
def test_end_to_end_smollm2_cli(tmp_path):
    out = tmp_path / "smol.nc"
    res = subprocess.run([PY, "-m", "synclib", "simulate", "--model-a", "smollm2-135m",
                          "--scenarios", "embedded", "--episodes", "2", "--seeds", "0",
                          "--max-utterances", "4", "--max-new-tokens", "12", "--passive",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr
    # (no bar: stderr is not a terminal.)  The engine passes the cache under the name the
    # installed transformers declares: no deprecation message of ours on any forward
    assert f"wrote {out}" in res.stderr and "deprecated" not in res.stderr.lower(), res.stderr
    ds = open_cube(out, chunks=None)
    assert ds.hidden_a.shape == (2, 1, 2, 30, 576)
    n = ds.n_utterances.values
    assert ((1 <= n) & (n <= 4)).all()
    assert np.isfinite(ds.hidden_a.values[:, :, 0]).all()
    assert all(len(t) > 0 for t in ds.text_a.values[:, 0, 0])
    reached = ds.prompt_len_a.values >= 0
    assert (ds.prompt_len_a.values[reached] > 300).all()
    assert np.isfinite(ds.hidden_a_passive.values[reached]).all()


@pytest.mark.parametrize("pair", ["A-B", "A-A"])
def test_continuous_scheduling_plays_the_same_dialogs(tiny_models, tasks, tmp_path, pair):
    """``scheduling="continuous"`` (each dialog's next utterance joins the running batch as
    soon as its reply ends) gives the turn-by-turn loop's cube: the same texts, lengths and
    prompts exactly, the same states and ToM distributions to float rounding (both read
    inside the streams, the rows batched differently).  Replies end
    at different steps (a random twelfth of the vocabulary stops them), so the batch mixes
    turns; with two models the two streams alternate."""
    import dataclasses

    from synclib.models import load_model

    def stopper(spec, seed):
        lm = load_model(spec)
        vocab = lm.model.config.vocab_size
        pick = np.random.default_rng(seed).choice(vocab, vocab // 12, replace=False)
        return dataclasses.replace(lm, stop_token_ids=frozenset(int(t) for t in pick) | frozenset(lm.stop_token_ids))

    a = stopper(tiny_models[0], 0)
    b = a if pair == "A-A" else stopper(tiny_models[1], 1)
    sel = [tasks[i] for i in (0, 1, 3, 5)]
    kw = dict(max_utterances=6, sampling=Sampling(max_new_tokens=12, temperature=0.7), passes=BOTH)
    cubes, stats = {}, {}
    for mode in ("turns", "continuous"):
        stats[mode] = {}
        path = simulate(a, b, sel, [0, 1], tmp_path / f"{mode}.nc",
                        batching=Batching(units_per_part=5, scheduling=mode),
                        options=RunOptions(progress=False, engine_stats=stats[mode]), **kw)
        cubes[mode] = open_cube(path, chunks=None)
    x, y = cubes["turns"], cubes["continuous"]
    lengths = np.array([len(t) for t in x.text_a.values.ravel() if t])
    assert lengths.min() < lengths.max()  # replies of different lengths
    for name in x.data_vars:
        if name.startswith(("hidden_", "emotion_", "action_")):
            np.testing.assert_allclose(x[name].values, y[name].values, rtol=1e-4, atol=1e-4, err_msg=name)
        else:
            np.testing.assert_array_equal(x[name].values, y[name].values, err_msg=name)
    assert stats["continuous"]["stream_joins"] > 0 and stats["turns"]["stream_joins"] > 0
    assert stats["continuous"]["reused_tokens"] > 0.5 * stats["turns"]["reused_tokens"]
    # one host read per decoding step; wall seconds per part of the loop (seconds_*)
    assert stats["continuous"]["host_reads"] == stats["continuous"]["decode_steps"] > 0
    parts = {"continuous": ("decode", "join", "probe", "cube"), "turns": ("decode", "join", "read", "probe", "cube")}
    for mode, names in parts.items():
        assert all(stats[mode][f"seconds_{n}"] > 0 for n in names), (mode, stats[mode])
    # the passive reader's prompts are read in the joins of their utterances' requests: one read a cell
    read = sum(int(np.isfinite(y[n].values).all(axis=(-2, -1)).sum()) for n in y.data_vars
               if n.startswith("hidden_") and n.endswith("passive"))
    assert stats["continuous"]["stream_reads"] == read == stats["turns"]["stream_reads"] > 0
    # the ToM replies are read inside the streams (probes), under both
    for mode in parts:
        assert stats[mode]["probe_points"] >= int(y.n_utterances_tom.values.sum())
    with pytest.raises(ValueError, match="Batching.scheduling must be one of 'turns', 'continuous', got 'fast' \(config key simulate.scheduling\)"):
        simulate(a, b, sel, [0], tmp_path / "bad.nc", batching=Batching(scheduling="fast"), **kw)


def test_a_small_session_budget_plays_the_same_dialogs(cube_ab, tiny_models, tasks, tmp_path):
    """With room for about one session (both models share the budget), every other session
    is recomputed from its prompt on its next turn: the same cube (texts exactly, states to
    float rounding), more prefill, and the recomputation counted."""
    a, b = tiny_models
    sel = [tasks[i] for i in (0, 3)]
    full, small = {}, {}
    x = open_cube(cube_ab, chunks=None)
    simulate(a, b, sel, [0, 2], tmp_path / "again.nc", passes=BOTH,
             **{**SIM, "options": RunOptions(progress=False, engine_stats=full)})
    out = tmp_path / "small.nc"
    simulate(a, b, sel, [0, 2], out, passes=BOTH, **{**SIM, "options": RunOptions(progress=False, engine_stats=small),
                                                     "batching": Batching(units_per_part=2, cache_gib=0.75 / 1024)})
    y = open_cube(out, chunks=None)
    for name in x.data_vars:
        if name.startswith(("hidden_", "emotion_", "action_")):
            np.testing.assert_allclose(x[name].values, y[name].values, rtol=1e-4, atol=1e-4, err_msg=name)
        else:
            np.testing.assert_array_equal(x[name].values, y[name].values, err_msg=name)
    assert full.get("cache_skips", 0) == 0 and full.get("recomputed_tokens", 0) == 0
    assert small["cache_skips"] > 0 and small["recomputed_tokens"] > 0
    assert small["prefill_tokens"] > full["prefill_tokens"] and small["reused_tokens"] < full["reused_tokens"]
    assert 0 < small["cache_peak_bytes"] <= int(0.75 * 2**20) < full["cache_peak_bytes"]
    with pytest.raises(ValueError, match="cache_gib must be 'auto' or a number >= 0"):
        simulate(a, b, sel, [0], tmp_path / "bad.nc", **{**SIM, "batching": Batching(cache_gib=-1)})


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_counts_utterances_and_its_plan_shrinks_to_the_truth(tiny_models, tasks, tmp_path, monkeypatch):
    """On a terminal the bar counts utterances generated and read (genuine, passive reader,
    ToM) of those planned; dialogs that end early shrink the plan, so the bar ends at
    done == total == the cube's utterances.  Off a terminal it prints nothing."""
    a, b = tiny_models
    sel = [tasks[i] for i in (0, 3, 5)]
    kw = {**SIM, "options": RunOptions(progress=True), "max_utterances": 6, "batching": Batching(units_per_part=3)}
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    out = simulate(a, b, sel, [0], tmp_path / "bar.nc", passes=Passes(passive=True, tom=True, tom_episodes=2), **kw)
    last = err.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    c = open_cube(out, chunks=None)
    n = int(c.n_utterances.sum()) * 2 + int(c.n_utterances_tom.where(c.n_utterances_tom > 0).sum())
    assert f" {n}/{n} " in last and "utt" in last, last
    assert n < len(sel) * 6 * 2 + 2 * 6 or (c.n_utterances == 6).all()  # the plan was an upper bound
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    simulate(a, b, sel[:1], [0], tmp_path / "quiet.nc", **kw)
    assert "quiet.nc" not in quiet.getvalue()


def test_trim_to_sentence():
    from synclib.tasks.prompts import trim_to_sentence

    assert trim_to_sentence("Hi there. I was going to") == "Hi there."
    assert trim_to_sentence('He said "fine." Then we') == 'He said "fine."'
    assert trim_to_sentence("Great! So, what") == "Great!"
    assert trim_to_sentence("It costs 3.5 euros and") == "It costs 3.5 euros and"  # no sentence end: unchanged
    assert trim_to_sentence("No end here") == "No end here"


@pytest.mark.slow
def test_reply_end_sentence_cuts_a_capped_reply_back_to_its_last_sentence(tmp_path, tasks):
    """SmolLM2 itself, 20 new tokens: a reply cut by the cap ends at its last complete sentence
    with reply_end='sentence'; the first utterance of a dialog is generated alike either way."""
    kw = dict(max_utterances=1, options=RunOptions(progress=False, dtype="float32", device="cpu"))
    sel = tasks[:6]
    cubes = {end: open_cube(simulate("smollm2-135m", "smollm2-135m", sel, [0], tmp_path / f"{end}.nc",
                                     sampling=Sampling(max_new_tokens=20, reply_end=end), **kw), chunks=None)
             for end in ("line", "sentence")}
    from synclib.tasks.prompts import trim_to_sentence

    line, sentence = (cubes[e].text_a.values[:, 0, 0] for e in ("line", "sentence"))
    assert all(s in (l, trim_to_sentence(l)) for l, s in zip(line, sentence))
    assert any(s != l for l, s in zip(line, sentence))  # at least one reply was cut back
    assert cubes["sentence"].attrs["reply_end"] == "sentence" and cubes["line"].attrs["reply_end"] == "line"
    with pytest.raises(ValueError, match="reply_end must be one of 'line', 'sentence'"):
        simulate("smollm2-135m", "smollm2-135m", sel, [0], tmp_path / "bad.nc",
                 sampling=Sampling(max_new_tokens=20, reply_end="word"), **kw)
