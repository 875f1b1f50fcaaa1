"""Sampling and stopping: one step's token per row, and what that token does to its row.

Inverse-CDF sampling: each row has its own uniforms for the whole reply (:func:`synclib.engine.requests.uniforms`);
at every step the token is the first whose cumulative probability exceeds the next uniform (:func:`sample`), over the
float64 distribution ``transformers``' warpers define (:func:`sampling_distribution`).  ``temperature=0`` is greedy.
A row ends at a stop token or, with ``first_line_only``, at the token that completes its first line
(:func:`row_ends`, :func:`line_flags`).
"""
from __future__ import annotations

__all__ = ["sampling_distribution", "SAMPLE_CHUNK_BYTES", "SampleWork", "sample", "row_ends", "line_flags"]


def sampling_distribution(logits, temperature: float, top_k: int | None = None, top_p: float | None = None,
                          work: "SampleWork | None" = None):
    """The distribution a sampling step draws from: float64 ``(B, V)`` probabilities.

    As ``transformers``' ``generate`` with ``do_sample=True``: temperature, then top-k (tokens below the k-th highest
    score removed, ties kept), then top-p (tokens sorted by score ascending; those whose cumulative probability is at
    most ``1 - top_p`` removed, the most likely always kept), masks computed in float32 like the warpers', kept scores
    normalised in float64.  Without top-k and top-p this is ``softmax(logits / temperature)`` in float64.

    Parameters
    ----------
    logits : torch.Tensor ``(B, V)`` float32, next-token logits
    temperature : float > 0
    top_k : int >= 1, or None / 0 for none
    top_p : float in (0, 1], or None / 1.0 for none
    work : SampleWork, optional
        Buffers of at least ``B`` rows to compute in (the result is a view of one of them); same numbers as without.
    """
    import torch

    B, V = logits.shape
    work = work or SampleWork(V, B, logits.device)
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


#: bytes of each float64 buffer a CPU sampling step works in (:class:`SampleWork`)
SAMPLE_CHUNK_BYTES = 8 << 20


class SampleWork:
    """The buffers of sampling steps over a ``V``-token vocabulary, ``rows`` rows at a time (float64 scores and
    probabilities, float32 scores, the top-k/top-p removal mask), so that a step's arrays are views, not fresh arrays
    the CPU's allocator maps and faults in anew (64 MiB each at Gemma-3's 262,144 tokens and 32 rows); rows are
    independent, so the numbers are the same bit for bit."""

    def __init__(self, V: int, rows: int | None = None, device=None):
        import torch

        self.V = V
        self.chunk = rows or max(1, SAMPLE_CHUNK_BYTES // (8 * V))
        self._bufs = tuple(torch.empty(self.chunk, V, dtype=dt, device=device)
                           for dt in (torch.float64, torch.float64, torch.float32, torch.bool))

    def rows(self, n: int) -> tuple:
        """The first ``n`` rows (``n <= chunk``) of each buffer."""
        if n > self.chunk:
            raise ValueError(f"SampleWork holds {self.chunk} rows, not {n}")
        return tuple(b[:n] for b in self._bufs)


def sample(logits, u, sampling, work: SampleWork | None = None):
    """One decoding step's token per row: ``(R,)`` long, the argmax at temperature 0, else the inverse of the
    sampling distribution's CDF (:func:`sampling_distribution`) at ``u``.

    Parameters
    ----------
    logits : (R, V) float32 next-token logits
    u : (R,) float64, each row's own uniform for this step
    sampling : (temperature, top_k, top_p)
    work : SampleWork, optional
        Buffers to sample in, a chunk of rows at a time (the CPU's steps).
    """
    import torch

    temperature, top_k, top_p = sampling
    if temperature == 0:
        return logits.argmax(-1)
    R, V = logits.shape
    work = work or SampleWork(V, R, logits.device)  # without: every row at once, in fresh arrays
    tok = torch.empty(R, dtype=torch.long, device=logits.device)
    for s in range(0, R, work.chunk):
        e = min(R, s + work.chunk)
        p = sampling_distribution(logits[s:e], temperature, top_k, top_p, work=work)
        cdf = torch.cumsum(p, -1, out=work.rows(e - s)[0])
        tok[s:e] = torch.searchsorted(cdf, (u[s:e] * cdf[:, -1]).unsqueeze(-1)).squeeze(-1).clamp(max=V - 1)
    return tok


def row_ends(tok, live, seen, stop, lines):
    """What one step's tokens do to their rows.

    Parameters
    ----------
    tok : (R,) long, the sampled tokens
    live : (R,) bool, rows still generating
    seen : (R,) bool, rows that have generated some text
    stop : (S,) long, the stop token ids
    lines : the :func:`line_flags` triple, or None (no first-line stop)

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


def line_flags(tokenizer, vocab: int, device) -> tuple:
    """Per token id, as bool tensors of length ``vocab`` on ``device``: holds a line break; has text before its first
    break; has any text.  "Text" is non-whitespace, decoded token by token without special tokens; ids beyond the
    tokenizer (padded embeddings) have none of the three."""
    import torch

    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)[:vocab]
    pad = [False] * (vocab - len(pieces))
    flags = ([("\n" in p) for p in pieces], [bool(p.split("\n", 1)[0].strip()) for p in pieces],
             [bool(p.strip()) for p in pieces])
    return tuple(torch.tensor(f + pad, dtype=torch.bool, device=device) for f in flags)
