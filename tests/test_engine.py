"""synclib.engine: hooked states under padding, KV reuse, seeded sampling, word distributions."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

from reference_engine import word_distributions
from synclib.engine import Engine, Request, candidate_sequences, row_seed
from synclib.models import load_model

TOL = 1e-5


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return load_model(tiny_model_dir)


def solo(lm, prompt) -> tuple[np.ndarray, torch.Tensor]:
    """Every decoder block's output at the last token of ``prompt`` run alone, and its logits."""
    got = []
    hooks = [layer.register_forward_hook(
        lambda m, a, o: got.append((o[0] if isinstance(o, tuple) else o)[0, -1].float()))
        for layer in lm.decoder_layers]
    ids = lm.encode(prompt) if isinstance(prompt, str) else list(prompt)
    try:
        with torch.no_grad():
            out = lm.model(torch.tensor([ids], device=lm.device))
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(got).cpu().numpy(), out.logits[0, -1].float()


def dialog(lm, n_turns: int, filler: int = 0) -> str:
    """A synthetic growing dialog prompt; each call with more turns extends the previous one."""
    lines = ["Imagine you are Ann. Here is the context of this interaction:", "Scenario: a bake sale."]
    for t in range(n_turns):
        who = "Ann" if t % 2 == 0 else "Bob"
        lines.append(f"Turn {t}: {who} said: " + " ".join(["cake"] * (filler + t)))
    lines.append(f"Turn {n_turns}: {'Ann' if n_turns % 2 == 0 else 'Bob'} said:")
    return lm.chat_prompt("\n".join(lines))


def test_row_seed_stable_and_distinct():
    seeds = {row_seed(s, t, u) for s in range(3) for t in range(20) for u in range(16)}
    assert len(seeds) == 3 * 20 * 16
    assert row_seed(1, 2, 3) == row_seed(1, 2, 3) and 0 <= row_seed(1, 2, 3) < 2 ** 63


def test_states_under_left_padding_equal_solo_runs(lm):
    prompts = [dialog(lm, n, filler=f) for n, f in ((1, 0), (6, 3), (2, 9), (0, 0), (4, 1))]
    lengths = {len(lm.encode(p)) for p in prompts}
    assert len(lengths) == 5  # mixed lengths, so rows are padded
    for bs in (5, 2):
        states = Engine(lm, max_rows=bs, kv_reuse=False).read_states(prompts)
        assert states.shape == (5, lm.n_layers, lm.d_model) and states.dtype == np.float32
        for i, p in enumerate(prompts):
            np.testing.assert_allclose(states[i], solo(lm, p)[0], atol=TOL, rtol=0)
    np.testing.assert_allclose(Engine(lm, kv_reuse=False).read_states(prompts[:2]), states[:2], atol=TOL, rtol=0)


def test_kv_reuse_equals_a_fresh_read(lm):
    eng = Engine(lm, max_rows=3)
    sessions = ["a", "b", "c"]
    for n_turns in (1, 3, 5):
        prompts = [dialog(lm, n_turns, filler=f) for f in (0, 2, 5)]
        states = eng.read_states(prompts, sessions=sessions)
        for i, p in enumerate(prompts):
            np.testing.assert_allclose(states[i], solo(lm, p)[0], atol=TOL, rtol=0)
    assert eng.stats["reused_tokens"] > 0.5 * eng.stats["prefill_tokens"]
    assert eng.cached_sessions == 3
    eng.forget("a")
    assert eng.cached_sessions == 2


def test_kv_reuse_with_mixed_cached_and_fresh_rows(lm):
    """Rows with long, short and no cached prefix share one batch."""
    eng = Engine(lm, max_rows=4)
    eng.read_states([dialog(lm, 4, filler=6)], sessions=["long"])
    eng.read_states([dialog(lm, 1)], sessions=["short"])
    prompts = [dialog(lm, 6, filler=6), dialog(lm, 3), dialog(lm, 2, filler=1), dialog(lm, 0)]
    states = eng.read_states(prompts, sessions=["long", "short", None, "new"])
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(states[i], solo(lm, p)[0], atol=TOL, rtol=0)


def test_session_cache_budget_keeps_the_resident_sessions(lm):
    """Over budget a newcomer is not stored and the resident sessions stay: in the dialog
    loop's cycle (x, y, z, x, y, z, ...) two of three sessions keep being reused, where
    dropping the least recently used one would reuse none."""
    eng = Engine(lm, max_cache_bytes=1)  # nothing fits: every read is fresh, still correct
    p = dialog(lm, 2)
    eng.read_states([p], sessions=["x"])
    assert eng.cached_sessions == 0
    one = lm.n_layers * 2 * 2 * 16 * len(lm.encode(p)) * 4  # layers * (k, v) * heads * head_dim * tokens
    # blocks longer than the prompts: the sessions share no block, each holds its own copy
    # (sessions sharing blocks: tests/test_session_blocks.py)
    assert len(lm.encode(p + " ok")) < 128
    eng = Engine(lm, max_cache_bytes=int(2.5 * one), block_size=128)
    eng.read_states([p, p, p], sessions=["x", "y", "z"])
    assert eng.cached_sessions == 2 and eng.stats["cache_skips"] == 1
    reused = eng.stats["reused_tokens"]
    for name in ("x", "y", "z"):  # the next round, one turn longer (the cache stays in budget)
        np.testing.assert_allclose(eng.read_states([p + " ok"], sessions=[name])[0], solo(lm, p + " ok")[0],
                                   atol=TOL, rtol=0)
        eng.forget(name)
    shared = len(os.path.commonprefix([lm.encode(p), lm.encode(p + " ok")]))
    assert eng.stats["reused_tokens"] - reused == 2 * shared


def test_generation_is_seeded_per_row_not_per_batch(lm):
    prompts = [dialog(lm, n, filler=f) for n, f in ((1, 0), (5, 2), (2, 7))]
    reqs = [Request(p, seed=row_seed(0, i, 0)) for i, p in enumerate(prompts)]
    a = Engine(lm, max_rows=3).generate(reqs, max_new_tokens=12)
    b = Engine(lm, max_rows=1).generate(reqs[::-1], max_new_tokens=12)[::-1]
    c = Engine(lm, max_rows=3).generate(reqs, max_new_tokens=12)
    for x, y, z, p in zip(a, b, c, prompts):
        assert x.token_ids == y.token_ids == z.token_ids and x.text == y.text == z.text
        assert x.finish_reason == "length" and len(x.token_ids) == 12
        assert x.prompt_ids == lm.encode(p) and x.prompt_len == len(x.prompt_ids)
        np.testing.assert_allclose(x.states, solo(lm, p)[0], atol=TOL, rtol=0)
    other = Engine(lm).generate([dataclasses.replace(reqs[0], seed=row_seed(1, 0, 0))], max_new_tokens=12)
    assert other[0].token_ids != a[0].token_ids


def test_finished_rows_leave_a_cpu_batch_once_half_of_them_have_finished(lm, monkeypatch):
    """The CPU's growing batch compacts once half of its rows have finished
    (:meth:`DynamicRows.worth_keeping`), not at every finish, and the finished rows left in
    it change no other row's tokens: each row's reply is the one it gets alone."""
    from synclib.engine.dynamic import DynamicRows

    model = _stopper(lm)
    prompts = [dialog(lm, n, filler=f) for n, f in ((1, 0), (5, 2), (2, 7), (0, 0), (3, 1), (6, 4), (4, 0))]
    reqs = [Request(p, seed=row_seed(0, i, 0)) for i, p in enumerate(prompts)]
    args = dict(max_new_tokens=16, temperature=0.7, first_line_only=True)
    alone = [Engine(model, max_rows=1).generate([r], **args)[0] for r in reqs]
    leaves, keep = [], DynamicRows.keep

    def counted(self, pos):
        leaves.append((self.pre.mask.shape[0], len(pos)))  # (rows before, rows kept)
        return keep(self, pos)

    monkeypatch.setattr(DynamicRows, "keep", counted)
    got = Engine(model, max_rows=7).generate(reqs, **args)
    assert [r.token_ids for r in got] == [r.token_ids for r in alone]
    assert len({len(r.token_ids) for r in got}) >= 3  # the rows end at several steps
    assert leaves and all(kept <= rows // 2 for rows, kept in leaves)
    assert DynamicRows.worth_keeping(3, 7) and not DynamicRows.worth_keeping(4, 7)


def test_generation_tokens_follow_the_model(lm):
    """Greedy decoding in a padded batch with KV reuse equals step-by-step solo argmax."""
    eng = Engine(lm, max_rows=2)
    eng.read_states([dialog(lm, 1)], sessions=["s"])
    reqs = [Request(dialog(lm, 3), session="s"), Request(dialog(lm, 0, filler=3))]
    res = eng.generate(reqs, max_new_tokens=5, temperature=0)
    assert res[0].reused_tokens > 0 and res[1].reused_tokens == 0
    for r in res:
        ids = list(r.prompt_ids)
        for t in r.token_ids:
            assert int(solo(lm, ids)[1].argmax()) == t
            ids.append(t)


def test_stop_tokens_end_a_row(lm):
    p = dialog(lm, 2)
    first = int(solo(lm, p)[1].argmax())
    stopper = dataclasses.replace(lm, stop_token_ids=frozenset({first}))
    res = Engine(stopper).generate([Request(p), Request(dialog(lm, 4))], max_new_tokens=6, temperature=0)
    assert res[0].finish_reason == "stop" and res[0].token_ids == [] and res[0].text == ""
    assert len(res[1].token_ids) <= 6


def test_out_of_memory_halves_the_batch(lm, monkeypatch):
    real = lm.model.forward

    def forward(*args, **kwargs):
        if kwargs["input_ids"].shape[0] > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(lm.model, "forward", forward)
    prompts = [dialog(lm, n) for n in range(5)]
    eng = Engine(lm, max_rows=8)
    res = eng.generate([Request(p, seed=i) for i, p in enumerate(prompts)], max_new_tokens=3)
    assert eng.max_rows == 2 and eng.stats["oom_retries"] >= 1
    monkeypatch.setattr(lm.model, "forward", real)
    ref = Engine(lm, max_rows=1).generate([Request(p, seed=i) for i, p in enumerate(prompts)],
                                          max_new_tokens=3)
    assert [r.token_ids for r in res] == [r.token_ids for r in ref]


def test_word_distributions_single_token_is_restricted_softmax(lm):
    words = ["yes", "no", "maybe"]
    seqs = candidate_sequences(lm.tokenizer, words)
    assert all(len(v) == 1 for variants in seqs for v in variants)  # single-token words
    prompts = [dialog(lm, 1), dialog(lm, 4, filler=2)]
    probs, mass = word_distributions(lm, prompts, words, return_mass=True)
    for i, p in enumerate(prompts):
        sm = torch.softmax(solo(lm, p)[1], -1)
        raw = np.array([sum(float(sm[v[0]]) for v in variants) for variants in seqs])
        np.testing.assert_allclose(probs[i], raw / raw.sum(), rtol=1e-4)
        np.testing.assert_allclose(mass[i], raw.sum(), rtol=1e-4)


def test_word_distributions_multi_token_and_prefix_candidates(lm):
    """'-5' is two tokens under SmolLM2's digit splitting; '1' is a prefix of '10'."""
    cands = ["-5", "1", "10"]
    seqs = candidate_sequences(lm.tokenizer, cands)
    assert max(len(v) for v in seqs[0]) == 2 and seqs[2][0][:1] == seqs[1][0]
    p = dialog(lm, 2)
    probs, mass = word_distributions(lm, [p], cands, return_mass=True)
    ids = lm.encode(p)

    def seq_prob(s):
        out, ctx = 1.0, list(ids)
        for t in s:
            out *= float(torch.softmax(solo(lm, ctx)[1], -1)[t])
            ctx.append(t)
        return out

    all_p = {s: seq_prob(s) for variants in seqs for s in variants}
    expect = []
    for variants in seqs:
        total = 0.0
        for s in variants:
            longer = sum(q for t, q in all_p.items() if len(t) == len(s) + 1 and t[:len(s)] == s)
            total += max(0.0, all_p[s] - longer)
        expect.append(total)
    expect = np.array(expect)
    np.testing.assert_allclose(probs[0], expect / expect.sum(), rtol=1e-4)
    np.testing.assert_allclose(mass[0], expect.sum(), rtol=1e-4)
    with pytest.raises(ValueError, match="distinct"):
        word_distributions(lm, [p], ["a", "a"])


def test_sequence_logprobs_are_teacher_forced_and_share_a_session(lm):
    """Per-prompt candidate sequences of several tokens, rows re-using one primed session."""
    prompts = [dialog(lm, 3), dialog(lm, 3, filler=2)]
    ids = [lm.encode(p) for p in prompts]
    seqs = [[(11, 12, 13), (11,), (40, 41)], [(7,), (7, 8)]]
    eng = Engine(lm, max_rows=1)
    shared = 0
    while ids[0][shared] == ids[1][shared]:
        shared += 1
    eng.read_states([ids[0][:shared]], sessions=["prefix"])
    got = eng.sequence_logprobs(prompts, seqs, sessions=["prefix", "prefix"])
    assert eng.stats["reused_tokens"] >= shared
    for p_ids, row, lp in zip(ids, seqs, got):
        assert lp.dtype == np.float64 and lp.shape == (len(row),)
        want = []
        for seq in row:
            total, ctx = 0.0, list(p_ids)
            for t in seq:
                total += float(torch.log_softmax(solo(lm, ctx)[1], -1)[t])
                ctx.append(t)
            want.append(total)
        np.testing.assert_allclose(lp, want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"sequences\[0\]\[0\] is empty"):
        eng.sequence_logprobs(prompts[:1], [[()]])
    with pytest.raises(ValueError, match="sequences has 1 entries for 2 prompts"):
        eng.sequence_logprobs(prompts, [[(1,)]])


def _tiny(lm, kind: str, attn: str):
    """``lm`` with its weights replaced by a tiny random model of ``kind`` (sliding windows of
    16 tokens for mistral and gemma3), attention implementation ``attn``."""
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
                              MistralConfig, MistralForCausalLM)

    from synclib.models import find_decoder_layers

    common = dict(vocab_size=len(lm.tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, pad_token_id=lm.pad_token_id)
    cfg, cls = {
        "llama": (LlamaConfig(**common), LlamaForCausalLM),
        "mistral": (MistralConfig(**common, sliding_window=16), MistralForCausalLM),
        "gemma3": (Gemma3TextConfig(**common, head_dim=16, sliding_window=16,
                                    layer_types=["sliding_attention", "full_attention"]), Gemma3ForCausalLM),
    }[kind]
    torch.manual_seed(0)
    model = cls(cfg).eval()
    model.set_attn_implementation(attn)
    layers = find_decoder_layers(model)
    return dataclasses.replace(lm, model=model, decoder_layers=layers, n_layers=len(layers), d_model=64)


@pytest.mark.parametrize("kind", ["llama", "mistral", "gemma3"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_candidates_share_one_pass_per_batch_as_a_prefix_tree(lm, kind, attn, monkeypatch):
    """Candidates sharing prefixes (a three-level prefix tree), rows of different lengths
    (left padding), prompts far longer than the sliding window: one forward pass per batch of
    rows scores every candidate, and each score equals running ``prompt + seq`` alone."""
    from synclib.engine import candidates
    from synclib.engine.masks import attention_windows

    tiny = _tiny(lm, kind, attn)
    prompts = [dialog(tiny, 4, filler=f) for f in (0, 3, 1)]
    assert min(len(tiny.encode(p)) for p in prompts) > 6 * 16
    seqs = [[(11, 12, 13), (11, 12), (11, 14), (11,), (40, 41)], [(7,)], [(7, 8), (9, 8, 7, 6)]]
    eng = Engine(tiny, max_rows=2)
    got = eng.sequence_logprobs(prompts, seqs)
    # two batches of rows, each: one prefill and one pass over its candidates' prefix tree
    assert eng.stats["forward_calls"] == 4
    for p, row, lp in zip(prompts, seqs, got):
        want = []
        for seq in row:
            total, ctx = 0.0, tiny.encode(p)
            for t in seq:
                total += float(torch.log_softmax(solo(tiny, ctx)[1], -1)[t])
                ctx.append(t)
            want.append(total)
        np.testing.assert_allclose(lp, want, rtol=1e-4, atol=1e-4)
    # attention implementations that take no explicit mask get the per-prefix path: it agrees
    windows = attention_windows(tiny.model.config)
    assert windows == ({"full_attention": None} if kind == "llama" else
                       {"sliding_attention": 16} if kind == "mistral" else
                       {"full_attention": None, "sliding_attention": 16})
    monkeypatch.setattr(tiny.model.config, "_attn_implementation", "flash_attention_2")
    assert attention_windows(tiny.model.config) is None
    monkeypatch.undo()
    monkeypatch.setattr(candidates, "attention_windows", lambda config: None)
    per_prefix = Engine(tiny, max_rows=2)
    for a, b in zip(per_prefix.sequence_logprobs(prompts, seqs), got):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    assert per_prefix.stats["forward_calls"] > eng.stats["forward_calls"]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_cache_with_room_decodes_as_transformers_concatenation(lm, kind):
    """``with_room`` (decoding steps write into buffers instead of concatenating): the same
    keys, values and logits as transformers' own cache, step after step, through a row
    selection and past the room (the buffers move), with and without sliding windows."""
    import synclib.engine as E
    from synclib.engine.forward import forward

    tiny = _tiny(lm, kind, "sdpa")
    prompts = [tiny.encode(dialog(tiny, 4, filler=f)) for f in (0, 3)]
    eng = Engine(tiny, max_rows=2, kv_reuse=False)
    plain, pre = eng._prefill([(p, None) for p in prompts]), eng._prefill([(p, None) for p in prompts])
    E.with_room(pre.cache, 5)
    assert {type(x).__name__ for x in pre.cache.layers} == {"RoomyLayer"}
    caches, mask, pos = (plain.cache, pre.cache), pre.mask, pre.next_pos
    tok = pre.logits.argmax(-1)
    with torch.inference_mode():
        for step in range(8):
            if step == 3:  # the first row leaves the batch
                keep = torch.tensor([1])
                for c in caches:
                    c.batch_select_indices(keep)
                mask, pos, tok = mask[keep], pos[keep], tok[keep]
            mask = torch.cat([mask, mask.new_ones((len(tok), 1))], dim=1)
            logits = [forward(tiny.model, tok[:, None], mask, pos[:, None], c)[0][:, -1] for c in caches]
            torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-5)
            for a, b in zip(*(c.layers for c in caches)):
                assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
            tok, pos = logits[0].argmax(-1), pos + 1


def test_bad_arguments(lm):
    with pytest.raises(ValueError, match="max_rows"):
        Engine(lm, max_rows=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        Engine(lm).generate([Request("hi")], max_new_tokens=0)
    with pytest.raises(ValueError, match="sessions"):
        Engine(lm).read_states(["a", "b"], sessions=["x"])
    with pytest.raises(ValueError, match="empty prompt"):
        Engine(lm).read_states([[]])


@pytest.mark.slow
def test_smollm2_padding_and_kv_reuse_equal_solo():
    lm = load_model("smollm2-135m")
    eng = Engine(lm, max_rows=3)
    sessions = ["a", "b", "c"]
    for n_turns in (1, 3):
        prompts = [dialog(lm, n_turns, filler=f) for f in (0, 4, 11)]
        states = eng.read_states(prompts, sessions=sessions)
        for i, p in enumerate(prompts):
            ref = solo(lm, p)[0]
            err = np.abs(states[i] - ref).max() / np.abs(ref).max()
            assert err < 1e-4, (n_turns, i, err)
    assert eng.stats["reused_tokens"] > 0
    reqs = [Request(dialog(lm, 2), seed=row_seed(0, 0, 2)), Request(dialog(lm, 5), seed=row_seed(0, 1, 5))]
    a = Engine(lm, max_rows=2).generate(reqs, max_new_tokens=20)
    b = Engine(lm, max_rows=1).generate(reqs, max_new_tokens=20)
    assert [r.text for r in a] == [r.text for r in b] and all(r.text for r in a)


@pytest.mark.slow
def test_gemma3_gguf_fallback_format_and_sliding_window_states():
    """Gemma-3-270m (GGUF, no chat template, sliding window 512): prompts longer than the
    window, padded and with KV reuse, still give the states of a solo run."""
    lm = load_model("gemma3-270m")
    assert lm.model_type.startswith("gemma3") and not lm.has_chat_template
    text = lm.chat_prompt("Hi")
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert lm.encode(text).count(lm.tokenizer.bos_token_id) == 1
    window = lm.model.config.sliding_window
    eng = Engine(lm, max_rows=2)
    for n_turns in (2, 3):
        prompts = [dialog(lm, n_turns, filler=f) for f in (260, 100)]
        assert max(len(lm.encode(p)) for p in prompts) > window
        states = eng.read_states(prompts, sessions=["x", "y"])
        for i, p in enumerate(prompts):
            ref = solo(lm, p)[0]
            assert np.abs(states[i] - ref).max() / np.abs(ref).max() < 1e-4
    assert eng.stats["reused_tokens"] > 0


def test_out_of_memory_drops_session_caches_before_halving(lm, monkeypatch):
    prompts = [dialog(lm, n) for n in range(4)]
    eng = Engine(lm, max_rows=4)
    reqs = [Request(p, seed=i, session=i) for i, p in enumerate(prompts)]
    eng.generate(reqs, max_new_tokens=2)
    assert eng.cached_sessions == 4
    real = lm.model.forward
    calls = {"n": 0}

    def forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(lm.model, "forward", forward)
    longer = [Request(dialog(lm, n + 1), seed=i, session=i) for i, n in enumerate(range(4))]
    res = eng.generate(longer, max_new_tokens=3)
    monkeypatch.setattr(lm.model, "forward", real)
    # the caches went first; the batch kept its size
    assert eng.max_rows == 4 and eng.stats["oom_cache_drops"] == 1 and eng.stats["oom_retries"] == 1
    ref = Engine(lm, max_rows=4, kv_reuse=False).generate(
        [Request(r.prompt, seed=r.seed) for r in longer], max_new_tokens=3)
    assert [r.token_ids for r in res] == [r.token_ids for r in ref]


def test_first_line_only_keeps_the_first_line(lm, monkeypatch):
    from synclib.tasks.prompts import postprocess_reply

    # raise the line-break token's logit so that the random model writes several lines
    (nl,) = lm.tokenizer("\n", add_special_tokens=False)["input_ids"]
    real = lm.model.forward

    def forward(*args, **kwargs):
        out = real(*args, **kwargs)
        out.logits[..., nl] += 9.0
        return out

    monkeypatch.setattr(lm.model, "forward", forward)
    prompts = [dialog(lm, n) for n in range(6)]
    reqs = [Request(p, seed=100 + i) for i, p in enumerate(prompts)]
    full = Engine(lm, max_rows=3).generate(reqs, max_new_tokens=40, temperature=1.0)
    cut = Engine(lm, max_rows=3).generate(reqs, max_new_tokens=40, temperature=1.0, first_line_only=True)
    assert sum(r.finish_reason == "line" for r in cut) >= 3
    assert sum(r.text.strip().count("\n") for r in full) >= 6  # the full replies ran on for lines
    for a, b in zip(full, cut):
        assert postprocess_reply(a.text) == postprocess_reply(b.text)
        assert a.token_ids[:len(b.token_ids)] == b.token_ids
        if b.finish_reason == "line":
            assert b.token_ids[-1] == nl and b.text.strip() and len(b.token_ids) < len(a.token_ids)


@pytest.mark.parametrize("top_p", [None, 0.9, 0.5])
@pytest.mark.parametrize("top_k", [None, 50, 3])
def test_sampling_distribution_is_transformers_generate(top_k, top_p):
    """synclib's per-step distribution equals softmax of transformers' warped logits
    (temperature, then top-k, then top-p), to 1e-6, on random logits with ties."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from synclib.engine import sampling_distribution

    g = torch.Generator().manual_seed(7)
    logits = torch.randn(16, 500, generator=g) * 3
    logits[0, :10] = logits[0, 0]  # ties at the top
    logits[1] = torch.round(logits[1])  # many ties at the k-th value
    warpers = [TemperatureLogitsWarper(0.7)]
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p:
        warpers.append(TopPLogitsWarper(top_p))
    ref = torch.softmax(LogitsProcessorList(warpers)(None, logits.clone()), dim=-1).double()
    ours = sampling_distribution(logits, 0.7, top_k, top_p)
    assert torch.allclose(ours, ref, atol=1e-6, rtol=0)
    assert ((ours > 0) == (ref > 0)).all()  # the same tokens are kept
    if top_k or top_p:
        assert (ours == 0).any()


@pytest.mark.parametrize("top_k,top_p", [(None, None), (50, None), (None, 0.9), (3, 0.5)])
def test_sampling_in_kept_buffers_is_sampling_afresh(top_k, top_p):
    """The CPU's sampling steps work in buffers kept across steps, a chunk of rows at a time
    (engine.sampling.SampleWork): the same probabilities and the same tokens, bit for bit, as the
    distribution computed afresh over all rows at once, and a second step in the same buffers
    is not disturbed by the first."""
    from synclib.engine.sampling import SampleWork, sample, sampling_distribution

    g = torch.Generator().manual_seed(11)
    work = SampleWork(700, rows=3)  # 8 rows: chunks of 3, 3 and 2
    for _ in range(2):
        logits = torch.randn(8, 700, generator=g) * 3
        logits[2] = torch.round(logits[2])  # ties at the k-th value
        u = torch.rand(8, generator=g, dtype=torch.float64)
        for temperature in (0.7, 1.3):
            fresh = torch.softmax(logits.double() / temperature, dim=-1) if not (top_k or top_p) else None
            alone = sampling_distribution(logits, temperature, top_k, top_p)
            if fresh is not None:
                assert torch.equal(alone, fresh)
            in_work = sampling_distribution(logits[:3], temperature, top_k, top_p, work=work)
            assert torch.equal(in_work, alone[:3])
            cdf = alone.cumsum(-1)
            expect = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)
            assert torch.equal(sample(logits, u, (temperature, top_k, top_p), work), expect)
            assert torch.equal(sample(logits, u, (temperature, top_k, top_p)), expect)


def test_generation_config_sets_what_is_sampled(lm):
    """A model's generation_config top-k/top-p are what the reference's generate used."""
    import transformers

    from synclib.models import sampling_settings

    m = lm.model
    old = m.generation_config
    try:
        m.generation_config = transformers.GenerationConfig(top_p=0.9, temperature=0.6)
        assert sampling_settings(m) == {"top_k": 50, "top_p": 0.9}
        m.generation_config = transformers.GenerationConfig()
        assert sampling_settings(m) == {"top_k": 50, "top_p": 1.0}
    finally:
        m.generation_config = old


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_static_decoding_equals_the_dynamic_loop(lm, attn):
    """Preallocated keys/values and mask (the layout the CUDA graph replays) give the dynamic
    loop's logits to float rounding, hence its tokens, stops and line ends, with rows of
    different lengths, a session cache and stop tokens; finished rows stay in the batch."""
    prompts = [dialog(lm, n, filler=f) for n, f in ((1, 0), (5, 2), (2, 7), (0, 0), (3, 1))]
    first = [int(solo(lm, p)[1].argmax()) for p in prompts]
    stopper = dataclasses.replace(lm, stop_token_ids=frozenset(first[:2]))
    old = lm.model.config._attn_implementation
    lm.model.config._attn_implementation = attn
    try:
        for model, temperature in ((lm, 0.0), (lm, 0.7), (stopper, 0.7)):
            out = {}
            for mode in ("dynamic", "static"):
                eng = Engine(model, max_rows=5, decode=mode)
                assert eng.decode == mode
                reqs = [Request(p, seed=i, session=i) for i, p in enumerate(prompts)]
                eng.generate(reqs, max_new_tokens=3, temperature=temperature)  # fills the sessions
                out[mode] = eng.generate(reqs, max_new_tokens=20, temperature=temperature, first_line_only=True)
                assert sum(r.reused_tokens for r in out[mode]) > 0
            for a, b in zip(out["dynamic"], out["static"]):
                assert (a.token_ids, a.finish_reason, a.text) == (b.token_ids, b.finish_reason, b.text)
                np.testing.assert_array_equal(a.states, b.states)
    finally:
        lm.model.config._attn_implementation = old


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_a_missed_session_does_not_undo_the_batch_prefix_reuse(lm, mode):
    """A batch of rows that hit their session caches and one long row that missed its is
    prefilled in groups and merged for decoding: the hit rows reuse their prefixes, and
    tokens and states equal generation without any cache (float rounding of the padded
    batch aside: the same tokens, states to 1e-5)."""
    from synclib.engine.prefill import prefill_groups

    assert prefill_groups([1000] + [100] * 7) == [[0], list(range(1, 8))]
    assert prefill_groups([100, 90, 80]) == [[0, 1, 2]]
    short = [dialog(lm, 6, filler=f) for f in range(4)]
    miss = dialog(lm, 9, filler=12)
    eng = Engine(lm, max_rows=5, decode=mode)
    eng.read_states([dialog(lm, 5, filler=f) for f in range(4)], sessions=list(range(4)))
    reqs = [Request(p, seed=i, session=i) for i, p in enumerate(short)] + [Request(miss, seed=9, session="new")]
    got = eng.generate(reqs, max_new_tokens=12, temperature=0.7)
    ref = Engine(lm, max_rows=5, kv_reuse=False, decode=mode).generate(reqs, max_new_tokens=12, temperature=0.7)
    assert eng.stats["prefill_splits"] >= 1
    # the missed row reuses only the whole blocks its prompt's start shares with the others' (their header)
    size = eng.sessions.block_size
    head = max(len(os.path.commonprefix([lm.encode(miss), lm.encode(dialog(lm, 5, filler=f))])) for f in range(4))
    assert all(r.reused_tokens > 0 for r in got[:4])
    assert got[4].reused_tokens == eng.stats["shared_tokens"] == head // size * size
    for a, b in zip(got, ref):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.states, b.states, atol=TOL, rtol=0)


def test_fixed_slot_steps_match_a_solo_run(lm):
    """Each fixed-slot step's logits are those of the prompt plus the fed tokens run alone."""
    from synclib.engine.fixed import FixedSlots

    prompts = [dialog(lm, 4, filler=3), dialog(lm, 0)]
    eng = Engine(lm, max_rows=2, kv_reuse=False, decode="static")
    pre = eng._prefill([(lm.encode(p), None) for p in prompts])
    slots = FixedSlots(eng, capacity=2, steps=4, graph=False)
    pos = slots.add(pre)
    fed = [[], []]
    for step in range(4):
        tok = torch.tensor([7 + step, 11 + 2 * step])
        slots.feed(pos, tok)
        logits = slots.logits_of(pos).clone()
        for i, p in enumerate(prompts):
            fed[i].append(int(tok[i]))
            ref = solo(lm, lm.encode(p) + fed[i])[1]
            torch.testing.assert_close(logits[i], ref, atol=TOL, rtol=TOL)


def test_decode_mode_is_checked(lm):
    with pytest.raises(ValueError, match="decode must be one of"):
        Engine(lm, decode="fast")
    assert Engine(lm).decode == "dynamic"  # auto on the CPU


def _stopper(lm, share: int = 12, seed: int = 0):
    """``lm`` with a random twelfth of its vocabulary as stop tokens: replies of a random
    model then end after a few tokens, at different steps for different rows."""
    vocab = lm.model.config.vocab_size
    pick = np.random.default_rng(seed).choice(vocab, vocab // share, replace=False)
    return dataclasses.replace(lm, stop_token_ids=frozenset(int(t) for t in pick) | frozenset(lm.stop_token_ids))


@pytest.mark.parametrize("temperature, decode, attn", [(0.0, "dynamic", "sdpa"), (0.7, "dynamic", "sdpa"),
                                                       (0.7, "static", "sdpa"), (0.7, "static", "eager")])
def test_stream_rows_join_and_leave_and_generate_what_generate_does(lm, temperature, decode, attn, monkeypatch):
    """Continuous batching: rows submitted at different steps join the running batch and
    leave it as they end; each row's tokens, finish reason and states are generate's.
    ``decode="static"`` holds the rows in fixed slots (the layout a CUDA graph replays);
    its column room is rounded to 16 here, so a longer prompt re-allocates the slots
    mid-stream."""
    from synclib.engine.fixed import FixedSlots

    monkeypatch.setattr(FixedSlots, "ROUND", 16)
    monkeypatch.setattr(lm.model.config, "_attn_implementation", attn)
    model = _stopper(lm)
    prompts = [dialog(lm, n, filler=f) for n, f in ((1, 0), (5, 2), (2, 7), (0, 0), (3, 1), (6, 4), (4, 0))]
    reqs = [Request(p, seed=row_seed(0, i, 0), session=f"s{i}") for i, p in enumerate(prompts)]
    want = Engine(model, max_rows=7).generate(reqs, max_new_tokens=16, temperature=temperature,
                                              first_line_only=True)
    assert len({len(r.token_ids) for r in want}) > 1  # the rows end at different steps
    eng = Engine(model, max_rows=3)
    stream = eng.stream(max_new_tokens=16, temperature=temperature, first_line_only=True, join_min=1,
                        decode=decode)
    assert stream.decode == decode
    for i in range(3):
        stream.submit(i, reqs[i])
    got, steps, occupancy = {}, 0, []
    while len(stream):
        occupancy.append(min(len(stream), 3))
        for tag, res in stream.step():
            assert tag not in got
            got[tag] = res
        steps += 1
        if steps == 2:  # four more rows arrive while the first three decode
            for i in range(3, 7):
                stream.submit(i, reqs[i])
    assert sorted(got) == list(range(7))
    for i, w in enumerate(want):
        g = got[i]
        assert (g.token_ids, g.finish_reason, g.text, g.prompt_ids) == (w.token_ids, w.finish_reason, w.text,
                                                                       w.prompt_ids)
        np.testing.assert_allclose(g.states, w.states, atol=TOL, rtol=0)
    assert stream.stats["joins"] >= 3 and stream.stats["decode_steps"] == steps
    if decode == "static":  # the second wave's longer prompts outgrew the first slots' room
        assert eng.stats["slot_allocations"] >= 2
    assert stream.stats["generated_tokens"] == sum(len(r.token_ids) + (r.finish_reason == "stop") for r in want)
    # the sessions were stored: the next turn of the same dialogs re-uses their prompts
    again = eng.stream(max_new_tokens=4, temperature=temperature, join_min=1, decode=decode)
    for i, r in enumerate(reqs):
        again.submit(i, dataclasses.replace(r, prompt=r.prompt + " ok"))
    res = dict(again.run())
    assert all(res[i].reused_tokens > 0.8 * len(lm.encode(reqs[i].prompt)) for i in range(7))


def test_a_stream_not_refilled_makes_generates_batches_bit_for_bit(lm, monkeypatch):
    """``refill=False`` (what :meth:`Engine.generate` runs, and the simulation's ``"turns"``):
    rows queued in the engine's order join only an empty batch, ``capacity`` at a time (a row
    queued while a batch decodes waits for it), and each batch decodes to its last row, the
    ended rows staying until half have ended: every row's tokens, states and reuse are
    :meth:`Engine.generate`'s exactly, with the same forwards and steps; reads queued with no
    row decoding are :meth:`Engine.read_states`' exactly, ``max_rows`` a forward."""
    from synclib.engine.dynamic import DynamicRows

    model = _stopper(lm)
    prompts = [dialog(lm, n, filler=f) for n, f in ((1, 0), (5, 2), (2, 7), (0, 0), (3, 1), (6, 4), (4, 0))]
    reqs = [Request(p, seed=row_seed(0, i, 0), session=f"s{i}") for i, p in enumerate(prompts)]
    args = dict(max_new_tokens=16, temperature=0.7, first_line_only=True)
    leaves, keep = [], DynamicRows.keep

    def counted(self, pos):
        leaves.append((self.pre.mask.shape[0], len(pos)))  # (rows before, rows kept)
        return keep(self, pos)

    monkeypatch.setattr(DynamicRows, "keep", counted)
    ref = Engine(model, max_rows=3)
    ref.read_states(prompts[:2], sessions=["s0", "s1"])  # some rows re-use their sessions
    want = ref.generate(reqs, **args)
    want_leaves, leaves[:] = [(n, k) for n, k in leaves if k], []  # an emptied batch is dropped, nothing copied
    eng = Engine(model, max_rows=3)
    eng.read_states(prompts[:2], sessions=["s0", "s1"])
    stream = eng.stream(refill=False, **args)
    order = eng.order([lm.encode(p) for p in prompts], [r.session for r in reqs])
    assert order != sorted(order)  # the engine's order is not the requests'
    for i in order[:6]:
        stream.submit(i, reqs[i])
    got, steps = {}, 0
    while len(stream):
        got.update(stream.step())
        steps += 1
        if steps == 2:  # a row queued while a batch decodes waits for it to end
            stream.submit(order[6], reqs[order[6]])
        assert len(stream._rows) <= 3
    copies = [(n, k) for n, k in leaves if k]
    assert stream.stats["joins"] == 3 and copies == want_leaves and all(k <= n // 2 for n, k in copies)
    for i, w in enumerate(want):
        g = got[i]
        assert (g.token_ids, g.finish_reason, g.prompt_ids, g.reused_tokens) == (
            w.token_ids, w.finish_reason, w.prompt_ids, w.reused_tokens)
        np.testing.assert_array_equal(g.states, w.states)
    for key in ("forward_calls", "decode_steps", "generated_tokens", "prefill_tokens", "reused_tokens"):
        assert eng.stats[key] == ref.stats[key], key
    reads = [dialog(lm, n + 2, filler=3) for n in range(5)]
    want_states = ref.read_states(reads, sessions=[f"s{i}" for i in range(5)])
    ids = [lm.encode(p) for p in reads]
    for i in eng.order(ids, [f"s{i}" for i in range(5)]):
        stream.read(i, ids[i], f"s{i}")
    calls = eng.stats["forward_calls"]
    assert stream.run() == [] and eng.stats["forward_calls"] == calls + 2  # 3 + 2 reads
    got_reads = dict(stream.take_reads())
    for i in range(5):
        np.testing.assert_array_equal(got_reads[i], want_states[i])


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_stream_token_budget_sets_the_rows_in_flight(lm, decode, monkeypatch):
    """``kv_tokens``: rows join in order while their reserves (prompt + max_new_tokens - 1
    tokens each) fit; the reserved tokens never exceed the budget (except one over-long row
    alone), short prompts put more rows in flight than long ones, fixed slots are allocated
    for the rows in flight rather than the capacity, and every row still generates what
    generate does."""
    from synclib.engine.fixed import FixedSlots

    monkeypatch.setattr(FixedSlots, "SLOT_ROUND", 1)  # (8 would be all of them here)
    model = _stopper(lm)
    max_new = 8
    prompts = [dialog(lm, n, filler=f) for n, f in ((6, 4), (0, 0), (1, 0), (5, 2), (0, 1), (2, 7), (0, 2), (4, 0))]
    reqs = [Request(p, seed=row_seed(0, i, 0)) for i, p in enumerate(prompts)]
    want = Engine(model, max_rows=8).generate(reqs, max_new_tokens=max_new, temperature=0.7)
    reserve = [len(lm.encode(p)) + max_new - 1 for p in prompts]
    budget = max(reserve) + min(reserve)  # the longest row and one short one, or several short ones
    eng = Engine(model, max_rows=8)
    stream = eng.stream(max_new_tokens=max_new, temperature=0.7, capacity=8, join_min=1, decode=decode,
                        kv_tokens=budget)
    for i, r in enumerate(reqs):
        stream.submit(i, r)
    got, in_flight = {}, []
    while len(stream):
        out = stream.step()
        in_flight.append([r.tag for r in stream._rows] + [t for t, _ in out])
        assert stream._reserved <= budget
        got.update(out)
    for i, w in enumerate(want):
        assert got[i].token_ids == w.token_ids
        np.testing.assert_allclose(got[i].states, w.states, atol=TOL, rtol=0)
    assert 0 < stream.stats["kv_reserved_peak"] <= budget and stream.stats["over_budget"] == 0
    assert max(len(f) for f in in_flight) >= 2  # short rows share the budget
    assert all(sum(reserve[t] for t in f) <= budget for f in in_flight)
    assert stream._reserved == 0
    if decode == "static":  # the slots follow the rows in flight (by half at least), not the capacity of 8
        assert max(len(f) for f in in_flight) <= stream._batch.slots < 8
    # a row longer than the whole budget runs, alone
    alone = eng.stream(max_new_tokens=max_new, temperature=0.7, capacity=8, join_min=1, decode=decode,
                       kv_tokens=min(reserve) - 1)
    for i in (0, 1):
        alone.submit(i, reqs[i])
    res = []
    while len(alone):
        res += alone.step()
        assert len(alone._rows) <= 1
    assert dict(res)[0].token_ids == want[0].token_ids and alone.stats["over_budget"] == 2


def test_stream_checks_its_arguments(lm):
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        Engine(lm).stream(capacity=-1)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        Engine(lm).stream(max_new_tokens=0)
    with pytest.raises(ValueError, match="decode must be 'dynamic', 'static' or 'graph'"):
        Engine(lm).stream(decode="fast")
    with pytest.raises(ValueError, match="kv_tokens must be >= 1"):
        Engine(lm).stream(kv_tokens=0)
    assert Engine(lm).stream().decode == "dynamic"  # the engine's own mode on the CPU


@pytest.mark.parametrize("where", ["prefill", "slots"])
def test_stream_out_of_memory_drops_the_sessions_then_halves_the_join(lm, where, monkeypatch):
    """A join that runs out of memory (its prefill, or the fixed slots growing for a longer
    prompt) first drops the session caches and retries, then admits half the rows; the rows
    not admitted wait in the queue, and every row generates what generate does."""
    from synclib.engine.fixed import FixedSlots

    monkeypatch.setattr(FixedSlots, "ROUND", 16)
    prompts = [dialog(lm, n, filler=2) for n in range(6)]
    reqs = [Request(p, seed=row_seed(0, i, 0), session=f"s{i}") for i, p in enumerate(prompts)]
    want = Engine(lm, max_rows=6).generate(reqs, max_new_tokens=6, temperature=0.7)
    eng = Engine(lm, max_rows=6)
    for i, r in enumerate(reqs[:3]):  # the first turns' prompts, so that joins find sessions to drop
        eng.read_states([r.prompt], sessions=[r.session])
    if where == "prefill":
        real = lm.model.forward

        def forward(*args, **kwargs):
            if kwargs["input_ids"].shape[0] > 2 and kwargs["input_ids"].shape[1] > 1:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return real(*args, **kwargs)

        monkeypatch.setattr(lm.model, "forward", forward)
    else:
        real_allocate, failed = FixedSlots._allocate, []

        def allocate(self, T, like, *slots):
            if self.T and not failed:  # the first growth after the first join
                failed.append(T)
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return real_allocate(self, T, like, *slots)

        monkeypatch.setattr(FixedSlots, "_allocate", allocate)
    stream = eng.stream(max_new_tokens=6, temperature=0.7, capacity=6, join_min=1,
                        decode="dynamic" if where == "prefill" else "static")
    for i, r in enumerate(reqs):
        stream.submit(i, r)
        if where == "slots" and i == 0:
            stream.step()  # one row in the slots: the next, longer prompts make them grow
    got = dict(stream.run())
    for i, w in enumerate(want):
        assert (got[i].token_ids, got[i].finish_reason) == (w.token_ids, w.finish_reason)
        np.testing.assert_allclose(got[i].states, w.states, atol=TOL, rtol=0)
    assert eng.stats["oom_retries"] >= 1 and eng.stats["oom_cache_drops"] >= 1
    if where == "prefill":  # no sessions left to drop: the join was halved to the 2 rows that fit
        assert eng.stats["oom_retries"] > eng.stats["oom_cache_drops"] and stream.stats["joins"] >= 3
    else:
        assert failed and eng.stats["slot_allocations"] >= 2


def test_session_stores_copy_a_slice_of_the_batch(lm):
    """A stored session owns contiguous copies of its row's unpadded columns, block by block
    and its tail (not views that would keep the whole batch's cache alive), equal to the row
    run alone."""
    prompts = [dialog(lm, 1), dialog(lm, 4, filler=3)]
    eng = Engine(lm)
    eng.read_states(prompts, sessions=["short", "long"])
    alone = Engine(lm)
    alone.read_states([prompts[0]], sessions=["short"])
    short, ref = eng.sessions._sessions["short"], alone.sessions._sessions["short"]
    assert short.ids == lm.encode(prompts[0])
    n, size = len(short.ids), eng.sessions.block_size
    assert len(short.blocks) == n // size > 0 and short.tail[0].shape[3] == n % size > 0
    for x in [b.kv[0] for b in short.blocks] + [short.tail[0]]:
        assert x.is_contiguous() and x.untyped_storage().nbytes() == x.numel() * x.element_size()
    (kv,), (kv0,) = short.prefix(n), ref.prefix(n)  # one layer group: (L, 2, H, n, Dh)
    assert kv.shape == kv0.shape == (lm.n_layers, 2, kv.shape[2], n, kv.shape[4])
    torch.testing.assert_close(kv, kv0, atol=TOL, rtol=0)


@pytest.mark.parametrize("decode", ["dynamic", "static"])
def test_stream_reads_ride_with_the_joins_and_equal_read_states(lm, decode):
    """Prefill-only rows queued with :meth:`DecodeStream.read` are prefilled in the forward of
    the rows that join next (no forward of their own), their sessions stored as read_states
    stores them; their states are read_states', and the generation rows still generate what
    generate does."""
    prompts = [dialog(lm, n, filler=1) for n in range(4)]
    reads = [dialog(lm, n + 2, filler=3) for n in range(3)]
    reqs = [Request(p, seed=row_seed(0, i, 0), session=f"g{i}") for i, p in enumerate(prompts)]
    want = Engine(lm, max_rows=4).generate(reqs, max_new_tokens=5, temperature=0.7)
    ref = Engine(lm)
    want_states = ref.read_states(reads, sessions=[f"r{i}" for i in range(3)])
    eng = Engine(lm, max_rows=8)
    stream = eng.stream(max_new_tokens=5, temperature=0.7, capacity=4, join_min=1, decode=decode)
    for i in range(2):
        stream.submit(i, reqs[i])
    stream.read("r0", reads[0], "r0")
    stream.step()  # the first join: two rows and a read, one forward
    assert eng.stats["forward_calls"] == 2 and stream.stats["reads"] == 1 and stream.reads_waiting == 0
    got_reads = dict(stream.take_reads())
    assert list(got_reads) == ["r0"] and stream.take_reads() == []
    for i in (2, 3):
        stream.submit(i, reqs[i])
    stream.read("r1", reads[1], "r1")
    stream.read("r2", reads[2], "r2")
    got = dict(stream.step())
    got_reads.update(stream.take_reads())
    got.update(stream.run())
    assert stream.stats["joins"] == 2 and eng.stats["stream_reads"] == 3
    for i, w in enumerate(want):
        assert got[i].token_ids == w.token_ids
        np.testing.assert_allclose(got[i].states, w.states, atol=TOL, rtol=0)
    for i in range(3):
        np.testing.assert_allclose(got_reads[f"r{i}"], want_states[i], atol=TOL, rtol=0)
        assert eng.sessions._sessions[f"r{i}"].ids == lm.encode(reads[i])
    # reads with no row decoding are prefilled at the next step, alone
    stream.read("alone", reads[0] + " more", "r0")
    assert stream.reads_waiting == 1 and not len(stream)
    assert stream.run() == [] and [t for t, _ in stream.take_reads()] == ["alone"]
    assert eng.stats["reused_tokens"] > 0


@pytest.mark.parametrize("kind, decode", [("smollm2", "dynamic"), ("smollm2", "static"), ("gemma3", "dynamic")])
def test_stream_probes_score_what_sequence_logprobs_scores(lm, kind, decode, monkeypatch):
    """A row's :class:`Probe` is scored inside the stream over the row store's own keys/values:
    ``first`` after the prompt, ``then`` after the first generated token ``mark`` accepts
    (among the first ``within``), as :meth:`Engine.sequence_logprobs` scores the same prompts
    (to 1e-4 in float32), rows joining and leaving at different steps, fixed slots and a
    sliding window (the tiny Gemma-3's 16 tokens, prompts far longer) included.  Probes change
    nothing the rows generate, and a row whose reply has no marked token in time has no
    second score."""
    from synclib.engine import Probe
    from synclib.engine.fixed import FixedSlots

    monkeypatch.setattr(FixedSlots, "ROUND", 16)
    base = lm if kind == "smollm2" else _tiny(lm, kind, "sdpa")
    model = _stopper(base, share=20)
    prompts = [dialog(base, n, filler=f) for n, f in ((1, 0), (5, 2), (2, 7), (0, 0), (3, 1), (6, 4))]
    reqs = [Request(p, seed=row_seed(1, i, 0), session=f"s{i}") for i, p in enumerate(prompts)]
    first = ((11, 12, 13), (11, 12), (11,), (40, 41))
    then = ((7,), (7, 8), (9, 8, 7))
    marked = lambda t: t % 4 == 0  # noqa: E731 - about a quarter of the tokens open the second point
    probe = Probe(first=first, then=then, mark=marked, within=6)
    want = Engine(model, max_rows=6).generate(reqs, max_new_tokens=12, temperature=0.9)
    eng = Engine(model, max_rows=2)
    stream = eng.stream(max_new_tokens=12, temperature=0.9, capacity=3, join_min=1, decode=decode)
    for i, r in enumerate(reqs):
        stream.submit(i, r, probe=probe if i != 3 else None)
    from synclib.engine import stream as stream_module

    real, sizes = stream_module.score_points, []

    def score_points(model, view, points, pad, batch_size):  # the first forward of two points runs out of memory
        sizes.append(batch_size)
        if batch_size > 1 and len(sizes) == 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, view, points, pad, batch_size)

    monkeypatch.setattr(stream_module, "score_points", score_points)
    got = dict(stream.run())
    assert sizes[:2] == [2, 1] and stream.stats["probe_oom_retries"] == 1
    ref = Engine(model, kv_reuse=False)
    seconds = 0
    for i, w in enumerate(want):
        g = got[i]
        assert g.token_ids == w.token_ids
        if i == 3:
            assert g.scores == ()
            continue
        np.testing.assert_allclose(g.scores[0], ref.sequence_logprobs([g.prompt_ids], [first])[0], atol=1e-4)
        k = next((k for k, t in enumerate(g.token_ids[:6]) if marked(t)), None)
        if k is None:
            assert g.scores[1] is None
            continue
        seconds += 1
        ctx = g.prompt_ids + g.token_ids[:k + 1]
        np.testing.assert_allclose(g.scores[1], ref.sequence_logprobs([ctx], [then])[0], atol=1e-4)
    assert seconds >= 2  # some rows reached the second point, at different steps
    assert stream.stats["probe_points"] == 5 + seconds and eng.stats["probe_calls"] >= 1
    with pytest.raises(TypeError, match="probe must be a synclib.engine.Probe"):
        stream.submit(9, reqs[0], probe=first)
    with pytest.raises(ValueError, match=r"Probe.then needs Probe.mark"):
        Probe(first=first, then=then)
    with pytest.raises(ValueError, match=r"Probe.first\[0\] is empty"):
        Probe(first=((),))
