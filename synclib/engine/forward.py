"""The one place the engine calls a model: the cache keyword, the logits to keep, out of memory.

:func:`forward` passes the cache under the name the model's ``forward`` declares (``cache`` from transformers 5,
``past_key_values`` before), returns the cache the model hands back, and asks for the last position's logits only
where the model takes ``logits_to_keep``.
"""
from __future__ import annotations

import functools
import inspect

__all__ = ["forward", "is_oom", "index_tensor"]


@functools.lru_cache(maxsize=None)
def _signature(cls) -> tuple[str, bool]:
    """``(cache keyword, takes logits_to_keep)`` of a model class's ``forward``."""
    params = inspect.signature(cls.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "logits_to_keep" in params


def forward(model, input_ids, attention_mask, position_ids, cache, last_only: bool = False):
    """Run ``model`` over ``input_ids`` after ``cache``; ``(logits, cache)`` of the output.

    Parameters
    ----------
    model : transformers causal LM
    input_ids : (B, S) long
    attention_mask : (B, T) long, a 4-D mask, or ``{layer type: 4-D mask}``
    position_ids : (B, S) long
    cache : a transformers ``Cache`` or any object with its ``update`` (the fixed-shape decoders)
    last_only : bool, compute the last position's logits only (where the model takes ``logits_to_keep``)

    Returns
    -------
    logits : (B, S or 1, V) in the model's dtype
    cache : the cache the model returns (the same object for the engine's own caches)
    """
    keyword, keeps = _signature(type(model))
    extra = {"logits_to_keep": 1} if (last_only and keeps) else {}
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=True, **{keyword: cache}, **extra)
    return out.logits, out[keyword] if keyword in out else cache


def index_tensor(values, device):
    """The host list of ints ``values`` as a long tensor on ``device``; on CUDA through pinned memory, ``non_blocking``
    (a plain host copy waits for all work queued on the device: a stall every decoding step)."""
    import torch

    t = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is a device's out-of-memory error."""
    import torch

    msg = str(exc).lower()
    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and ("out of memory" in msg or "cublas_status_alloc_failed" in msg))
