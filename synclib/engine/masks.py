"""Attention masks and windows: what the engine tells a model's attention beyond transformers' defaults.

Explicit masks are built for the fixed-shape decoding steps (:mod:`synclib.engine.fixed`, boolean ``(B, 1, 1, T)``
with the unwritten columns closed) and the prefix trees of candidate scoring (:mod:`synclib.engine.candidates`, one
``(B, 1, nodes, columns)`` mask per attention type).
"""
from __future__ import annotations

from contextlib import contextmanager

__all__ = ["attention_windows", "full_attention_only", "eager_dtype", "additive_mask", "decode_attention"]


def attention_windows(config) -> dict | None:
    """``{layer type: sliding window or None}`` of a model whose attention takes an explicit 4-D mask, else None."""
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return None
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or
                ["sliding_attention" if window is not None else "full_attention"])
    if not types <= {"full_attention", "sliding_attention"}:
        return None
    return {t: (window if t == "sliding_attention" else None) for t in sorted(types)}


def full_attention_only(model) -> bool:
    """Whether every layer attends to the full context through an explicit mask (``sdpa``/``eager``, no window)."""
    windows = attention_windows(model.config)
    return windows is not None and all(w is None for w in windows.values())


def eager_dtype(model):
    """The model's parameter dtype if its attention is ``eager`` (a float mask added to the scores), else None."""
    if getattr(model.config, "_attn_implementation", "sdpa") != "eager":
        return None
    return next(model.parameters()).dtype


def additive_mask(allowed, dtype, fill_dtype=None):
    """The boolean mask ``allowed`` as eager attention adds it to the scores: a ``dtype`` tensor, 0 where allowed and
    the most negative value of ``fill_dtype`` (default ``dtype``) elsewhere."""
    import torch

    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(fill_dtype or dtype).min)


@contextmanager
def decode_attention():
    """On CUDA, the attention kernels a decoding step may use: memory-efficient (which takes
    the boolean mask), else math; never cuDNN, whose plan depends on the key length."""
    import torch

    if not torch.cuda.is_available():
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield
