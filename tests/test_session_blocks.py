"""synclib.engine.sessions: session caches in a pool of shared, reference-counted blocks.

Two seeds of an episode start with the same prompt, and an agent's active and ToM views share
most of theirs: a session's prefill reuses the whole blocks any session stored, each block is
held (and budgeted) once, and what comes out equals an engine that shares nothing.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from synclib.engine import Engine, Request
from synclib.engine.prefill import gather_prefixes
from synclib.engine.sessions import SessionCache
from synclib.memory import CacheBudget
from synclib.models import load_model
from test_engine import TOL, _tiny, dialog, solo


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return load_model(tiny_model_dir)


def token_bytes(lm) -> int:
    """Bytes of one token's keys and values in every layer (float32)."""
    cfg = lm.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return lm.n_layers * 2 * cfg.num_key_value_heads * head_dim * 4


def whole_blocks(a: list, b: list, size: int) -> int:
    """Full blocks of ``size`` tokens two token sequences share from the start."""
    return len(os.path.commonprefix([a, b])) // size


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_a_second_seed_reuses_the_first_seeds_blocks_and_samples_as_without_sharing(lm, kind):
    """Seed 1 of a dialog prefills over the blocks seed 0 stored (whole blocks only), and the
    active view's sibling (the ToM view, a prompt that shares most of it) over the same
    blocks; tokens and states equal a fresh engine's (Gemma-3: a sliding window of 16 tokens
    on one layer, prompts far longer)."""
    tiny = _tiny(lm, kind, "sdpa")
    first = dialog(tiny, 6, filler=3)
    tom = first.replace("Turn 6: Ann said:", "Turn 6: How does Bob feel?")
    ids, size = tiny.encode(first), 32
    assert len(ids) > 4 * size and whole_blocks(ids, tiny.encode(tom), size) >= 3
    reqs = [Request(first, seed=10, session=("task", 0, "a", "active")),
            Request(first, seed=11, session=("task", 1, "a", "active"))]
    eng = Engine(tiny, block_size=size)
    got = [eng.generate([r], max_new_tokens=8)[0] for r in reqs]
    assert got[0].reused_tokens == 0 and got[1].reused_tokens == (len(ids) - 1) // size * size
    assert eng.stats["shared_tokens"] == got[1].reused_tokens
    assert eng.sessions.blocks == len(ids) // size == eng.sessions.shared_blocks
    states = eng.read_states([tom], sessions=[("task", 0, "a", "tom")])
    assert eng.stats["shared_tokens"] - got[1].reused_tokens == whole_blocks(ids, tiny.encode(tom), size) * size
    want = Engine(tiny, kv_reuse=False).generate(reqs, max_new_tokens=8)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        np.testing.assert_allclose(g.states, w.states, atol=TOL, rtol=0)
    np.testing.assert_allclose(states[0], solo(tiny, tom)[0], atol=TOL, rtol=0)
    # the next turn of seed 1 reuses its own entry (its common prefix, beyond the blocks)
    longer = Request(dialog(tiny, 7, filler=3), seed=12, session=reqs[1].session)
    again = eng.generate([longer], max_new_tokens=4)[0]
    assert again.reused_tokens == len(os.path.commonprefix([ids, tiny.encode(longer.prompt)]))
    assert again.token_ids == Engine(tiny, kv_reuse=False).generate([longer], max_new_tokens=4)[0].token_ids


def test_shared_blocks_are_held_and_budgeted_once(lm):
    """Two sessions sharing k full blocks hold them once; forgetting one gives back only its
    own blocks and tail and leaves the other's usable; forgetting both gives back everything.
    Two rows of one batch with the same prompt share their blocks too."""
    size, per_token = 32, token_bytes(lm)
    a, b = dialog(lm, 6, filler=3), dialog(lm, 7, filler=3)
    ia, ib = lm.encode(a), lm.encode(b)
    k = whole_blocks(ia, ib, size)
    assert k >= 3 and len(ia) % size and len(ib) % size
    budget = CacheBudget(1 << 30)
    eng = Engine(lm, max_cache_bytes=budget, block_size=size)
    eng.read_states([a], sessions=["a"])
    eng.read_states([b], sessions=["b"])
    assert eng.stats["shared_tokens"] == k * size
    unique = len(ia) + len(ib) - k * size
    assert eng.sessions.nbytes == budget.used == unique * per_token
    assert (eng.sessions.blocks, eng.sessions.shared_blocks) == (len(ia) // size + len(ib) // size - k, k)
    eng.forget("a")  # a's private blocks and tail go; the shared blocks stay for b
    assert budget.used == eng.sessions.nbytes == len(ib) * per_token and eng.sessions.shared_blocks == 0
    more = b + " Fine."
    np.testing.assert_allclose(eng.read_states([more], sessions=["b"])[0], solo(lm, more)[0], atol=TOL, rtol=0)
    assert eng.stats["reused_tokens"] - k * size == len(os.path.commonprefix([ib, lm.encode(more)]))
    eng.forget("b")
    assert budget.used == eng.sessions.nbytes == eng.sessions.blocks == len(eng.sessions) == 0
    eng.read_states([a, a], sessions=["s0", "s1"])  # one batch: the second row links the first's blocks
    assert eng.sessions.shared_blocks == eng.sessions.blocks == len(ia) // size
    assert budget.used == (len(ia) + len(ia) % size) * per_token
    eng.clear()
    assert budget.used == eng.sessions.nbytes == eng.sessions.blocks == 0


def test_a_budget_for_one_copy_stores_a_second_session_over_its_blocks(lm):
    """A budget that holds the shared blocks once, but not a second copy of them, still stores
    the second session: it takes only its tail and new blocks."""
    size, per_token = 32, token_bytes(lm)
    a, b = dialog(lm, 6, filler=3), dialog(lm, 7, filler=3)
    ia, ib = lm.encode(a), lm.encode(b)
    own_b = (len(ib) - whole_blocks(ia, ib, size) * size) * per_token
    budget = CacheBudget(len(ia) * per_token + own_b)
    assert (len(ia) + len(ib)) * per_token > budget.limit  # two copies would not fit
    eng = Engine(lm, max_cache_bytes=budget, block_size=size)
    eng.read_states([a], sessions=["a"])
    eng.read_states([b], sessions=["b"])
    assert len(eng.sessions) == 2 and eng.stats["cache_skips"] == 0 and budget.used == budget.limit
    eng.read_states([a], sessions=["c"])  # a third session of the same prompt needs only a tail
    assert eng.stats["cache_skips"] == 1 and len(eng.sessions) == 2  # no byte left for its tail
    assert budget.used == budget.limit


def test_blocks_are_keyed_by_their_whole_chain(lm):
    """Two prompts whose second block holds the same tokens after different first blocks share
    nothing (its keys/values depend on the earlier tokens); a prompt is found whole-block by
    whole-block, always leaving its last token to run."""
    size = 8
    rng = np.random.default_rng(0)
    first, second, c, tail = (rng.integers(100, 5000, size).tolist() for _ in range(4))
    x, y = first + c + tail[:3], second + c + tail[:3]
    eng = Engine(lm, block_size=size)
    eng.read_states([x, y], sessions=["x", "y"])
    assert (eng.sessions.blocks, eng.sessions.shared_blocks) == (4, 0)
    assert eng.sessions.lookup(second + c + tail, "z")[1] == 2 * size
    assert eng.sessions.lookup(first + first + tail, "z")[1] == size
    assert eng.sessions.lookup(first + c, "z")[1] == size  # all but the last token: one block
    assert eng.sessions.lookup(first + c, None) == (None, 0)
    states = eng.read_states([y + tail[3:], first + c], sessions=["y2", "xc"])
    assert eng.stats["shared_tokens"] == 3 * size
    for st, ids in zip(states, (y + tail[3:], first + c)):
        np.testing.assert_allclose(st, solo(lm, ids)[0], atol=TOL, rtol=0)


def test_layers_of_different_shapes_are_kept_per_layer():
    """Layers whose heads differ are stored and gathered one group per layer (a block of
    uniform layers is one tensor)."""
    from collections import Counter

    cache = SessionCache(CacheBudget(1 << 20), True, Counter(), block_size=4)
    kv = [(torch.randn(1, h, 10, 8), torch.randn(1, h, 10, 8)) for h in (2, 3)]
    ids = list(range(10))
    cache.store("s", ids, kv)
    s = cache._sessions["s"]
    assert len(s.blocks) == 2 and [x.shape for x in s.blocks[0].kv] == [(1, 2, 2, 4, 8), (1, 2, 3, 4, 8)]
    assert cache.nbytes == 10 * (2 + 3) * 2 * 8 * 4
    entry, n = cache.lookup(ids + [99], "t")
    assert entry.shared and n == 8
    past = gather_prefixes([None, entry], [0, 7], 7)
    for layer, (k, v) in zip(past.layers, kv):
        assert layer.keys.shape == (2, k.shape[1], 7, 8) and not layer.keys[0].any()
        torch.testing.assert_close(layer.keys[1], k[0, :, :7])
        torch.testing.assert_close(layer.values[1], v[0, :, :7])


def test_block_size_is_checked(lm):
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="block_size must be an int >= 1"):
            Engine(lm, block_size=bad)
