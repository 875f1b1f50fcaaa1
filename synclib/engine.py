"""Hooked, batched generation that records last-prompt-token states.

The engine runs a :class:`~synclib.models.LoadedModel` over batches of prompts and
returns, for every prompt (a *row*), the output of every decoder layer at the last
prompt token (the position that produces the first new token), as float32 arrays of
shape ``(n_layers, d_model)``.  Nothing else of the sequence is kept.

Entry points
------------
:class:`Engine`
    Holds a model and the per-session key/value caches.  ``generate``, ``read_states``,
    ``sequence_logprobs`` and ``word_distributions`` all accept a *session* per row: an
    arbitrary hashable key (e.g. ``(task_index, sim_seed, agent, view)``) under which the
    keys/values of that row's prompt are kept; the next prompt of the same session only
    prefills the tokens after the longest common token prefix with the previous one.
    Call :meth:`Engine.forget` when a session (episode) ends.
    ``sequence_logprobs`` is the one scorer of multi-token candidates: the unnormalised
    log-probability of given token sequences after each prompt (the constrained judge's
    scores); ``word_distributions`` builds normalised distributions over candidate words
    on it (the ToM read-out of :mod:`synclib.simulate`).
:class:`DecodeStream` (:meth:`Engine.stream`)
    Continuous batching: rows join a running decoding batch at any step and leave it at
    the step they end, so a dialog's next utterance need not wait for other rows' longer
    replies; the same per-row sampling and sessions as ``generate``.
:func:`generate`, :func:`read_states`, :func:`word_distributions`
    One-shot wrappers around a fresh :class:`Engine` (no cache kept between calls).
:func:`row_seed`
    The sampling seed of a row from integer keys, e.g. ``row_seed(sim_seed, task, utterance)``.

How a batch is laid out
-----------------------
Row ``i`` has ``n_i`` prompt tokens, of which the first ``a_i`` have keys/values in its
session cache (0 without reuse).  The new segment is ``S = max(n_i - a_i)`` columns wide;
row ``i`` takes ``p_i = max(0, n_i - S)`` tokens from its cache and feeds the other
``n_i - p_i`` as input, so (with ``P = max p_i``) the batch is

``[pad (P + S - n_i) | cached prefix (p_i) | new tokens (n_i - p_i)]``

LEFT padding only, no holes: the last column is every row's last prompt token, where the
hooks read the states and the logits of the first new token are taken.  A row may re-read
a few cached tokens so that all rows' new segments line up (rows are grouped by new-token
count to keep that small).  Padded positions are masked out of attention and every real
token gets its true position id (``cumsum(mask) - 1``), so a row's states and logits equal
those of the same prompt run alone, up to float rounding; as the padding is only on the
left this also holds for sliding-window attention (Gemma-3).  Cached prefixes are kept per
session on the model's device, without padding, and re-assembled per batch.

Sampling
--------
Temperature sampling by inverse CDF: each row owns a CPU ``torch.Generator`` seeded with
its request's seed; at every step it draws one uniform number ``u`` and the token is the
first whose cumulative probability exceeds ``u``.  A row's text therefore depends only on
its prompt and seed, not on which other rows share its batch, up to float rounding: padding
and cache reuse change the logits by ~1e-5, which flips a draw when ``u`` falls that close
to a cumulative-probability boundary (seen about once in a few hundred draws with SmolLM2;
later utterances of that dialog then differ too).  The same command on the same machine
is exactly reproducible.  Probabilities and their cumulative sum are computed in float64.  ``temperature=0`` is greedy.  A row stops at any of the model's stop tokens
(EOS and end-of-turn, ``LoadedModel.stop_token_ids``) or after ``max_new_tokens``.
"""
from __future__ import annotations

import hashlib
import inspect
import warnings
from collections import Counter, OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import numpy as np

from synclib.memory import CacheBudget, return_freed_memory, session_budget

#: how :class:`Engine` runs decoding steps (its ``decode`` parameter)
DECODE_MODES = ("auto", "graph", "static", "dynamic")
#: how a dialog loop puts its rows on an engine: ``turns``, one :meth:`Engine.generate` call per
#: utterance index (every row waits for the call's longest reply); ``continuous``, a
#: :class:`DecodeStream` that each dialog's next utterance joins as soon as its reply ends
SCHEDULING = ("turns", "continuous")

__all__ = ["DECODE_MODES", "SCHEDULING", "sampling_distribution", "Engine", "DecodeStream", "Request", "Result", "generate", "read_states", "word_distributions",
           "row_seed", "candidate_sequences", "continuation_logprobs"]


def row_seed(*keys: int) -> int:
    """A 63-bit sampling seed derived from integer keys.

    Parameters
    ----------
    *keys : int
        E.g. ``(sim_seed, task_index, utterance_index)``; any number of non-negative ints.

    Returns
    -------
    int
        Stable across runs, platforms and Python versions (SHA-256 of the keys).
    """
    text = ",".join(str(int(k)) for k in keys)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


@dataclass(frozen=True)
class Request:
    """One row to generate.

    Attributes
    ----------
    prompt : str or sequence of int
        Chat-formatted prompt text (:meth:`LoadedModel.chat_prompt`) or its token ids.
    seed : int
        Seed of the row's random generator (see :func:`row_seed`).
    session : hashable, optional
        Key of the KV cache to reuse and update (one per agent and episode); ``None``
        means no reuse.
    """

    prompt: object
    seed: int = 0
    session: Hashable | None = None


@dataclass
class Result:
    """What :meth:`Engine.generate` returns for one row.

    Attributes
    ----------
    text : str
        Generated text, special tokens removed, stop token excluded (not post-processed).
    token_ids : list[int]
        Generated token ids (stop token excluded).
    prompt_ids : list[int]
        The prompt's token ids; ``len(prompt_ids)`` is the prompt length.
    states : numpy.ndarray
        ``(n_layers, d_model)`` float32: every decoder layer's output at the last prompt token.
    finish_reason : str
        ``"stop"`` (a stop token was sampled), ``"line"`` (the first line was complete,
        with ``first_line_only``) or ``"length"`` (``max_new_tokens`` reached).
    reused_tokens : int
        Prompt tokens whose keys/values came from the session cache instead of a prefill.
    """

    text: str
    token_ids: list
    prompt_ids: list
    states: np.ndarray
    finish_reason: str
    reused_tokens: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


@dataclass
class _Session:
    ids: list
    kv: list  # per layer: (keys (1, H, n, Dh), values (1, H, n, Dh))
    nbytes: int = 0


@dataclass
class _Prefill:
    """Output of one batched prefill (internal)."""

    logits: object          # (B, V) float32, next-token logits after the last prompt token
    states: np.ndarray      # (B, L, D) float32
    cache: object           # DynamicCache over (B, P + S) columns
    mask: object            # (B, P + S) long
    next_pos: object        # (B,) long, position id of the next token
    reused: list = field(default_factory=list)


def _prefill_groups(new: Sequence[int], max_groups: int = 4, min_saving: float = 0.3) -> list[list[int]]:
    """Split a batch's rows into prefill groups by their new-token counts.

    A padded prefill computes ``rows x max(new)`` tokens.  Rows sorted by ``new`` (most
    first) are cut where the cut saves at least ``min_saving`` of that cost, at most
    ``max_groups`` groups.

    Parameters
    ----------
    new : sequence of B int
        Tokens each row must run (its prompt minus the cached prefix).

    Returns
    -------
    list of lists of row indices, covering ``range(B)``.
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


def _merge_prefills(parts: list[_Prefill], groups: list[list[int]]) -> _Prefill:
    """One batch from prefills of row groups: caches and masks left-padded to the longest.

    ``groups[g]`` lists the batch rows of ``parts[g]`` (in its row order).  Each part's
    cache is released layer by layer as it is copied.
    """
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
    return _Prefill(logits=logits, states=states, cache=DynamicCache(ddp_cache_data=merged), mask=mask,
                    next_pos=next_pos, reused=reused)


def _is_oom(exc: BaseException) -> bool:
    import torch

    msg = str(exc).lower()
    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and ("out of memory" in msg or "cublas_status_alloc_failed" in msg))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def continuation_logprobs(model, cache, mask, next_pos, items, pad_token_id: int,
                          batch_size: int = 16) -> tuple[list[float], int]:
    """Teacher-forced log-probabilities of token sequences after prefilled rows.

    ``items`` are ``(row, seq)`` pairs; for each, ``log P(seq[1:] | row's prompt, seq[0])``
    (the first token's own probability is read from the prefill's logits by the
    caller; 0.0 for a one-token ``seq``).

    The tokens to feed are, per row, the distinct proper prefixes of its sequences, laid
    out as a prefix tree: each prefix is one input token (its last), at the position after
    its parent's, attending to the row's prompt and to its own ancestors only (one
    ``(batch, 1, nodes, columns)`` mask per attention type, sliding windows applied as the
    model applies them).  One forward pass over the row's key/value cache thus scores all
    of its candidates, ``batch_size`` rows per pass, instead of one cache copy per distinct
    prefix (:func:`_per_prefix_logprobs`, used for attention implementations that take no
    explicit mask).  Both give the log-probabilities of running each ``prompt + seq`` alone,
    up to float rounding.

    Parameters
    ----------
    model : transformers causal LM
    cache : ``DynamicCache`` of the prefilled batch holding every column (a plain
        ``DynamicCache()``, also for sliding-window models); not modified
    mask : (B, T) long attention mask of the cache's columns
    next_pos : (B,) long, position id of each row's next token
    items : sequence of (int, sequence of int)
    pad_token_id : int
    batch_size : int

    Returns
    -------
    logps : list of float, one per item
    forward_calls : int
    """
    windows = _attention_windows(model.config)
    if windows is None:
        return _per_prefix_logprobs(model, cache, mask, next_pos, items, pad_token_id, batch_size)
    import torch
    from transformers import DynamicCache

    trees: dict = {}  # row -> {prefix: node index}, parents before children
    for b, seq in items:
        nodes = trees.setdefault(int(b), {})
        for d in range(1, len(seq)):
            nodes.setdefault(tuple(seq[:d]), len(nodes))
    out = [0.0] * len(items)
    rows = sorted(b for b, nodes in trees.items() if nodes)
    if not rows:
        return out, 0
    dev, T = mask.device, mask.shape[1]
    float_dtype = _eager_dtype(model)  # eager attention adds its mask to the scores; sdpa takes booleans
    bs = max(1, int(batch_size))
    calls = 0
    by_row: dict = {}
    for i, (b, seq) in enumerate(items):
        by_row.setdefault(int(b), []).append(i)
    for c0 in range(0, len(rows), bs):
        chunk = rows[c0:c0 + bs]
        n, L = len(chunk), max(len(trees[b]) for b in chunk)
        inp = torch.full((n, L), pad_token_id, dtype=torch.long)
        depth = torch.zeros((n, L), dtype=torch.long)
        tree = torch.eye(L, dtype=torch.bool).repeat(n, 1, 1)  # (n, query node, key node): ancestor or self
        for j, b in enumerate(chunk):
            for pre, v in trees[b].items():
                inp[j, v], depth[j, v] = pre[-1], len(pre) - 1
                for d in range(1, len(pre)):
                    tree[j, v, trees[b][pre[:d]]] = True
        sel = torch.tensor(chunk, device=dev)
        depth, tree = depth.to(dev), tree.to(dev)
        # query node at column T + depth, prompt key at column k: visible if unpadded and,
        # under a sliding window w, (T + depth) - k < w; tree keys: depth difference < w
        q_col = T + depth[:, :, None]
        k_col = torch.arange(T, device=dev)[None, None, :]
        unpadded = mask[sel].bool()[:, None, :].expand(n, L, T)
        masks = {}
        for kind, w in windows.items():
            prompt, own = unpadded, tree
            if w is not None:
                prompt = unpadded & (q_col - k_col < w)
                own = tree & (depth[:, :, None] - depth[:, None, :] < w)
            allowed = torch.cat([prompt, own], dim=2)[:, None]  # (n, 1, L, T + L)
            if float_dtype is not None:
                allowed = _additive_mask(allowed, float_dtype)
            masks[kind] = allowed
        layers = [(layer.keys.index_select(0, sel), layer.values.index_select(0, sel))
                  if n < mask.shape[0] else (layer.keys, layer.values) for layer in cache.layers]
        with torch.inference_mode():
            logits = model(input_ids=inp.to(dev), attention_mask=masks if len(masks) > 1 else masks.popitem()[1],
                           position_ids=next_pos[sel][:, None] + depth,
                           past_key_values=DynamicCache(ddp_cache_data=layers), use_cache=True).logits
            lse = torch.logsumexp(logits.float(), dim=-1)  # (n, L)
        calls += 1
        # log P(seq[d] | prompt, seq[:d]) for every item of these rows and every d >= 1
        terms = [(i, j, trees[b][tuple(items[i][1][:d])], items[i][1][d])
                 for j, b in enumerate(chunk) for i in by_row[b] for d in range(1, len(items[i][1]))]
        j_idx, v_idx, t_idx = (torch.tensor([t[k] for t in terms], device=dev) for k in (1, 2, 3))
        vals = (logits[j_idx, v_idx, t_idx].float() - lse[j_idx, v_idx]).double().cpu().tolist()
        for (i, *_), val in zip(terms, vals):
            out[i] += val
    return out, calls


def _attention_windows(config) -> dict | None:
    """``{layer type: sliding window or None}`` of a model whose attention takes an explicit
    4-D mask (``sdpa``, ``eager``), as transformers names the layer types; None otherwise."""
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return None
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or
                ["sliding_attention" if window is not None else "full_attention"])
    if not types <= {"full_attention", "sliding_attention"}:
        return None
    return {t: (window if t == "sliding_attention" else None) for t in sorted(types)}


def _per_prefix_logprobs(model, cache, mask, next_pos, items, pad_token_id: int,
                         batch_size: int = 16) -> tuple[list[float], int]:
    """:func:`continuation_logprobs` without explicit masks: each distinct ``(row, seq[:-1])``
    is fed once, right-padded, ``batch_size`` per forward pass, over its own copy of the
    row's cache."""
    import torch
    from transformers import DynamicCache

    users: dict = {}  # (row, fed tokens) -> items that need them
    for i, (b, seq) in enumerate(items):
        if len(seq) > 1:
            users.setdefault((int(b), tuple(seq[:-1])), []).append(i)
    feeds = sorted(users)
    out = [0.0] * len(items)
    dev = mask.device
    bs = max(1, int(batch_size))
    calls = 0
    for c0 in range(0, len(feeds), bs):
        chunk = feeds[c0:c0 + bs]
        n, w = len(chunk), max(len(f) for _, f in chunk)
        inp = torch.full((n, w), pad_token_id, dtype=torch.long)
        fmask = torch.zeros((n, w), dtype=torch.long)
        for j, (_, f) in enumerate(chunk):
            inp[j, :len(f)] = torch.tensor(f)
            fmask[j, :len(f)] = 1
        sel = torch.tensor([b for b, _ in chunk], device=dev)
        with torch.inference_mode():
            layers = [(layer.keys.index_select(0, sel), layer.values.index_select(0, sel))
                      for layer in cache.layers]
            logits = model(input_ids=inp.to(dev), attention_mask=torch.cat([mask[sel], fmask.to(dev)], 1),
                           position_ids=next_pos[sel][:, None] + torch.arange(w, device=dev),
                           past_key_values=DynamicCache(ddp_cache_data=layers), use_cache=True).logits
        calls += 1
        lsm = torch.log_softmax(logits.float(), dim=-1)  # (n, w, V)
        for j, key in enumerate(chunk):
            for i in users[key]:
                nxt = torch.tensor(items[i][1][1:], device=lsm.device)
                out[i] = float(lsm[j, torch.arange(len(nxt), device=lsm.device), nxt].sum())
    return out, calls


def candidate_sequences(tokenizer, candidates: Sequence[str]) -> list[list[tuple[int, ...]]]:
    """Token sequences that spell each candidate word at the next position.

    Every candidate gets two variants: the word as is and with a leading space (``"Joy"``
    and ``" Joy"``), tokenized without special tokens; identical variants are merged.  The
    first is what a model emits at the start of a line or turn, the second after a word
    or punctuation mark, so summing them makes the score independent of the context.

    Returns
    -------
    list of list of tuple of int
        ``[candidate][variant] -> token ids``.

    Raises
    ------
    ValueError
        When a candidate is empty or two candidates are the same string.
    """
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"candidates must be distinct, got {list(candidates)}")
    out = []
    for c in candidates:
        if not isinstance(c, str) or not c.strip():
            raise ValueError(f"candidate words must be non-empty strings, got {c!r}")
        variants = []
        for text in (c, " " + c.lstrip()):
            ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
            if ids and ids not in variants:
                variants.append(ids)
        out.append(variants)
    return out


def sampling_distribution(logits, temperature: float, top_k: int | None = None, top_p: float | None = None,
                          work: "_SampleWork | None" = None):
    """The distribution a sampling step draws from: float64 ``(B, V)`` probabilities.

    As ``transformers``' ``generate`` with ``do_sample=True``: the temperature warper, then
    top-k (tokens scoring below the k-th highest are removed; ties at the k-th are kept),
    then top-p (tokens sorted by score ascending; those whose cumulative probability is at
    most ``1 - top_p`` are removed, the most likely one always kept), the masks computed in
    float32 like the warpers'; the kept scores are normalised in float64.  Without top-k and
    top-p this is ``softmax(logits / temperature)`` in float64.

    Parameters
    ----------
    logits : torch.Tensor ``(B, V)`` float32, next-token logits
    temperature : float > 0
    top_k : int >= 1, or None / 0 for none
    top_p : float in (0, 1], or None / 1.0 for none
    work : _SampleWork, optional
        Buffers of at least ``B`` rows to compute in (the result is a view of one of them);
        the same numbers as without, which allocates each vocabulary-sized array anew.
    """
    import torch

    B, V = logits.shape
    work = work or _SampleWork(V, B, logits.device)
    scores, probs, s32, remove = work.rows(B)
    scores.copy_(logits).div_(temperature)  # = logits.double() / temperature
    truncated = False
    if top_k and int(top_k) < V:
        torch.div(logits.float(), temperature, out=s32)
        kth = torch.topk(s32, int(top_k), dim=-1).values[..., -1:]
        torch.lt(s32, kth, out=remove)
        truncated = True
    if top_p is not None and float(top_p) < 1.0:
        torch.div(logits.float(), temperature, out=s32)
        if truncated:
            s32.masked_fill_(remove, float("-inf"))
        srt, idx = torch.sort(s32, descending=False, dim=-1)
        drop = srt.softmax(dim=-1).cumsum(dim=-1) <= (1 - float(top_p))
        drop[..., -1:] = False
        drop = drop.scatter(-1, idx, drop)
        if truncated:
            remove |= drop
        else:
            remove.copy_(drop)
        truncated = True
    if truncated:
        scores.masked_fill_(remove, float("-inf"))
    return torch.softmax(scores, dim=-1, out=probs)


#: bytes of each float64 buffer a CPU sampling step works in (:class:`_SampleWork`)
SAMPLE_CHUNK_BYTES = 8 << 20


class _SampleWork:
    """The buffers of sampling steps over a ``V``-token vocabulary, for ``rows`` rows at a time:
    float64 scores and probabilities, float32 scores and the removal mask of top-k/top-p.

    A step's arrays are each a row chunk's ``(rows, V)`` views of these, not fresh arrays: at
    Gemma-3's 262,144 tokens and 32 rows each float64 array is 64 MiB, which the CPU's
    allocator maps and the kernel faults in anew every step.  Measured on 2 cores, 32 rows: a
    step with top-k 50 (the embedded models' setting) 131 against 49 ms at Gemma-3's width, 25
    against 7 ms at SmolLM2's 49,152; without top-k 82 against 18 ms; the same numbers bit for
    bit, the rows being independent (a simulation of G-G, 32 tasks of 6 utterances: 145 -> 128 s)."""

    def __init__(self, V: int, rows: int | None = None, device=None):
        import torch

        self.V = V
        self.chunk = rows or max(1, SAMPLE_CHUNK_BYTES // (8 * V))
        self._bufs = tuple(torch.empty(self.chunk, V, dtype=dt, device=device)
                           for dt in (torch.float64, torch.float64, torch.float32, torch.bool))

    def rows(self, n: int) -> tuple:
        """The first ``n`` rows (``n <= chunk``) of each buffer."""
        if n > self.chunk:
            raise ValueError(f"_SampleWork holds {self.chunk} rows, not {n}")
        return tuple(b[:n] for b in self._bufs)


def with_room(cache, room: int) -> None:
    """Give a prefilled ``DynamicCache`` room for ``room`` more tokens per row, in place.

    ``transformers`` grows a layer's keys and values by concatenation: every decoding step
    allocates each layer's whole ``(B, H, T + 1, Dh)`` anew and frees the old one.  On the
    CPU, where freed blocks of 1 MiB and more go back to the system
    (:func:`synclib.memory.return_freed_memory`), each of those allocations is fresh pages the
    kernel must fault in and zero.  Here each layer's keys and values move once into buffers
    with ``room`` spare columns, and a step writes its column in place; the layer's
    ``keys``/``values`` are views of the buffers, with the same values in the same order, so
    attention computes what it did.  Only plain ``DynamicLayer`` layers are converted (the
    engine's caches have no others: sliding windows are applied by the attention mask); a
    row selection (finished rows leaving the batch) keeps the room.
    """
    from transformers.cache_utils import DynamicLayer

    global _RoomyLayer
    if _RoomyLayer is None:
        class RoomyLayer(DynamicLayer):
            """A ``DynamicLayer`` whose keys/values are the first ``T`` columns of buffers with room."""

            def _place(self, keys, values) -> None:
                B, H, T, D = keys.shape
                self._kb = keys.new_empty((B, H, T + self._room, D))
                self._vb = values.new_empty((B, H, T + self._room, values.shape[-1]))
                self._kb[:, :, :T], self._vb[:, :, :T] = keys, values
                self.keys, self.values = self._kb[:, :, :T], self._vb[:, :, :T]

            def update(self, key_states, value_states, *args, **kwargs):
                T, n = self.keys.shape[-2], key_states.shape[-2]
                if T + n > self._kb.shape[-2]:  # out of room: move into new buffers
                    self._place(self.keys, self.values)
                self._kb[:, :, T:T + n], self._vb[:, :, T:T + n] = key_states, value_states
                self.keys, self.values = self._kb[:, :, :T + n], self._vb[:, :, :T + n]
                return self.keys, self.values

            def batch_select_indices(self, indices) -> None:
                T = self.keys.shape[-2]
                self._kb, self._vb = self._kb[indices], self._vb[indices]
                self.keys, self.values = self._kb[:, :, :T], self._vb[:, :, :T]

        _RoomyLayer = RoomyLayer
    for layer in getattr(cache, "layers", ()):  # transformers < 4.56 keeps lists, left as they are
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            layer.__class__ = _RoomyLayer
            layer._room = int(room)
            layer._place(layer.keys, layer.values)


#: the layer class of :func:`with_room` (defined on first use: transformers is a lazy import)
_RoomyLayer = None


class _StaticDecoder:
    """Decoding steps of one batch over preallocated keys/values, as one CUDA graph on GPUs.

    The dynamic path (:meth:`Engine._generate_batch` without this) grows the attention mask
    and the key/value cache by one column per step and lets ``transformers`` rebuild the
    4-D mask: about a thousand kernel launches and allocations per step, which on a GPU
    cost more host time than the step's arithmetic (``bench/gpu_notes.md``).  Here the
    whole reply's room is allocated once: per layer ``(B, H, T0 + steps, Dh)`` keys and
    values holding the prefill's ``T0`` columns, a boolean ``(B, 1, 1, T0 + steps)`` mask
    with the unwritten columns closed, and one step is

    1. open the next column of the mask;
    2. run the model on the fed token at each row's position; every layer writes its key
       and value into that column (:meth:`update`, the cache interface the model calls);
    3. copy the next-token logits into a fixed float32 buffer; advance column and positions.

    All of it is in place on fixed tensors, so on CUDA it is captured once per batch as a
    CUDA graph and each step is one replay (``graph=True``); on the CPU, or when capture
    fails, the same step runs eagerly.  Rows never leave the batch (a finished row's
    tokens are discarded by the caller), so the shapes stay fixed.  Attention reads the
    closed columns with zero weight, so a row's logits equal the dynamic path's up to
    float rounding.  Only for models whose every layer attends to the full context through
    an explicit mask (``sdpa`` or ``eager``): see :meth:`supports`.

    Parameters
    ----------
    model : transformers causal LM
    pre : _Prefill
        The batch's prefill (its cache, mask and next positions); its cache is copied.
    steps : int
        Most tokens that will be fed (``max_new_tokens - 1``).
    graph : bool
        Capture the step as a CUDA graph (CUDA only).
    logits_kw : dict
        Extra model arguments (``logits_to_keep``).
    """

    def __init__(self, model, pre, steps: int, graph: bool, logits_kw: dict):
        import torch

        self.model, self.kw = model, logits_kw
        B, T0 = pre.mask.shape
        T = T0 + max(1, int(steps))
        self.keys, self.values = [], []
        for layer in pre.cache.layers:
            for src, dst in ((layer.keys, self.keys), (layer.values, self.values)):
                buf = src.new_zeros((B, src.shape[1], T, src.shape[3]))
                buf[:, :, :T0] = src
                dst.append(buf)
        dev = pre.mask.device
        self.start = T0
        self.col = torch.full((1,), T0, dtype=torch.long, device=dev)
        self.allowed = torch.zeros((B, 1, 1, T), dtype=torch.bool, device=dev)
        self.allowed[:, 0, 0, :T0] = pre.mask.bool()
        self.pos0 = pre.next_pos.clone()
        self.pos = pre.next_pos.clone()
        self.tok = torch.zeros(B, dtype=torch.long, device=dev)
        self.logits = torch.zeros_like(pre.logits, dtype=torch.float32)
        self.eager_dtype = _eager_dtype(model)
        self.graph = None
        self.captured = False
        #: why the capture failed (``"TypeName: message"``), None when it did not
        self.error: str | None = None
        if graph and dev.type == "cuda":
            self._capture()

    @staticmethod
    def supports(model) -> bool:
        """Whether the model attends with an explicit mask and no sliding window."""
        windows = _attention_windows(model.config)
        return windows is not None and all(w is None for w in windows.values())

    # the one cache method a decoder layer calls
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys[layer_idx].index_copy_(2, self.col, key_states)
        self.values[layer_idx].index_copy_(2, self.col, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def _forward(self) -> None:
        self.allowed.index_fill_(3, self.col, True)
        mask = self.allowed
        if self.eager_dtype is not None:  # eager attention adds its mask to the scores
            mask = _additive_mask(mask, self.keys[0].dtype, self.eager_dtype)
        out = self.model(input_ids=self.tok[:, None], attention_mask=mask, position_ids=self.pos[:, None],
                         past_key_values=self, use_cache=True, **self.kw)
        self.logits.copy_(out.logits[:, -1, :])
        self.col.add_(1)
        self.pos.add_(1)

    def _capture(self) -> None:
        """Capture one step (:func:`_capture_step`), the warm-up undone by :meth:`_reset`."""
        self.graph, self.error = _capture_step(self._forward, self._reset)
        self.captured = self.graph is not None

    def _reset(self) -> None:
        self.col.fill_(self.start)
        self.pos.copy_(self.pos0)
        self.allowed[:, :, :, self.start:] = False

    def step(self, tok):
        """Feed ``tok`` ``(B,)`` (one token per row); return the next logits ``(B, V)`` float32
        (a buffer overwritten by the next step)."""
        import torch

        self.tok.copy_(tok)
        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.inference_mode(), _decode_attention():
                self._forward()
        return self.logits


def _check_sampling(max_new_tokens, temperature, top_k, top_p) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and int(top_k) < 0:
        raise ValueError(f"top_k must be >= 0 or None, got {top_k}")
    if top_p is not None and not 0 < float(top_p) <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")


def _sample(logits, u, sampling, work: _SampleWork | None = None):
    """One decoding step's token per row.

    Parameters
    ----------
    logits : (R, V) float32 next-token logits
    u : (R,) float64, each row's own uniform for this step
    sampling : (temperature, top_k, top_p)
    work : _SampleWork, optional
        Buffers to sample in, a chunk of rows at a time (the CPU's steps; see there).

    Returns
    -------
    (R,) long: the argmax at temperature 0, else the inverse of the sampling distribution's
    CDF (:func:`sampling_distribution`) at ``u``.
    """
    import torch

    temperature, top_k, top_p = sampling
    if temperature == 0:
        return logits.argmax(-1)
    R, V = logits.shape
    work = work or _SampleWork(V, R, logits.device)  # without: every row at once, in fresh arrays
    tok = torch.empty(R, dtype=torch.long, device=logits.device)
    for s in range(0, R, work.chunk):
        e = min(R, s + work.chunk)
        p = sampling_distribution(logits[s:e], temperature, top_k, top_p, work=work)
        cdf = torch.cumsum(p, -1, out=work.rows(e - s)[0])
        tok[s:e] = torch.searchsorted(cdf, (u[s:e] * cdf[:, -1]).unsqueeze(-1)).squeeze(-1).clamp(max=V - 1)
    return tok


def _row_ends(tok, live, seen, stop, lines):
    """What one step's tokens do to their rows.

    Parameters
    ----------
    tok : (R,) long, the sampled tokens
    live : (R,) bool, rows still generating
    seen : (R,) bool, rows that have generated some text
    stop : (S,) long, the stop token ids
    lines : the :meth:`Engine._line_flags` triple, or None (no first-line stop)

    Returns
    -------
    keep : (R,) bool, the token is part of the reply
    is_stop : (R,) bool, a stop token ended the row (the token is not kept)
    at_line : (R,) bool, the token completed the first line and ends the row (kept)
    seen : (R,) bool, updated
    """
    import torch

    is_stop = torch.isin(tok, stop) & live
    keep = live & ~is_stop
    if lines is None:
        return keep, is_stop, torch.zeros_like(keep), seen
    at_line = keep & lines[0][tok] & (seen | lines[1][tok])
    return keep, is_stop, at_line, seen | (keep & lines[2][tok])


def _eager_dtype(model):
    """The model's parameter dtype when its attention is ``eager`` (which adds a float mask to
    the scores), else None (``sdpa`` takes a boolean mask)."""
    if getattr(model.config, "_attn_implementation", "sdpa") != "eager":
        return None
    return next(model.parameters()).dtype


def _additive_mask(allowed, dtype, fill_dtype=None):
    """The boolean mask ``allowed`` as eager attention adds it to the scores: a ``dtype``
    tensor of the same shape, 0 where allowed and the most negative value of ``fill_dtype``
    (default ``dtype``) elsewhere."""
    import torch

    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(fill_dtype or dtype).min)


def _capture_step(forward, reset):
    """One decoding step captured as a CUDA graph: ``forward()`` is warmed up on a side
    stream, ``reset()`` undoes the warm-up's writes, the step is captured, and ``reset()``
    undoes the capture's.  Returns ``(graph, None)``, or ``(None, "TypeName: message")``
    when capture failed (the caller then runs ``forward`` eagerly; the buffers are reset
    either way)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.inference_mode(), _decode_attention(), torch.cuda.stream(side):
            forward()
            reset()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        reset()
        return graph, None
    except Exception as exc:  # noqa: BLE001 - any capture failure: run the same step eagerly
        torch.cuda.current_stream().wait_stream(side)
        reset()
        return None, f"{type(exc).__name__}: {exc}"


@contextmanager
def _decode_attention():
    """On CUDA, the attention kernels a decoding step may use: memory-efficient (which takes
    the boolean mask), else math; never cuDNN, whose plan depends on the key length."""
    import torch

    if not torch.cuda.is_available():
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


class Engine:
    """Batched, hooked prefill and sampling over a loaded model, with per-session KV reuse.

    Parameters
    ----------
    lm : LoadedModel
        From :func:`synclib.models.load_model`.
    batch_size : int, default 16
        Most rows per forward pass.  On out-of-memory a batch is retried in halves and the
        cap is lowered for later calls (``self.batch_size``).
    kv_reuse : bool, default True
        Keep each session's prompt keys/values and prefill only the new suffix.
    max_cache_bytes : int or CacheBudget, optional
        Budget of the session caches in bytes, or a :class:`synclib.memory.CacheBudget`
        that several engines share (a model pair's two engines in a simulation).  A session
        that does not fit is not stored and its next prompt is prefilled whole (counted in
        ``stats["cache_skips"]``); the resident ones stay until forgotten or replaced.
        (Dialog turns visit their sessions in a cycle, and dropping the least recently used
        one would drop exactly the one the next turn needs: over budget, LRU reuses nothing
        while this keeps the share that fits.)
        Default: on the CPU :func:`synclib.memory.session_budget` (a quarter of the memory
        available, 256 MiB to 4 GiB); on CUDA a quarter of the device memory that is free
        when the engine is created (after its model is loaded), so that two engines of a
        model pair and their live batches fit beside each other.
    decode : {"auto", "graph", "static", "dynamic"}, default "auto"
        How the decoding steps run.  ``"dynamic"``: the cache and mask grow by a column per
        step and finished rows leave the batch every ``sync_every`` steps (best on the CPU,
        where a step's cost follows the rows).  ``"static"``: preallocated keys/values and
        mask, fixed shapes, steps run eagerly (:class:`_StaticDecoder`).  ``"graph"``: as
        ``"static"``, each step one CUDA-graph replay (falls back to eager steps where the
        capture fails, counted in ``stats["graph_fallbacks"]``).  ``"auto"``: ``"graph"`` on
        CUDA for models it supports (every layer full attention through ``sdpa`` or
        ``eager``), else ``"dynamic"``.  All give the same tokens up to float rounding.

    Attributes
    ----------
    stats : collections.Counter
        ``prefill_tokens`` (tokens run through prefill, padding excluded),
        ``prefill_computed`` (token positions computed in prefill, left padding included:
        ``prefill_tokens / prefill_computed`` is the useful share), ``reused_tokens`` (prompt tokens taken from session caches), ``generated_tokens``,
        ``forward_calls``, ``oom_retries``, ``cache_skips`` (sessions not stored: the
        budget was full), ``recomputed_tokens`` (prompt tokens prefilled again because their
        session was not stored), ``graph_steps`` (decoding steps replayed as a
        CUDA graph), ``graph_fallbacks`` (batches whose capture failed); with a
        :class:`DecodeStream`, ``decode_steps``, ``stream_joins`` and ``slot_allocations``.
    """

    def __init__(self, lm, batch_size: int = 16, kv_reuse: bool = True,
                 max_cache_bytes: "int | CacheBudget | None" = None, decode: str = "auto"):
        import torch

        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
        if decode in ("graph", "static") and not _StaticDecoder.supports(lm.model):
            raise ValueError(f"decode={decode!r} needs a model whose every layer attends to the full context "
                             f"through sdpa or eager attention; {lm.name} does not (use 'dynamic' or 'auto')")
        if decode == "auto":
            decode = "graph" if lm.device.type == "cuda" and _StaticDecoder.supports(lm.model) else "dynamic"
        #: the decoding mode in use ("graph", "static" or "dynamic"; see the ``decode`` parameter)
        self.decode = decode
        #: the last CUDA graph capture failure (``"TypeName: message"``), None if none failed
        self.graph_error: str | None = None
        self.lm = lm
        self.batch_size = int(batch_size)
        self.kv_reuse = bool(kv_reuse)
        if max_cache_bytes is None:
            if lm.device.type == "cuda":
                max_cache_bytes = int(0.25 * torch.cuda.mem_get_info(lm.device)[0])
            else:
                max_cache_bytes = session_budget("auto")
        if lm.device.type == "cpu":
            return_freed_memory()
        #: the session caches' budget (:class:`synclib.memory.CacheBudget`, possibly shared)
        self.budget = max_cache_bytes if isinstance(max_cache_bytes, CacheBudget) else CacheBudget(max_cache_bytes)
        self.stats: Counter = Counter()
        self._sessions: OrderedDict = OrderedDict()
        self._cache_bytes = 0  # this engine's share of the budget
        self._skipped: dict = {}  # session -> token ids of the prompt the budget could not hold
        self._handed_over = 0  # sessions whose prefix a prefill batch took over (see _prefill_group)
        self._lines = None  # per-token line-break flags, see _line_flags
        self._work = None  # the CPU's sampling buffers, see _sample_work
        #: decoding steps between the host's checks for finished rows (None: 1 on CPU, 8 on GPUs)
        self.sync_every: int | None = None
        params = inspect.signature(lm.model.forward).parameters
        self._logits_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    # -- session cache ---------------------------------------------------------------
    @property
    def max_cache_bytes(self) -> int:
        """The session caches' budget in bytes (shared with the budget's other engines)."""
        return self.budget.limit

    def forget(self, session: Hashable) -> None:
        """Drop the cached keys/values of ``session`` (call when an episode ends)."""
        self._skipped.pop(session, None)
        s = self._sessions.pop(session, None)
        if s is not None:
            self._cache_bytes -= s.nbytes
            self.budget.give(s.nbytes)

    def clear(self) -> None:
        """Drop every session cache."""
        self._sessions.clear()
        self._skipped.clear()
        self.budget.give(self._cache_bytes)
        self._cache_bytes = 0

    @property
    def cached_sessions(self) -> int:
        """Number of sessions holding keys/values."""
        return len(self._sessions)

    def _store(self, session, ids, kv) -> None:
        self.forget(session)
        nbytes = sum(k.numel() * k.element_size() * 2 for k, _ in kv)
        if not self.budget.take(nbytes):
            self.stats["cache_skips"] += 1
            self._skipped[session] = list(ids)
            return
        self._sessions[session] = _Session(list(ids), kv, nbytes)
        self._cache_bytes += nbytes

    # -- core: one batched prefill with hooks ----------------------------------------
    def _ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.lm.encode(prompt)
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("empty prompt (no tokens)")
        return ids

    @contextmanager
    def _hooks(self, sink: list):
        """Register forward hooks that append each layer's last-column output to ``sink``."""
        def hook(_module, _inputs, output):
            hidden = output[0] if isinstance(output, (tuple, list)) else output
            sink.append(hidden[:, -1, :].detach().float())

        handles = [layer.register_forward_hook(hook) for layer in self.lm.decoder_layers]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _cached(self, ids: list, session) -> tuple[_Session | None, int]:
        """The session's cache entry and how many of ``ids`` it holds (at most all but one)."""
        s = self._sessions.get(session) if (self.kv_reuse and session is not None) else None
        return s, (min(_common_prefix(ids, s.ids), len(ids) - 1) if s is not None else 0)

    def _recomputed(self, ids: list, session) -> int:
        """Tokens of ``ids`` a session cache would have held had the budget had room."""
        old = self._skipped.get(session) if (self.kv_reuse and session is not None) else None
        return min(_common_prefix(ids, old), len(ids) - 1) if old is not None else 0

    def _prefill(self, rows: list[tuple[list, Hashable]], store: bool = True) -> _Prefill:
        """Prefill ``rows`` (token ids, session); update their sessions.

        Rows whose new-token counts differ a lot (a session cache missed beside rows that
        hit theirs) are prefilled in separate padded groups (:func:`_prefill_groups`) and
        merged, left-padded, into one batch for decoding: in one group every row would
        compute as many tokens as the longest new segment, so a single miss would undo the
        batch's prefix reuse.
        """
        new = [len(ids) - self._cached(ids, session)[1] for ids, session in rows]
        groups = _prefill_groups(new)
        if len(groups) == 1:
            return self._prefill_group(rows, store)
        self.stats["prefill_splits"] += len(groups) - 1
        return _merge_prefills([self._prefill_group([rows[i] for i in g], store) for g in groups], groups)

    def _prefill_group(self, rows: list[tuple[list, Hashable]], store: bool = True) -> _Prefill:
        """Prefill ``rows`` (token ids, session) in one padded batch; update their sessions
        (with ``store``; else the sessions are only read)."""
        import torch
        from transformers import DynamicCache

        dev = self.lm.device
        B = len(rows)
        cached, avail = [], []
        for ids, session in rows:
            s, a = self._cached(ids, session)
            if s is not None:
                self._sessions.move_to_end(session)
            avail.append(a)
            cached.append(s)
        # Gap-free layout: every row's new tokens end at the last column and its cached
        # prefix ends where the new segment starts; a row re-reads cached tokens rather
        # than leaving a hole, so only the left edge is padded.
        S = max(len(ids) - a for (ids, _), a in zip(rows, avail))
        reused = [max(0, len(ids) - S) for ids, _ in rows]
        P = max(reused)

        input_ids = torch.full((B, S), self.lm.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, P + S), dtype=torch.long)
        for i, ((ids, _), p) in enumerate(zip(rows, reused)):
            suffix = ids[p:]
            input_ids[i, S - len(suffix):] = torch.tensor(suffix)
            mask[i, P + S - len(ids):] = 1
        mask = mask.to(dev)
        input_ids = input_ids.to(dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)

        if P > 0:
            ref = next(s for s, p in zip(cached, reused) if p > 0).kv
            layers = []
            for li in range(len(ref)):
                k = ref[li][0].new_zeros((B, ref[li][0].shape[1], P, ref[li][0].shape[3]))
                v = ref[li][1].new_zeros((B, ref[li][1].shape[1], P, ref[li][1].shape[3]))
                for i, (s, p) in enumerate(zip(cached, reused)):
                    if p > 0:
                        k[i, :, P - p:] = s.kv[li][0][0, :, :p]
                        v[i, :, P - p:] = s.kv[li][1][0, :, :p]
                layers.append((k, v))
            del ref
            cache = DynamicCache(ddp_cache_data=layers)
        else:
            cache = DynamicCache()
        if self.kv_reuse and store:
            # the batch holds their prefixes now and each row's session is stored anew below:
            # dropping them first keeps one copy of the prefixes resident, not two
            for (_, session), s in zip(rows, cached):
                if s is not None:
                    self.forget(session)
                    self._handed_over += 1
        del cached

        sink: list = []
        with torch.inference_mode(), self._hooks(sink):
            out = self.lm.model(input_ids=input_ids, attention_mask=mask,
                                position_ids=positions[:, P:], past_key_values=cache,
                                use_cache=True, **self._logits_kw)
        cache = out.past_key_values
        self.stats["forward_calls"] += 1
        self.stats["prefill_tokens"] += sum(len(ids) - p for (ids, _), p in zip(rows, reused))
        self.stats["prefill_computed"] += B * S  # with the left padding: prefill_tokens / this = useful share
        self.stats["reused_tokens"] += sum(reused)
        self.stats["recomputed_tokens"] += sum(self._recomputed(ids, session) for ids, session in rows)
        states = torch.stack(sink, dim=1).cpu().numpy()  # (B, L, D)

        if self.kv_reuse and store:
            for i, (ids, session) in enumerate(rows):
                if session is None:
                    continue
                keep = mask[i].bool()
                # boolean indexing copies: the session owns its tensors
                kv = [(layer.keys[i:i + 1][:, :, keep], layer.values[i:i + 1][:, :, keep])
                      for layer in cache.layers]
                self._store(session, ids, kv)
        logits = out.logits[:, -1, :].float()
        return _Prefill(logits=logits, states=states, cache=cache, mask=mask,
                        next_pos=positions[:, -1] + 1, reused=reused)

    def _batched(self, items: list, fn: Callable[[list], list]) -> list:
        """Apply ``fn`` to chunks of ``items`` (at most ``batch_size``).

        On out-of-memory the session caches are dropped first (they only save prefill
        work; the chunk's own were handed over to its batch already) and the chunk is
        retried at the same size; if it fails again, in halves, and the lower cap is kept
        for later calls.  Results do not change: a row's
        outputs do not depend on its batch or on what was cached.
        """
        import torch

        out: list = []
        start = 0
        while start < len(items):
            chunk = items[start:start + self.batch_size]
            handed_over = self._handed_over
            try:
                out.extend(fn(chunk))
                start += len(chunk)
            except Exception as exc:  # noqa: BLE001 - only OOM is handled
                if not _is_oom(exc):
                    raise
                self.stats["oom_retries"] += 1
                if self._sessions or self._handed_over > handed_over:
                    self.stats["oom_cache_drops"] += 1
                    self.clear()
                elif len(chunk) == 1:
                    raise
                else:
                    self.batch_size = max(1, len(chunk) // 2)
                del exc
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        return out

    def _run_rows(self, prompts: Sequence, sessions: Sequence | None,
                  fn: Callable[[list, list], list]) -> list:
        """Apply ``fn`` to the prompts in engine order and batches; results in prompt order.

        Parameters
        ----------
        prompts : sequence of P str or token-id lists
        sessions : sequence of P hashable, or None (no reuse)
        fn : callable
            ``fn(chunk, rows) -> list``: ``chunk`` the prompts' indices in one batch,
            ``rows`` their ``(token ids, session)``; one result per row.

        Returns
        -------
        list of P results.
        """
        ids = [self._ids(p) for p in prompts]
        sessions = list(sessions) if sessions is not None else [None] * len(ids)
        if len(sessions) != len(ids):
            raise ValueError(f"sessions has {len(sessions)} entries for {len(ids)} prompts")
        order = self._order(ids, sessions)
        res = self._batched(order, lambda chunk: fn(chunk, [(ids[i], sessions[i]) for i in chunk]))
        out: list = [None] * len(ids)
        for i, r in zip(order, res):
            out[i] = r
        return out

    def _order(self, ids_list: list[list], sessions: Sequence) -> list[int]:
        """Row order that groups rows with similar new-token counts (most first), then length."""
        def new_tokens(i):
            s = self._sessions.get(sessions[i]) if (self.kv_reuse and sessions[i] is not None) else None
            return len(ids_list[i]) - (_common_prefix(ids_list[i], s.ids) if s is not None else 0)

        return sorted(range(len(ids_list)), key=lambda i: (-new_tokens(i), -len(ids_list[i])))

    # -- public API --------------------------------------------------------------------
    def read_states(self, prompts: Sequence, sessions: Sequence | None = None) -> np.ndarray:
        """Prefill only; the states at the last prompt token (the passive reader).

        Parameters
        ----------
        prompts : sequence of str or sequence of token-id lists
            Chat-formatted prompts (:meth:`LoadedModel.chat_prompt`) or their token ids.
        sessions : sequence of hashable, optional
            Session key per prompt for KV reuse (``None`` entries: no reuse).

        Returns
        -------
        numpy.ndarray
            ``(len(prompts), n_layers, d_model)`` float32.
        """
        states = self._run_rows(prompts, sessions, lambda chunk, rows: list(self._prefill(rows).states))
        out = np.empty((len(states), self.lm.n_layers, self.lm.d_model), dtype=np.float32)
        for i, st in enumerate(states):
            out[i] = st
        return out

    def generate(self, requests: Sequence[Request], max_new_tokens: int = 300,
                 temperature: float = 0.7, on_step: Callable[[int], None] | None = None,
                 first_line_only: bool = False, top_k: int | None = None,
                 top_p: float | None = None) -> list[Result]:
        """Sample a reply for every request; record its last-prompt-token states.

        Parameters
        ----------
        requests : sequence of Request
            Prompts with their seeds and sessions.
        max_new_tokens : int, default 300
        temperature : float, default 0.7
            0 means greedy decoding.
        top_k, top_p : optional
            Keep only the ``top_k`` most likely tokens, then the smallest set whose
            probability reaches ``top_p``, as ``transformers``' top-k and top-p warpers do
            (see :func:`sampling_distribution`); None (or 0, or top_p 1.0) leaves them off.
        on_step : callable, optional
            Called after every decoding step with the number of tokens generated in that
            step (for progress bars).
        first_line_only : bool, default False
            Stop a row as soon as its text holds a complete first line: a token with a
            line break after some non-whitespace text (that token is kept).  For callers
            that keep only the first line of the stripped reply (the dialog's clean-up):
            the tokens after it could not change what they keep, and each row's random
            stream is its own, so the kept text is the same as without the stop.

        Returns
        -------
        list of Result
            In the order of ``requests``.
        """
        _check_sampling(max_new_tokens, temperature, top_k, top_p)
        sampling = (temperature, top_k, top_p)
        reqs = list(requests)
        return self._run_rows([r.prompt for r in reqs], [r.session for r in reqs],
                              lambda chunk, rows: self._generate_batch(
                                  [ids for ids, _ in rows], [reqs[i] for i in chunk], max_new_tokens,
                                  sampling, on_step, first_line_only))

    def stream(self, max_new_tokens: int = 300, temperature: float = 0.7, first_line_only: bool = False,
               top_k: int | None = None, top_p: float | None = None, capacity: int | None = None,
               join_min: int | None = None, on_step: Callable[[int], None] | None = None,
               decode: str | None = None) -> "DecodeStream":
        """A :class:`DecodeStream` over this engine: continuous batching of generation rows.

        The arguments are :meth:`generate`'s; ``capacity`` (default ``batch_size``),
        ``join_min`` and ``decode`` (default: the engine's own mode, so ``"dynamic"`` on
        the CPU and ``"graph"`` on CUDA for the models that allow it) are
        :class:`DecodeStream`'s.  The slot modes are tested against the dynamic one on the
        CPU and, with CUDA graphs, on a GPU (``tests/test_engine_cuda.py``); their speed there is
        in ``bench/gpu_notes.md``.
        """
        _check_sampling(max_new_tokens, temperature, top_k, top_p)
        return DecodeStream(self, max_new_tokens, (temperature, top_k, top_p), first_line_only,
                            capacity or self.batch_size, join_min, on_step, decode or self.decode)

    def _sample_work(self, vocab: int) -> _SampleWork | None:
        """The buffers the CPU's sampling steps work in (:class:`_SampleWork`), kept; None on
        other devices, whose allocators keep freed blocks for the next step themselves."""
        if self.lm.device.type != "cpu":
            return None
        if self._work is None or self._work.V != vocab:
            self._work = _SampleWork(vocab)
        return self._work

    def _line_flags(self, vocab: int):
        """Per token id, as bool tensors of length ``vocab`` on the model's device: holds a
        line break; has text before its first break; has any text.

        "Text" is non-whitespace, decoded token by token without special tokens; ids
        beyond the tokenizer (padded embeddings) have none of the three.  Cached.
        """
        import torch

        if self._lines is None or self._lines[0].numel() != vocab:
            tok = self.lm.tokenizer
            pieces = tok.batch_decode([[i] for i in range(len(tok))], skip_special_tokens=True)[:vocab]
            pad = [False] * (vocab - len(pieces))
            flags = ([("\n" in p) for p in pieces], [bool(p.split("\n", 1)[0].strip()) for p in pieces],
                     [bool(p.strip()) for p in pieces])
            self._lines = tuple(torch.tensor(f + pad, dtype=torch.bool, device=self.lm.device) for f in flags)
        return self._lines

    def _generate_batch(self, ids, reqs, max_new_tokens, sampling, on_step, first_line_only=False
                        ) -> list[Result]:
        """Prefill and decode one batch.

        The decoding loop keeps the GPU busy: sampling, stop and line checks and the
        bookkeeping are tensor operations on the device, and the host learns which rows
        have finished only every ``sync_every`` steps (every step on the CPU, where it
        costs nothing), when finished rows leave the batch.  A finished row that is still
        in the batch until then decodes tokens that are never kept.
        """
        import torch

        dev = self.lm.device
        B = len(reqs)
        # each row's uniforms for the whole reply, drawn up front from its own generator
        # (the same numbers, in the same order, as one draw per step)
        gens = [torch.Generator(device="cpu").manual_seed(int(r.seed) & ((1 << 63) - 1)) for r in reqs]
        U = torch.stack([torch.rand(max_new_tokens, generator=g, dtype=torch.float64) for g in gens]).to(dev)
        pre = self._prefill([(x, r.session) for x, r in zip(ids, reqs)])
        stop = torch.tensor(sorted(self.lm.stop_token_ids), dtype=torch.long, device=dev)
        cache, mask, pos, logits = pre.cache, pre.mask, pre.next_pos, pre.logits
        lines = self._line_flags(logits.shape[-1]) if first_line_only else None
        work = self._sample_work(logits.shape[-1])
        out_tok = torch.full((B, max_new_tokens), -1, dtype=torch.long, device=dev)
        reason = torch.zeros(B, dtype=torch.long, device=dev)     # 0 length, 1 stop, 2 line
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        seen = torch.zeros(B, dtype=torch.bool, device=dev)       # some text generated so far
        rows = torch.arange(B, device=dev)                         # original row of each batch row
        sync_every = self.sync_every or (1 if dev.type == "cpu" else 8)
        static = None
        if self.decode != "dynamic" and max_new_tokens > 1:
            # each capture gets its own memory pool: a pool shared through a bare handle is
            # released with its last graph and trips the allocator's assert when reused
            static = _StaticDecoder(self.lm.model, pre, max_new_tokens - 1, graph=self.decode == "graph",
                                    logits_kw=self._logits_kw)
            if self.decode == "graph" and not static.captured:
                self.stats["graph_fallbacks"] += 1
                if self.graph_error is None:
                    warnings.warn(f"CUDA graph capture failed for a batch of {B} rows; its decoding steps "
                                  f"run eagerly (same numbers, slower): {static.error}", RuntimeWarning,
                                  stacklevel=3)
                self.graph_error = static.error
            cache = pre.cache = None  # the decoder holds its own copy
        elif dev.type == "cpu" and max_new_tokens > 1:
            with_room(cache, max_new_tokens - 1)  # no allocation per step (CUDA's allocator caches blocks)
        for step in range(max_new_tokens):
            tok = _sample(logits, U[rows, step], sampling, work)
            keep, is_stop, at_line, seen[rows] = _row_ends(tok, ~done[rows], seen[rows], stop, lines)
            out_tok[rows, step] = torch.where(keep, tok, -1)
            reason[rows] = torch.where(is_stop, 1, torch.where(at_line, 2, reason[rows]))
            done[rows] = done[rows] | is_stop | at_line
            self.stats["generated_tokens"] += rows.numel()
            self.stats["decode_steps"] += 1
            if on_step is not None:
                on_step(rows.numel())
            if step == max_new_tokens - 1:
                break
            if step % sync_every == sync_every - 1 or sync_every == 1:
                still = (~done[rows]).nonzero().flatten()  # the host waits for the device here
                if still.numel() == 0:
                    break
                if static is None and still.numel() < rows.numel():
                    cache.batch_select_indices(still)
                    mask, pos, tok, rows = mask[still], pos[still], tok[still], rows[still]
            self.stats["forward_calls"] += 1
            if static is not None:
                logits = static.step(tok)
                self.stats["graph_steps"] += static.captured
                continue
            mask = torch.cat([mask, mask.new_ones((rows.numel(), 1))], dim=1)
            with torch.inference_mode():
                out = self.lm.model(input_ids=tok.unsqueeze(-1), attention_mask=mask,
                                    position_ids=pos.unsqueeze(-1), past_key_values=cache,
                                    use_cache=True, **self._logits_kw)
            cache, logits, pos = out.past_key_values, out.logits[:, -1, :].float(), pos + 1
        toks, why = out_tok.cpu().tolist(), reason.cpu().tolist()
        names = ("length", "stop", "line")
        results = []
        for i in range(B):
            gen = [t for t in toks[i] if t >= 0]
            results.append(Result(text=self.lm.decode(gen), token_ids=gen, prompt_ids=ids[i],
                                  states=pre.states[i], finish_reason=names[why[i]], reused_tokens=pre.reused[i]))
        return results

    def sequence_logprobs(self, prompts: Sequence, sequences: Sequence[Sequence[Sequence[int]]],
                          sessions: Sequence | None = None, store: bool = True) -> list[np.ndarray]:
        """Log-probability of each candidate token sequence right after each prompt.

        ``log P(seq | prompt)`` by teacher forcing: the first token's probability is read
        from the prompt's prefill, the later ones from feeding the sequence over the
        prefill's keys/values (:func:`continuation_logprobs`; a sequence's proper prefixes
        are fed once per row).  Nothing is normalised: a candidate that is a token prefix
        of another (``"1"`` and ``"10"``) is not told apart from it; end each sequence with
        a terminator (the constrained judge appends the end-of-turn token) or use
        :meth:`word_distributions` for that.  This is the engine's one scorer of
        multi-token candidates.

        Parameters
        ----------
        prompts : sequence of P str or token-id lists
            Prompts the sequences continue (chat-formatted text, or token ids).
        sequences : sequence of P sequences of non-empty token-id sequences
            ``sequences[i]`` are the candidates of prompt ``i`` (any number, may differ
            between prompts).
        sessions : sequence of P hashable, optional
            Session key per prompt for KV reuse.  Several rows may name the same session,
            e.g. one prefilled beforehand (:meth:`read_states`) with the prompts' shared
            prefix, so that the prefix is computed once (as in every method, each row then
            stores its own prompt there: the last one stays).
        store : bool, default True
            Store each row's prompt in its session; False only reads the sessions (a
            caller that scores an older prompt of a session whose newer prompt is cached).

        Returns
        -------
        list of P numpy.ndarray
            ``out[i]`` is float64 of shape ``(len(sequences[i]),)``: the natural-log
            probability of ``sequences[i][j]`` after ``prompts[i]``.
        """
        prompts = list(prompts)
        if len(sequences) != len(prompts):
            raise ValueError(f"sequences has {len(sequences)} entries for {len(prompts)} prompts")
        seqs = [[tuple(int(t) for t in seq) for seq in row] for row in sequences]
        for i, row in enumerate(seqs):
            for j, seq in enumerate(row):
                if not seq:
                    raise ValueError(f"sequences[{i}][{j}] is empty (no tokens)")
        return self._run_rows(prompts, sessions,
                              lambda chunk, rows: self._logprob_batch(rows, [seqs[i] for i in chunk], store))

    def _logprob_batch(self, rows, seqs, store: bool = True) -> list[np.ndarray]:
        """:meth:`sequence_logprobs` of one batch: ``rows`` (token ids, session), ``seqs`` per row."""
        import torch

        pre = self._prefill(rows, store)
        logp_first = torch.log_softmax(pre.logits, dim=-1)  # (B, V)
        items = [(b, s) for b, row in enumerate(seqs) for s in row]
        rest, calls = continuation_logprobs(self.lm.model, pre.cache, pre.mask, pre.next_pos, items,
                                            self.lm.pad_token_id, self.batch_size)
        self.stats["forward_calls"] += calls
        first = np.zeros(len(items))
        if items:  # one gather and one copy to the host for all first tokens
            b_idx = torch.tensor([b for b, _ in items], device=logp_first.device)
            t_idx = torch.tensor([s[0] for _, s in items], device=logp_first.device)
            first = logp_first[b_idx, t_idx].double().cpu().numpy()
        out, k = [], 0
        for row in seqs:
            out.append(np.array([first[k + j] + rest[k + j] for j in range(len(row))], dtype=np.float64))
            k += len(row)
        return out

    def word_distributions(self, prompts: Sequence, candidates: Sequence[str],
                           sessions: Sequence | None = None, return_mass: bool = False, store: bool = True):
        """Probabilities over candidate words at the next position of each prompt.

        Each candidate is scored by the probability that the model's continuation spells
        it, as is or with a leading space (see :func:`candidate_sequences`); a candidate of
        several tokens is scored by teacher forcing (product of its tokens' probabilities,
        :meth:`sequence_logprobs`).  When one candidate's tokens are a prefix of another's
        (``"1"`` and ``"10"`` under a digit-splitting tokenizer), the longer candidates'
        probability is subtracted from the shorter one's, so that ``"1"`` means "1 and not
        10".  The scores are then normalised over the candidates.  With single-token
        candidates this is exactly the softmax restricted to the candidates' first tokens.

        Parameters
        ----------
        prompts : sequence of P str or token-id lists
            Prompts whose next token is the candidate word (chat-formatted, plus any text
            already generated, e.g. ``"Joy."`` before a second word).
        candidates : sequence of C str
            Distinct candidate words, e.g. ``["yes", "no"]`` or ``[str(i) for i in range(11)]``.
        sessions : sequence of P hashable, optional
            Session key per prompt for KV reuse.
        return_mass : bool, default False
            Also return the unnormalised total probability of the candidates (how much of
            the model's next-token distribution they cover).
        store : bool, default True
            As :meth:`sequence_logprobs`.

        Returns
        -------
        numpy.ndarray
            ``(P, C)`` float64, rows summing to 1 (NaN rows when the candidates have zero
            probability); with ``return_mass``, also ``(P,)``.
        """
        seqs = candidate_sequences(self.lm.tokenizer, candidates)
        all_seqs = sorted({s for variants in seqs for s in variants})
        prompts = list(prompts)
        logps = self.sequence_logprobs(prompts, [all_seqs] * len(prompts), sessions, store)
        longer = _immediate_extensions(all_seqs)
        probs = np.empty((len(prompts), len(candidates)))
        mass = np.empty(len(prompts))
        for i, logp in enumerate(logps):
            probs[i], mass[i] = _exclusive_probabilities(logp, all_seqs, longer, seqs)
        return (probs, mass) if return_mass else probs


@dataclass
class _StreamRow:
    """One row of a :class:`DecodeStream` (host side); ``pos`` is where its batch keeps it."""

    tag: Hashable
    request: Request
    ids: list
    states: np.ndarray
    reused: int
    pos: int = -1
    tokens: list = field(default_factory=list)


class _DynamicRows:
    """A stream's rows as one growing batch: a join merges the new rows' prefill, left
    padded, after the others (:func:`_merge_prefills`); a leave selects the rows that stay
    and drops the leading columns nobody attends to any more (counted in the stream's
    ``stats["trims"]``).  Positions are the rows' order in the batch."""

    def __init__(self, engine: "Engine", stats: Counter):
        self.engine, self.stats, self.pre = engine, stats, None

    def add(self, pre: _Prefill) -> list[int]:
        B0 = 0 if self.pre is None else self.pre.mask.shape[0]
        if self.pre is None:
            self.pre = pre
        else:
            self.pre.states = np.zeros((B0,) + pre.states.shape[1:], dtype=pre.states.dtype)  # kept per row
            self.pre = _merge_prefills([self.pre, pre], [list(range(B0)), list(range(B0, B0 + len(pre.reused)))])
        return list(range(B0, B0 + pre.mask.shape[0]))

    def logits_of(self, pos: list[int]):
        """The next-token logits ``(len(pos), V)`` of the rows at ``pos``."""
        return self.pre.logits if pos == list(range(self.pre.mask.shape[0])) else self.pre.logits[pos]

    def keep(self, pos: list[int]) -> list[int]:
        import torch

        if not pos:
            self.pre = None
            return []
        if len(pos) < self.pre.mask.shape[0]:
            pre = self.pre
            idx = torch.tensor(pos, device=pre.mask.device)
            pre.cache.batch_select_indices(idx)
            pre.mask, pre.next_pos, pre.logits = pre.mask[idx], pre.next_pos[idx], pre.logits[idx]
            self._trim()
        return list(range(len(pos)))

    def _trim(self) -> None:
        """Drop the leading columns no remaining row attends to (left by rows that left)."""
        pre = self.pre
        used = pre.mask.any(0).nonzero()
        first = int(used[0]) if used.numel() else 0
        if first == 0 or first < pre.mask.shape[1] // 4:  # not worth a copy yet
            return
        for layer in pre.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, first:].contiguous(), layer.values[:, :, first:].contiguous()
        pre.mask = pre.mask[:, first:]
        self.stats["trims"] += 1

    def feed(self, pos: list[int], tok) -> None:
        """One forward pass over every row (``pos`` is all of them, in order) fed ``tok``."""
        import torch

        pre = self.pre
        pre.mask = torch.cat([pre.mask, pre.mask.new_ones((len(pos), 1))], dim=1)
        with torch.inference_mode():
            out = self.engine.lm.model(input_ids=tok.unsqueeze(-1), attention_mask=pre.mask,
                                       position_ids=pre.next_pos.unsqueeze(-1), past_key_values=pre.cache,
                                       use_cache=True, **self.engine._logits_kw)
        pre.cache, pre.logits, pre.next_pos = out.past_key_values, out.logits[:, -1, :].float(), pre.next_pos + 1
        self.engine.stats["forward_calls"] += 1


class _SlotRows:
    """A stream's rows in fixed slots, so that every decoding step has the same shapes (and,
    on CUDA, can be one CUDA-graph replay, as :class:`_StaticDecoder` does for a batch).

    Per layer ``(capacity, H, T, Dh)`` keys and values and a boolean ``(capacity, 1, 1, T)``
    mask.  A joining row's prefill (left padded, ``W`` columns) is copied into a free slot's
    first ``W`` columns; every step writes each slot's new key and value at that slot's own
    next column (``col``) and opens it in the mask; a leaving row only frees its slot.  Free
    slots run too (fixed shapes): they attend to their column 0 only and never advance.
    ``T`` is the longest prefill so far plus ``max_new_tokens``, rounded up to 256; a longer
    prefill re-allocates (and re-captures).  Only for models that :class:`_StaticDecoder`
    supports (every layer full attention through ``sdpa`` or ``eager``).  Positions are
    slot numbers.
    """

    ROUND = 256

    def __init__(self, engine: "Engine", capacity: int, max_new_tokens: int, graph: bool):
        self.engine, self.capacity, self.max_new_tokens = engine, capacity, max_new_tokens
        self.graph_wanted = graph
        self.T = 0
        self.free = list(range(capacity))
        self.keys = self.values = None
        self.graph = None
        self.captured = False
        self.error: str | None = None

    # -- the cache interface the model calls ----------------------------------------
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # scatter_ along the column dim: no advanced indexing, nothing a CUDA graph cannot capture
        idx = self.col.view(-1, 1, 1, 1).expand(-1, key_states.shape[1], 1, key_states.shape[3])
        self.keys[layer_idx].scatter_(2, idx, key_states)
        self.values[layer_idx].scatter_(2, idx, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    # -- buffers ----------------------------------------------------------------------
    def _allocate(self, T: int, like: _Prefill) -> None:
        """Buffers of ``T`` columns (the old contents copied over), then the step's capture."""
        import torch

        old = None if self.keys is None else (self.keys, self.values, self.allowed, self.col, self.pos,
                                              self.active, self.tok, self.logits)
        dev, C = like.mask.device, self.capacity
        self.keys = [layer.keys.new_zeros((C, layer.keys.shape[1], T, layer.keys.shape[3])) for layer in like.cache.layers]
        self.values = [layer.values.new_zeros((C, layer.values.shape[1], T, layer.values.shape[3]))
                       for layer in like.cache.layers]
        self.allowed = torch.zeros((C, 1, 1, T), dtype=torch.bool, device=dev)
        self.allowed[:, 0, 0, 0] = True  # a free slot attends to its column 0: no empty softmax
        self.col = torch.zeros(C, dtype=torch.long, device=dev)
        self.pos = torch.zeros(C, dtype=torch.long, device=dev)
        self.active = torch.zeros(C, dtype=torch.bool, device=dev)
        self.tok = torch.zeros(C, dtype=torch.long, device=dev)
        self.logits = torch.zeros((C, like.logits.shape[1]), dtype=torch.float32, device=dev)
        if old is not None:
            keys, values, allowed, col, pos, active, tok, logits = old
            T0 = allowed.shape[-1]
            for dst, src in zip(self.keys + self.values, keys + values):
                dst[:, :, :T0] = src
            self.allowed[..., :T0] = allowed
            for dst, src in ((self.col, col), (self.pos, pos), (self.active, active), (self.tok, tok),
                             (self.logits, logits)):
                dst.copy_(src)
        self.T = T
        self.engine.stats["slot_allocations"] += 1
        self.eager_dtype = _eager_dtype(self.engine.lm.model)
        self.graph, self.captured = None, False
        if self.graph_wanted and dev.type == "cuda":
            self._capture()

    def _forward(self) -> None:
        # (a Python scalar assigned through advanced indexing becomes a host-to-device copy,
        # which a CUDA graph capture refuses; scatter_ takes the scalar as an argument)
        self.allowed[:, 0, 0, :].scatter_(1, self.col[:, None], True)
        mask = self.allowed
        if self.eager_dtype is not None:  # eager attention adds its mask to the scores
            mask = _additive_mask(mask, self.keys[0].dtype, self.eager_dtype)
        out = self.engine.lm.model(input_ids=self.tok[:, None], attention_mask=mask, position_ids=self.pos[:, None],
                                   past_key_values=self, use_cache=True, **self.engine._logits_kw)
        self.logits.copy_(out.logits[:, -1, :])
        step = self.active.long()
        self.col.add_(step)
        self.pos.add_(step)

    def _capture(self) -> None:
        """Capture one step (:func:`_capture_step`), the warm-up undone from a copy of the
        buffers the step writes besides the cache."""
        saved = [t.clone() for t in (self.allowed, self.col, self.pos, self.logits)]

        def restore():
            for dst, src in zip((self.allowed, self.col, self.pos, self.logits), saved):
                dst.copy_(src)

        self.graph, self.error = _capture_step(self._forward, restore)
        self.captured = self.graph is not None
        if not self.captured:
            self.engine.stats["graph_fallbacks"] += 1
            if self.engine.graph_error is None:
                warnings.warn(f"CUDA graph capture failed for the stream's {self.capacity} slots; its decoding "
                              f"steps run eagerly (same numbers, slower): {self.error}", RuntimeWarning, stacklevel=3)
            self.engine.graph_error = self.error

    # -- the rows ---------------------------------------------------------------------
    def add(self, pre: _Prefill) -> list[int]:
        W = pre.mask.shape[1]
        need = W + self.max_new_tokens
        if need > self.T:
            self._allocate(-(-need // self.ROUND) * self.ROUND, pre)
        slots, self.free = self.free[:pre.mask.shape[0]], self.free[pre.mask.shape[0]:]
        for r, s in enumerate(slots):
            for dst, layer in zip(self.keys, pre.cache.layers):
                dst[s, :, :W] = layer.keys[r]
            for dst, layer in zip(self.values, pre.cache.layers):
                dst[s, :, :W] = layer.values[r]
            self.allowed[s, 0, 0, :] = False
            self.allowed[s, 0, 0, :W] = pre.mask[r].bool()
        idx = slots
        self.col[idx] = W
        self.pos[idx] = pre.next_pos
        self.active[idx] = True
        self.logits[idx] = pre.logits
        return slots

    def logits_of(self, pos: list[int]):
        """The next-token logits ``(len(pos), V)`` of the slots ``pos``."""
        return self.logits[pos]

    def keep(self, pos: list[int]) -> list[int]:
        gone = sorted(set(range(self.capacity)) - set(self.free) - set(pos))
        if gone:
            self.active[gone] = False
            self.col[gone] = 0
            self.allowed[gone] = False
            self.allowed[gone, 0, 0, 0] = True
            self.free = sorted(self.free + gone)
        return pos

    def feed(self, pos: list[int], tok) -> None:
        import torch

        self.tok[pos] = tok
        self.engine.stats["forward_calls"] += 1
        if self.graph is not None:
            self.graph.replay()
            self.engine.stats["graph_steps"] += 1
            return
        with torch.inference_mode(), _decode_attention():
            self._forward()


class DecodeStream:
    """Continuous batching: generation rows that join and leave a decoding batch at any step.

    :meth:`Engine.generate` decodes a batch until its slowest row ends, so every row waits
    for the longest reply.  Here each row leaves the batch at the step it ends and queued
    rows join it: they are prefilled (with their sessions' keys/values reused, as in
    :meth:`Engine.generate`) and added to the running batch.  A caller that turns a
    finished reply into the next request (a dialog's next turn) submits it at once, so the
    batch stays full.  What a row generates does not depend on the batch: it samples with
    its own seeded uniforms, one per token of its own reply, exactly as in
    :meth:`Engine.generate`; its logits and states equal a solo run's up to float rounding.

    Parameters
    ----------
    engine : Engine
    max_new_tokens, sampling, first_line_only
        As :meth:`Engine.generate` (``sampling`` is ``(temperature, top_k, top_p)``).
    capacity : int
        Most rows decoding at once.
    join_min : int, optional
        Queued rows join only when at least this many wait (or the batch is empty): one
        prefill for several rows costs less than one per row.  Default: a quarter of
        ``capacity``.
    on_step : callable, optional
        Called after every decoding step with the number of rows it advanced.
    decode : {"dynamic", "static", "graph"}, default "dynamic"
        How the rows are held.  ``"dynamic"``: one growing batch, joins merged left padded
        and leaves selected out (:class:`_DynamicRows`; best on the CPU).  ``"static"``:
        fixed slots, every step the same shapes (:class:`_SlotRows`), run eagerly;
        ``"graph"``: the same, each step one CUDA-graph replay (CUDA only; a failed capture
        runs eagerly, counted in ``engine.stats["graph_fallbacks"]``).  The slot modes need
        a model :class:`_StaticDecoder` supports.  All give the same tokens up to float
        rounding.

    The host reads each step's tokens.  Counters go to ``engine.stats``
    (``decode_steps``, ``generated_tokens``, ``stream_joins``) as well as :attr:`stats`.
    """

    def __init__(self, engine: "Engine", max_new_tokens: int, sampling: tuple, first_line_only: bool,
                 capacity: int, join_min: int | None = None, on_step=None, decode: str = "dynamic"):
        import torch

        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if decode not in ("dynamic", "static", "graph"):
            raise ValueError(f"decode must be 'dynamic', 'static' or 'graph', got {decode!r}")
        if decode != "dynamic" and not _StaticDecoder.supports(engine.lm.model):
            raise ValueError(f"decode={decode!r} needs a model whose every layer attends to the full context "
                             f"through sdpa or eager attention; {engine.lm.name} does not (use 'dynamic')")
        self.engine, self.lm = engine, engine.lm
        self.max_new_tokens, self.sampling, self.first_line_only = int(max_new_tokens), sampling, first_line_only
        self.capacity = int(capacity)
        self.join_min = max(1, int(join_min) if join_min is not None else self.capacity // 4)
        self.on_step = on_step
        self.decode = decode
        self.stats: Counter = Counter()
        self._queue: list = []          # (tag, Request)
        self._rows: list[_StreamRow] = []
        self._batch = _DynamicRows(engine, self.stats) if decode == "dynamic" else \
            _SlotRows(engine, self.capacity, self.max_new_tokens, graph=decode == "graph")
        dev = self.lm.device
        self._U = torch.zeros((0, self.max_new_tokens), dtype=torch.float64, device=dev)
        self._step = torch.zeros(0, dtype=torch.long, device=dev)
        self._seen = torch.zeros(0, dtype=torch.bool, device=dev)
        self._stop = torch.tensor(sorted(self.lm.stop_token_ids), dtype=torch.long, device=dev)
        self._lines = None

    def submit(self, tag: Hashable, request: Request) -> None:
        """Queue a row; :meth:`step` returns its :class:`Result` with ``tag`` when it ends."""
        self._queue.append((tag, request))

    def __len__(self) -> int:
        """Rows queued or decoding."""
        return len(self._queue) + len(self._rows)

    def _admit(self) -> None:
        """Prefill queued rows and add them to the batch (see ``join_min``)."""
        import torch

        room = self.capacity - len(self._rows)
        if not self._queue or room <= 0 or (self._rows and len(self._queue) < min(self.join_min, room)):
            return
        take, self._queue = self._queue[:room], self._queue[room:]
        eng = self.engine
        ids = [eng._ids(r.prompt) for _, r in take]
        pre = eng._prefill([(x, r.session) for x, (_, r) in zip(ids, take)])
        gens = [torch.Generator(device="cpu").manual_seed(int(r.seed) & ((1 << 63) - 1)) for _, r in take]
        U = torch.stack([torch.rand(self.max_new_tokens, generator=g, dtype=torch.float64) for g in gens])
        states, reused = pre.states, pre.reused
        pos = self._batch.add(pre)
        self._rows += [_StreamRow(tag, r, x, states[i], reused[i], pos[i])
                       for i, ((tag, r), x) in enumerate(zip(take, ids))]
        self._U = torch.cat([self._U, U.to(self._U.device)])
        self._step = torch.cat([self._step, self._step.new_zeros(len(take))])
        self._seen = torch.cat([self._seen, self._seen.new_zeros(len(take))])
        self.stats["joins"] += 1
        eng.stats["stream_joins"] += 1

    def step(self) -> list[tuple[Hashable, Result]]:
        """Admit queued rows, then sample one token for every row and advance the rows that
        go on by one forward pass.

        Returns
        -------
        list of (tag, Result)
            The rows that ended at this step (a stop token, a complete first line with
            ``first_line_only``, or ``max_new_tokens``), in batch order.
        """
        import torch

        self._admit()
        if not self._rows:
            return []
        B = len(self._rows)
        logits = self._batch.logits_of([r.pos for r in self._rows])
        if self.first_line_only and self._lines is None:
            self._lines = self.engine._line_flags(logits.shape[-1])
        u = self._U[torch.arange(B, device=self._U.device), self._step]
        tok = _sample(logits, u, self.sampling, self.engine._sample_work(logits.shape[-1]))
        live = torch.ones(B, dtype=torch.bool, device=tok.device)
        keep, is_stop, at_line, self._seen = _row_ends(tok, live, self._seen, self._stop, self._lines)
        self._step += 1
        ended = is_stop | at_line | (self._step >= self.max_new_tokens)
        toks, kept, why, gone = (tok.tolist(), keep.tolist(),
                                 torch.where(is_stop, 1, torch.where(at_line, 2, 0)).tolist(), ended.tolist())
        for counter in (self.stats, self.engine.stats):
            counter["decode_steps"] += 1
            counter["generated_tokens"] += B
        if self.on_step is not None:
            self.on_step(B)
        finished, stay = [], []
        for i, row in enumerate(self._rows):
            if kept[i]:
                row.tokens.append(toks[i])
            if gone[i]:
                finished.append((row.tag, Result(text=self.lm.decode(row.tokens), token_ids=row.tokens,
                                                 prompt_ids=row.ids, states=row.states,
                                                 finish_reason=("length", "stop", "line")[why[i]],
                                                 reused_tokens=row.reused)))
            else:
                stay.append(i)
        if len(stay) < B:
            new_pos = self._batch.keep([self._rows[i].pos for i in stay])
            self._rows = [self._rows[i] for i in stay]
            for row, p in zip(self._rows, new_pos):
                row.pos = p
            idx = torch.tensor(stay, dtype=torch.long, device=self._U.device)
            self._U, self._step, self._seen = self._U[idx], self._step[idx], self._seen[idx]
            tok = tok[torch.tensor(stay, dtype=torch.long, device=tok.device)]
        if self._rows:
            self._batch.feed([r.pos for r in self._rows], tok)
        return finished

    def run(self) -> list[tuple[Hashable, Result]]:
        """Step until every queued and decoding row has ended; all their results."""
        out = []
        while len(self):
            out += self.step()
        return out


def _immediate_extensions(seqs: list[tuple]) -> dict:
    """``seq -> [its immediate extensions]``: the longer ``seqs`` starting with it, with no
    other of ``seqs`` between them (``"1" -> ["10", "12"]`` but not ``"100"``)."""
    out = {}
    for s in seqs:
        ext = [t for t in seqs if len(t) > len(s) and t[:len(s)] == s]
        out[s] = [t for t in ext if not any(len(s) < len(u) < len(t) and t[:len(u)] == u for u in ext)]
    return out


def _exclusive_probabilities(logp: np.ndarray, all_seqs: list[tuple], longer: dict,
                             variants: list[list[tuple]]) -> tuple[np.ndarray, float]:
    """One row of :meth:`Engine.word_distributions` from its sequences' log-probabilities.

    Parameters
    ----------
    logp : (S,) float64
        ``log P(all_seqs[j])`` after the row's prompt.
    all_seqs : list of S token tuples
    longer : dict from :func:`_immediate_extensions`
    variants : list of C lists of token tuples
        Each candidate's spellings (:func:`candidate_sequences`).

    Returns
    -------
    probs : (C,) float64
        Normalised over the candidates (NaN when they have no probability).
    mass : float
        Their total probability before normalising.
    """
    p = {s: float(np.exp(v)) for s, v in zip(all_seqs, logp)}
    # "s and not a longer candidate": the immediate extensions of s are subtracted from it
    exact = {s: max(0.0, p[s] - sum(p[t] for t in longer[s])) for s in all_seqs}
    scores = np.array([sum(exact[v] for v in spellings) for spellings in variants])
    total = scores.sum()
    return (scores / total if total > 0 else np.full(len(variants), np.nan)), float(total)


# -- one-shot wrappers -----------------------------------------------------------------
def generate(lm, requests: Sequence[Request], max_new_tokens: int = 300, temperature: float = 0.7,
             batch_size: int = 16) -> list[Result]:
    """:meth:`Engine.generate` with a fresh engine (sessions are not kept afterwards)."""
    return Engine(lm, batch_size=batch_size).generate(requests, max_new_tokens, temperature)


def read_states(lm, prompts: Sequence, batch_size: int = 16) -> np.ndarray:
    """Prefill-only states ``(len(prompts), n_layers, d_model)`` float32 (passive reader).

    ``prompts`` are chat-formatted texts (:meth:`LoadedModel.chat_prompt`) or token ids.
    """
    return Engine(lm, batch_size=batch_size, kv_reuse=False).read_states(prompts)


def word_distributions(lm, prompts: Sequence, candidates: Sequence[str], batch_size: int = 16,
                       return_mass: bool = False):
    """:meth:`Engine.word_distributions` with a fresh engine: ``(len(prompts), len(candidates))``."""
    return Engine(lm, batch_size=batch_size, kv_reuse=False).word_distributions(
        prompts, candidates, return_mass=return_mass)
