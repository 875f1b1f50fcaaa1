"""Prefill: a batch of prompts laid out left padded over their cached prefixes, run once with hooks.

Row ``i`` has ``n_i`` prompt tokens, the first ``a_i`` cached in its session (0 without reuse).  The new segment is
``S = max(n_i - a_i)`` columns wide; row ``i`` takes ``p_i = max(0, n_i - S)`` tokens from its cache and feeds the
other ``n_i - p_i`` (re-reading a few cached ones so that the segments line up), so with ``P = max p_i`` the batch is

``[pad (P + S - n_i) | cached prefix (p_i) | new tokens (n_i - p_i)]``

Left padding only, no holes (:func:`layout`): the last column is every row's last prompt token, where the hooks read
the states (:func:`last_token_states`) and the first new token's logits are taken.  Padding is masked out and every
real token gets its true position id (``cumsum(mask) - 1``), so a row's states and logits equal those of its prompt
run alone, up to float rounding, also under sliding-window attention (Gemma-3).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from synclib.engine.forward import index_tensor

__all__ = ["Prefill", "Layout", "layout", "gather_prefixes", "last_token_states", "prefill_groups",
           "merge_prefills", "select_rows"]


@dataclass
class Prefill:
    """Output of one batched prefill."""

    logits: object          # (B, V) float32, next-token logits after the last prompt token
    states: np.ndarray      # (B, L, D) float32
    cache: object           # DynamicCache over (B, P + S) columns
    mask: object            # (B, P + S) long
    next_pos: object        # (B,) long, position id of the next token
    reused: list = field(default_factory=list)


@dataclass
class Layout:
    """A prefill batch's inputs: ``input_ids`` (B, S), ``mask`` (B, P + S) and ``positions``
    (B, P + S), on the device; ``reused[i]`` = ``p_i`` cached tokens per row, ``P`` their most."""

    input_ids: object
    mask: object
    positions: object
    reused: list
    P: int


def layout(ids: Sequence[list], avail: Sequence[int], pad_token_id: int, device) -> Layout:
    """The gap-free layout of rows ``ids`` of which ``avail`` tokens are cached: new tokens end at the last column,
    the cached prefix where the new segment starts (re-reading cached tokens rather than leaving a hole)."""
    import torch

    B = len(ids)
    S = max(len(x) - a for x, a in zip(ids, avail))
    reused = [max(0, len(x) - S) for x in ids]
    P = max(reused)
    input_ids = torch.full((B, S), pad_token_id, dtype=torch.long)
    mask = torch.zeros((B, P + S), dtype=torch.long)
    for i, (x, p) in enumerate(zip(ids, reused)):
        suffix = x[p:]
        input_ids[i, S - len(suffix):] = torch.tensor(suffix)
        mask[i, P + S - len(x):] = 1
    mask = mask.to(device)
    return Layout(input_ids.to(device), mask, (mask.cumsum(-1) - 1).clamp(min=0), reused, P)


def gather_prefixes(entries: Sequence, reused: Sequence[int], P: int):
    """A ``DynamicCache`` of ``P`` columns (empty if 0), row ``i``'s first ``reused[i]`` cached tokens right-aligned.

    ``entries[i]`` is row ``i``'s :class:`~synclib.engine.sessions.Session` (None where ``reused[i]`` is 0), whose
    ``pieces(p)`` give the first ``p`` tokens' keys/values block by block, per layer group ``(Lg, 2, H, m, Dh)``; they
    are copied into an ``(Lg, 2, B, H, P, Dh)`` per group (``[l, 0]``, ``[l, 1]``: layer ``l``'s keys and values).
    """
    from transformers import DynamicCache

    if P == 0:
        return DynamicCache()
    ref = next(s for s, p in zip(entries, reused) if p > 0).pieces(1)[0]
    out = [x.new_empty((x.shape[0], 2, len(entries), x.shape[2], P, x.shape[4])) for x in ref]
    for i, (s, p) in enumerate(zip(entries, reused)):
        rows = [o[:, :, i] for o in out]  # (Lg, 2, H, P, Dh)
        for row in rows:
            row[:, :, :, :P - p].zero_()
        a = P - p
        for piece in (s.pieces(p) if p else ()):
            for row, x in zip(rows, piece):
                row[:, :, :, a:a + x.shape[3]] = x
            a += piece[0].shape[3]
    return DynamicCache(ddp_cache_data=[(o[l, 0], o[l, 1]) for o in out for l in range(o.shape[0])])


@contextmanager
def last_token_states(layers, sink: list):
    """Forward hooks on ``layers`` that append each layer's last-column output (float32) to ``sink``."""
    def hook(_module, _inputs, output):
        hidden = output[0] if isinstance(output, (tuple, list)) else output
        sink.append(hidden[:, -1, :].detach().float())

    handles = [layer.register_forward_hook(hook) for layer in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def prefill_groups(new: Sequence[int], max_groups: int = 4, min_saving: float = 0.3) -> list[list[int]]:
    """Split a batch's rows into prefill groups by their new-token counts ``new`` (prompt minus cached prefix).

    A padded prefill computes ``rows x max(new)`` tokens.  Rows sorted by ``new`` (most first) are cut where the cut
    saves at least ``min_saving`` of that cost, into at most ``max_groups`` groups.  Returns lists of row indices
    covering ``range(len(new))``.
    """
    order = sorted(range(len(new)), key=lambda i: -new[i])
    groups, rest = [], order
    while len(groups) < max_groups - 1 and len(rest) > 1:
        n = [new[i] for i in rest]
        cost, k = min((j * n[0] + (len(n) - j) * n[j], j) for j in range(1, len(n)))
        if cost > (1 - min_saving) * len(n) * n[0]:
            break
        groups.append(rest[:k])
        rest = rest[k:]
    return groups + [rest]


def merge_prefills(parts: list[Prefill], groups: list[list[int]]) -> Prefill:
    """One batch from prefills of row groups (``groups[g]``: the batch rows of ``parts[g]``, in its order): caches and
    masks left-padded to the longest; each part's cache is released layer by layer as it is copied."""
    import torch
    from transformers import DynamicCache

    B = sum(len(g) for g in groups)
    T = max(p.mask.shape[1] for p in parts)
    first = parts[0]
    dev = first.mask.device
    index = [torch.tensor(g, device=dev) for g in groups]
    layers = [[(layer.keys, layer.values) for layer in p.cache.layers] for p in parts]
    for p in parts:
        p.cache = None
    merged = []
    for li in range(len(layers[0])):
        k0, v0 = layers[0][li]
        k = k0.new_zeros((B, k0.shape[1], T, k0.shape[3]))
        v = v0.new_zeros((B, v0.shape[1], T, v0.shape[3]))
        for g, idx in enumerate(index):
            gk, gv = layers[g][li]
            layers[g][li] = None
            k[idx, :, T - gk.shape[2]:] = gk
            v[idx, :, T - gv.shape[2]:] = gv
        merged.append((k, v))
    mask = first.mask.new_zeros((B, T))
    logits = first.logits.new_empty((B, first.logits.shape[1]))
    next_pos = first.next_pos.new_empty(B)
    states = np.empty((B,) + first.states.shape[1:], dtype=first.states.dtype)
    reused = [0] * B
    for p, g, idx in zip(parts, groups, index):
        mask[idx, T - p.mask.shape[1]:] = p.mask
        logits[idx], next_pos[idx], states[g] = p.logits, p.next_pos, p.states
        for i, r in zip(g, p.reused):
            reused[i] = r
    return Prefill(logits=logits, states=states, cache=DynamicCache(ddp_cache_data=merged), mask=mask,
                   next_pos=next_pos, reused=reused)


def select_rows(pre: Prefill, rows: list[int]) -> Prefill:
    """Rows ``rows`` of ``pre`` (cache selected in place), without leading columns only other rows used (no holes)."""
    idx = index_tensor(rows, pre.mask.device)
    pre.cache.batch_select_indices(idx)
    mask = pre.mask[idx]
    first = int(mask.any(0).nonzero()[0])
    if first:
        for layer in pre.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
        mask = mask[:, first:]
    return Prefill(logits=pre.logits[idx], states=pre.states[rows], cache=pre.cache, mask=mask,
                   next_pos=pre.next_pos[idx], reused=[pre.reused[i] for i in rows])
