"""synclib.engine on a CUDA device: decoding steps replayed as CUDA graphs against the dynamic loop.

Skipped without a GPU (CI has none); run on a lent GPU machine with
``python -m pytest tests/test_engine_cuda.py``.  The model is a random 4-layer
Mistral-shaped network built on the device (``bench/bench_simulate.py``'s ``tiny``
preset, its tokenizer a byte-level BPE trained in-process): nothing is downloaded.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def cuda_lm():
    sys.path.insert(0, str(BENCH))
    from bench_simulate import build_random_model

    lm, _ = build_random_model("tiny", "cuda", torch.float32, newline_every=12)
    return lm


def prompts(lm, n: int = 6) -> list[list[int]]:
    """Token-id prompts of different lengths (so that rows are left-padded)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 30000, (40 + 37 * i,), generator=g).tolist() for i in range(n)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_decoding_equals_the_dynamic_loop_on_cuda(cuda_lm, dtype):
    """Tokens, stops, line ends and states of the CUDA-graph steps equal the dynamic loop's,
    with sessions (a reused prefix) and rows that finish early.  float32: the same rows in
    every mode.  bfloat16: the replayed graph equals the same static steps run eagerly, row
    for row; against the dynamic loop (whose attention kernels see a growing, unpadded key
    length and round differently) the states and each row's first token (both from the
    shared prefill) are equal, later tokens of a random network's flat distributions may
    part."""
    from synclib.engine import Engine, Request

    lm = cuda_lm
    lm.model.to(getattr(torch, dtype))
    try:
        ps = prompts(lm)
        out, engines = {}, {}
        for mode in ("dynamic", "static", "graph"):
            eng = engines[mode] = Engine(lm, max_rows=6, decode=mode)
            reqs = [Request(p, seed=i, session=i) for i, p in enumerate(ps)]
            eng.generate([Request(p[:-9], seed=i, session=i) for i, p in enumerate(ps)], max_new_tokens=2)
            out[mode] = eng.generate(reqs, max_new_tokens=48, temperature=0.7, first_line_only=True)
            assert sum(r.reused_tokens for r in out[mode]) > 0
        assert engines["graph"].stats["graph_fallbacks"] == 0, engines["graph"].graph_error
        assert engines["graph"].stats["graph_steps"] > 0

        def same(x, y):
            return [(a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason) for a, b in zip(x, y)]

        assert all(same(out["static"], out["graph"]))
        if dtype == "float32":
            assert all(same(out["dynamic"], out["static"]))
        else:
            assert [a.token_ids[:1] for a in out["dynamic"]] == [b.token_ids[:1] for b in out["static"]]
        for mode in ("static", "graph"):
            for a, b in zip(out["dynamic"], out[mode]):
                np.testing.assert_array_equal(a.states, b.states)
        assert {r.finish_reason for r in out["graph"]} >= {"line"}
    finally:
        lm.model.to(torch.float32)


def test_graph_step_logits_equal_eager_steps(cuda_lm):
    """A replayed step computes what the same step run eagerly computes (float32, 1e-4)."""
    from synclib.engine import Engine
    from synclib.engine.fixed import FixedSlots

    lm = cuda_lm
    eng = Engine(lm, max_rows=4, kv_reuse=False, decode="graph")
    rows = [(p, None) for p in prompts(lm, 4)]
    decs = [FixedSlots(eng, 4, 6, graph=g) for g in (False, True)]
    pos = [d.add(eng._prefill(rows)) for d in decs][0]
    assert decs[1].captured and not decs[0].captured
    for step in range(6):
        tok = torch.arange(4, device="cuda") * 17 + 5 + step
        for d in decs:
            d.feed(pos, tok)
        a, b = (d.logits_of(pos).clone() for d in decs)
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float32"])
def test_stream_graph_slots_equal_generate_on_cuda(cuda_lm, dtype):
    """Continuous batching in fixed slots, each step a CUDA-graph replay: rows joining in two
    waves and leaving as they end give generate's tokens, finish reasons and states (float32),
    with no capture fallback; the slots' column room re-allocates (and re-captures) once a
    longer prompt arrives."""
    from synclib.engine import Engine, Request
    from synclib.engine.fixed import FixedSlots

    lm = cuda_lm
    lm.model.to(getattr(torch, dtype))
    ps = prompts(lm, 8)
    reqs = [Request(p, seed=i, session=i) for i, p in enumerate(ps)]
    want = Engine(lm, max_rows=8, decode="dynamic").generate(reqs, max_new_tokens=48, temperature=0.7,
                                                             first_line_only=True)
    old = FixedSlots.ROUND
    FixedSlots.ROUND = 64
    try:
        eng = Engine(lm, max_rows=4)
        stream = eng.stream(max_new_tokens=48, temperature=0.7, first_line_only=True, join_min=1)
        assert stream.decode == "graph"
        for i in range(4):
            stream.submit(i, reqs[i])
        got, steps = {}, 0
        while len(stream):
            got.update(dict(stream.step()))
            steps += 1
            if steps == 3:
                for i in range(4, 8):
                    stream.submit(i, reqs[i])
    finally:
        FixedSlots.ROUND = old
    assert eng.stats["graph_fallbacks"] == 0, eng.graph_error
    assert eng.stats["graph_steps"] > 0
    assert eng.stats["slot_allocations"] >= 2
    for i, w in enumerate(want):
        g = got[i]
        assert (g.token_ids, g.finish_reason, g.text) == (w.token_ids, w.finish_reason, w.text)
        np.testing.assert_allclose(g.states, w.states, atol=1e-4, rtol=0)



def test_stream_probes_on_graph_slots_equal_sequence_logprobs_on_cuda(cuda_lm):
    """A :class:`Probe` on rows held in CUDA-graph slots: both points' scores equal
    :meth:`Engine.sequence_logprobs` of the same contexts (float32), and the rows generate what
    they generate without probes."""
    from synclib.engine import Engine, Probe, Request

    lm = cuda_lm
    lm.model.to(torch.float32)
    ps = prompts(lm, 6)
    reqs = [Request(p, seed=i, session=i) for i, p in enumerate(ps)]
    first, then = ((11, 12, 13), (11, 12), (40,)), ((7,), (7, 8))
    marked = lambda t: t % 4 == 0  # noqa: E731
    probe = Probe(first=first, then=then, mark=marked, within=8)
    want = Engine(lm, max_rows=6, decode="dynamic").generate(reqs, max_new_tokens=24, temperature=0.7)
    eng = Engine(lm, max_rows=3)
    stream = eng.stream(max_new_tokens=24, temperature=0.7, capacity=4, join_min=1)
    assert stream.decode == "graph"
    for i, r in enumerate(reqs):
        stream.submit(i, r, probe=probe)
    got = dict(stream.run())
    assert eng.stats["graph_fallbacks"] == 0, eng.graph_error
    ref = Engine(lm, kv_reuse=False, decode="dynamic")
    for i, w in enumerate(want):
        g = got[i]
        assert g.token_ids == w.token_ids
        np.testing.assert_allclose(g.scores[0], ref.sequence_logprobs([g.prompt_ids], [first])[0], atol=1e-3)
        k = next((k for k, t in enumerate(g.token_ids[:8]) if marked(t)), None)
        if k is None:
            assert g.scores[1] is None
        else:
            ctx = g.prompt_ids + g.token_ids[:k + 1]
            np.testing.assert_allclose(g.scores[1], ref.sequence_logprobs([ctx], [then])[0], atol=1e-3)
    assert eng.stats["probe_points"] >= 6
