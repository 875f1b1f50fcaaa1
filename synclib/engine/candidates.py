"""Candidate scoring: teacher-forced log-probabilities of given token sequences after prefilled rows.

Used by the constrained judge (:meth:`Engine.sequence_logprobs`) and the ToM read-out (a stream row's
:class:`~synclib.engine.Probe`).  :func:`continuation_logprobs` feeds a row's candidates as one prefix tree over the
row's key/value cache: each distinct proper prefix is one input token at the position after its parent's, attending
to the row's prompt and its own ancestors only (:func:`tree_masks`); attention implementations that take no explicit
mask fall back to one cache copy per prefix (:func:`per_prefix_logprobs`).  :func:`candidate_sequences` spells
candidate words as token sequences, :func:`exclusive_probabilities` turns their scores into a distribution.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from synclib.engine.forward import forward
from synclib.engine.masks import additive_mask, attention_windows, eager_dtype

__all__ = ["continuation_logprobs", "per_prefix_logprobs", "prefix_trees", "tree_masks", "candidate_sequences",
           "immediate_extensions", "exclusive_probabilities", "CandidateWords"]


def continuation_logprobs(model, cache, mask, next_pos, items, pad_token_id: int,
                          batch_size: int = 16, ends=None) -> tuple[list[float], int]:
    """Teacher-forced ``log P(seq[1:] | row's prompt, seq[0])`` of ``(row, seq)`` items after prefilled rows.

    The caller reads the first token's probability from the prefill's logits (0.0 here for a one-token ``seq``); the
    result equals running each ``prompt + seq`` alone, up to float rounding.

    Parameters
    ----------
    model : transformers causal LM
    cache : ``DynamicCache`` of the prefilled batch holding every column (also for sliding windows); not modified
    mask : (B, T) long attention mask of the cache's columns
    next_pos : (B,) long, position id of each row's next token
    items : sequence of (int, sequence of int)
    pad_token_id, batch_size : int
    ends : (B,) long, optional
        The column after each row's last open one (default: all ``T``), for a row whose mask closes columns at its
        right end (a stream row scored at an earlier point, :mod:`synclib.engine.probes`).

    Returns
    -------
    logps : list of float, one per item
    forward_calls : int
    """
    windows = attention_windows(model.config)
    if windows is None:
        return per_prefix_logprobs(model, cache, mask, next_pos, items, pad_token_id, batch_size)
    import torch
    from transformers import DynamicCache

    trees = prefix_trees(items)
    out = [0.0] * len(items)
    rows = sorted(b for b, nodes in trees.items() if nodes)
    if not rows:
        return out, 0
    dev = mask.device
    float_dtype = eager_dtype(model)  # eager attention adds its mask to the scores; sdpa takes booleans
    bs = max(1, int(batch_size))
    calls = 0
    by_row: dict = {}
    for i, (b, seq) in enumerate(items):
        by_row.setdefault(int(b), []).append(i)
    for c0 in range(0, len(rows), bs):
        chunk = rows[c0:c0 + bs]
        n = len(chunk)
        sel = torch.tensor(chunk, device=dev)
        inp, depth, masks = tree_masks([trees[b] for b in chunk], mask[sel], windows, float_dtype, pad_token_id,
                                       None if ends is None else ends[sel])
        layers = [(layer.keys.index_select(0, sel), layer.values.index_select(0, sel))
                  if n < mask.shape[0] else (layer.keys, layer.values) for layer in cache.layers]
        with torch.inference_mode():
            logits, _ = forward(model, inp.to(dev), masks if len(masks) > 1 else masks.popitem()[1],
                                next_pos[sel][:, None] + depth, DynamicCache(ddp_cache_data=layers))
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


def prefix_trees(items) -> dict:
    """``{row: {proper prefix: node index}}`` of ``(row, seq)`` items, parents before children."""
    trees: dict = {}
    for b, seq in items:
        nodes = trees.setdefault(int(b), {})
        for d in range(1, len(seq)):
            nodes.setdefault(tuple(seq[:d]), len(nodes))
    return trees


def tree_masks(trees: Sequence[dict], row_mask, windows: dict, float_dtype, pad_token_id: int, ends=None):
    """The inputs of ``n`` rows' prefix trees fed over their prompts' ``T`` cached columns.

    Parameters
    ----------
    trees : n dicts from :func:`prefix_trees` (``L`` = the most nodes)
    row_mask : (n, T) long, the rows' attention mask of their cached columns
    windows : ``{layer type: sliding window or None}`` (:func:`~synclib.engine.masks.attention_windows`)
    float_dtype : the eager attention's dtype (an additive mask), or None (boolean, sdpa)
    pad_token_id : int
    ends : (n,) long, optional: the column a row's first node follows (default ``T``)

    Returns
    -------
    inp : (n, L) long on the CPU, each node's last token
    depth : (n, L) long, each node's depth (its position after the prompt)
    masks : ``{layer type: (n, 1, L, T + L)}``: a node at column ``T + depth`` sees the unpadded
        prompt columns and its own ancestors (and itself), within the layer type's window
    """
    import torch

    dev, (n, T) = row_mask.device, row_mask.shape
    L = max(len(t) for t in trees)
    inp = torch.full((n, L), pad_token_id, dtype=torch.long)
    depth = torch.zeros((n, L), dtype=torch.long)
    tree = torch.eye(L, dtype=torch.bool).repeat(n, 1, 1)  # (n, query node, key node): ancestor or self
    for j, nodes in enumerate(trees):
        for pre, v in nodes.items():
            inp[j, v], depth[j, v] = pre[-1], len(pre) - 1
            for d in range(1, len(pre)):
                tree[j, v, nodes[pre[:d]]] = True
    depth, tree = depth.to(dev), tree.to(dev)
    # query node at column T + depth (ends + depth), prompt key at column k: visible if
    # unpadded and, under a sliding window w, (T + depth) - k < w; tree keys: depth difference < w
    q_col = (T if ends is None else ends[:, None, None]) + depth[:, :, None]
    k_col = torch.arange(T, device=dev)[None, None, :]
    unpadded = row_mask.bool()[:, None, :].expand(n, L, T)
    masks = {}
    for kind, w in windows.items():
        prompt, own = unpadded, tree
        if w is not None:
            prompt = unpadded & (q_col - k_col < w)
            own = tree & (depth[:, :, None] - depth[:, None, :] < w)
        allowed = torch.cat([prompt, own], dim=2)[:, None]  # (n, 1, L, T + L)
        if float_dtype is not None:
            allowed = additive_mask(allowed, float_dtype)
        masks[kind] = allowed
    return inp, depth, masks


def per_prefix_logprobs(model, cache, mask, next_pos, items, pad_token_id: int,
                        batch_size: int = 16) -> tuple[list[float], int]:
    """:func:`continuation_logprobs` without explicit masks: each distinct ``(row, seq[:-1])`` is fed once,
    right-padded, ``batch_size`` per forward pass, over its own copy of the row's cache."""
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
            logits, _ = forward(model, inp.to(dev), torch.cat([mask[sel], fmask.to(dev)], 1),
                                next_pos[sel][:, None] + torch.arange(w, device=dev), DynamicCache(ddp_cache_data=layers))
        calls += 1
        lsm = torch.log_softmax(logits.float(), dim=-1)  # (n, w, V)
        for j, key in enumerate(chunk):
            for i in users[key]:
                nxt = torch.tensor(items[i][1][1:], device=lsm.device)
                out[i] = float(lsm[j, torch.arange(len(nxt), device=lsm.device), nxt].sum())
    return out, calls


def candidate_sequences(tokenizer, candidates: Sequence[str]) -> list[list[tuple[int, ...]]]:
    """Token sequences that spell each candidate word at the next position: ``[candidate][variant] -> token ids``.

    Two variants per candidate, tokenized without special tokens: the word as is (as at the start of a line or turn)
    and with a leading space (as after a word), identical ones merged; summing them makes the score independent of
    the context.  Raises ValueError when a candidate is empty or two candidates are the same string.
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


class CandidateWords:
    """Candidate words as the token sequences that spell them, and the distribution over the words their scores give.

    Parameters
    ----------
    tokenizer : a transformers tokenizer
    words : sequence of C distinct non-empty str

    Attributes
    ----------
    words : tuple of C str
    variants : list of C lists of token tuples (:func:`candidate_sequences`)
    seqs : list of S token tuples, every variant once, sorted: what is scored
    longer : dict (:func:`immediate_extensions` of ``seqs``)
    """

    def __init__(self, tokenizer, words: Sequence[str]):
        self.words = tuple(words)
        self.variants = candidate_sequences(tokenizer, self.words)
        self.seqs = sorted({s for spellings in self.variants for s in spellings})
        self.longer = immediate_extensions(self.seqs)

    def distribution(self, logp: np.ndarray) -> tuple[np.ndarray, float]:
        """The ``(C,)`` distribution over the words and its mass from ``(S,)`` log-probabilities of :attr:`seqs`."""
        return exclusive_probabilities(logp, self.seqs, self.longer, self.variants)


def immediate_extensions(seqs: list[tuple]) -> dict:
    """``seq -> [the longer seqs starting with it, none between]``, e.g. ``"1" -> ["10", "12"]`` but not ``"100"``."""
    out = {}
    for s in seqs:
        ext = [t for t in seqs if len(t) > len(s) and t[:len(s)] == s]
        out[s] = [t for t in ext if not any(len(s) < len(u) < len(t) and t[:len(u)] == u for u in ext)]
    return out


def exclusive_probabilities(logp: np.ndarray, all_seqs: list[tuple], longer: dict,
                            variants: list[list[tuple]]) -> tuple[np.ndarray, float]:
    """A distribution over candidate words from the log-probabilities of their spellings.

    A word's score is the probability that the continuation spells it, in any spelling; when one spelling's tokens
    are a prefix of another's (``"1"`` and ``"10"`` under a digit-splitting tokenizer), the longer ones' probability
    is subtracted, so ``"1"`` means "1 and not 10".  Scores are normalised over the words (with single-token
    spellings: the softmax restricted to them).

    Parameters
    ----------
    logp : (S,) float64, ``log P(all_seqs[j])`` after the row's prompt
    all_seqs : list of S token tuples
    longer : dict from :func:`immediate_extensions`
    variants : list of C lists of token tuples, each candidate's spellings (:func:`candidate_sequences`)

    Returns
    -------
    probs : (C,) float64, normalised over the candidates (NaN when they have no probability)
    mass : float, their total probability before normalising
    """
    p = {s: float(np.exp(v)) for s, v in zip(all_seqs, logp)}
    exact = {s: max(0.0, p[s] - sum(p[t] for t in longer[s])) for s in all_seqs}
    scores = np.array([sum(exact[v] for v in spellings) for spellings in variants])
    total = scores.sum()
    return (scores / total if total > 0 else np.full(len(variants), np.nan)), float(total)
