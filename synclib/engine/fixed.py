"""Fixed-shape decoding: rows in preallocated slots, every step the same shapes, on CUDA one graph replay.

The dynamic path (:mod:`synclib.engine.dynamic`) costs about a thousand kernel launches and allocations a step, more
host time on a GPU than the arithmetic (``bench/gpu_notes.md``).  :class:`FixedSlots` allocates once per layer
``(slots, H, T, Dh)`` keys and values and a boolean ``(slots, 1, 1, T)`` mask with the unwritten columns closed; a
step opens each slot's next column (``col``), runs the model on each slot's fed token (every layer writing its key and
value into that column through :meth:`FixedSlots.update`), copies the next-token logits into a fixed float32 buffer
and advances the active slots' columns and positions.  All in place on fixed tensors, so on CUDA it is captured once
per allocation as a CUDA graph (:func:`capture_step`); on the CPU, or when capture fails, it runs eagerly.  Closed
columns get zero attention weight, so logits equal the dynamic path's up to float rounding; free slots run too,
attending to their column 0 only.  Only for models whose every layer attends to the full context through an explicit
mask (:func:`~synclib.engine.masks.full_attention_only`).
"""
from __future__ import annotations

import warnings

from synclib.engine.forward import forward, index_tensor
from synclib.engine.masks import additive_mask, decode_attention, eager_dtype
from synclib.engine.prefill import Prefill

__all__ = ["FixedSlots", "capture_step"]


class FixedSlots:
    """Rows in at most ``capacity`` fixed slots; positions are slot numbers.

    ``T`` is the longest prefill so far plus ``steps``, rounded up to ``round_to``; a longer prefill re-allocates
    (and re-captures), copying the old contents.  ``slots`` grows as rows arrive, to the rows held rounded up to
    :attr:`SLOT_ROUND` and by at least half, up to ``capacity``, so that a stream bounded otherwise (its key/value
    token budget) holds ``slots x T`` columns, not ``capacity x T``.

    Parameters
    ----------
    engine : Engine
        Whose model runs the steps; its ``stats`` count ``forward_calls``, ``graph_steps``, ``graph_fallbacks`` and
        ``slot_allocations``, and a failed capture sets its ``graph_error``.
    capacity : int, the slots (rows decoding at once)
    steps : int, the most tokens a row will be fed (``max_new_tokens - 1``)
    graph : bool, capture the step as a CUDA graph (CUDA only)
    round_to : int, default 1
        Round the columns up to a multiple of this (a stream: :attr:`ROUND`, so that few joins re-allocate).
    """

    #: a stream's column rounding
    ROUND = 256
    #: the slots' rounding when they grow
    SLOT_ROUND = 8
    #: rows stay in their slots when they end (the batch loop does not select them out)
    compacts = False

    def __init__(self, engine, capacity: int, steps: int, graph: bool, round_to: int = 1):
        self.engine, self.capacity, self.steps = engine, int(capacity), max(1, int(steps))
        self.graph_wanted, self.round_to = graph, max(1, int(round_to))
        self.T = self.slots = 0
        self.free: list[int] = []
        self.keys = self.values = None
        self.graph = None
        self.captured = False
        self._pos = None  # (slot list, its device index), see _index
        #: why the last capture failed (``"TypeName: message"``), None when it did not
        self.error: str | None = None

    # -- the cache interface the model calls ----------------------------------------
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        # scatter_ along the column dim: no advanced indexing, nothing a CUDA graph cannot capture
        idx = self.col.view(-1, 1, 1, 1).expand(-1, key_states.shape[1], 1, key_states.shape[3])
        self.keys[layer_idx].scatter_(2, idx, key_states)
        self.values[layer_idx].scatter_(2, idx, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Asked by transformers < 5 when no positions are given; the engine always gives them, so any count serves."""
        return 0

    # -- buffers ----------------------------------------------------------------------
    def _allocate(self, T: int, like: Prefill, slots: int | None = None) -> None:
        """Buffers of ``slots`` rows (default: as now) and ``T`` columns, the old contents copied over; then capture."""
        import torch

        dev, C = like.mask.device, slots or self.slots
        # the large buffers first: out of memory here leaves the slots as they were
        keys = [layer.keys.new_zeros((C, layer.keys.shape[1], T, layer.keys.shape[3])) for layer in like.cache.layers]
        values = [layer.values.new_zeros((C, layer.values.shape[1], T, layer.values.shape[3]))
                  for layer in like.cache.layers]
        old = None if self.keys is None else (self.keys, self.values, self.allowed, self.col, self.pos,
                                              self.active, self.tok, self.logits)
        self.keys, self.values = keys, values
        self.allowed = torch.zeros((C, 1, 1, T), dtype=torch.bool, device=dev)
        self.allowed[:, 0, 0, 0] = True  # a free slot attends to its column 0: no empty softmax
        self.col = torch.zeros(C, dtype=torch.long, device=dev)
        self.pos = torch.zeros(C, dtype=torch.long, device=dev)
        self.active = torch.zeros(C, dtype=torch.bool, device=dev)
        self.tok = torch.zeros(C, dtype=torch.long, device=dev)
        self.logits = torch.zeros((C, like.logits.shape[1]), dtype=torch.float32, device=dev)
        if old is not None:
            keys, values, allowed, col, pos, active, tok, logits = old
            C0, T0 = allowed.shape[0], allowed.shape[-1]
            for dst, src in zip(self.keys + self.values, keys + values):
                dst[:C0, :, :T0] = src
            self.allowed[:C0, ..., :T0] = allowed
            for dst, src in ((self.col, col), (self.pos, pos), (self.active, active), (self.tok, tok),
                             (self.logits, logits)):
                dst[:C0].copy_(src)
        self.free += list(range(self.slots, C))
        self.T, self.slots = T, C
        self.engine.stats["slot_allocations"] += 1
        self.eager_dtype = eager_dtype(self.engine.lm.model)
        self.graph, self.captured = None, False
        if self.graph_wanted and dev.type == "cuda":
            self._capture()

    def _forward(self) -> None:
        # (a Python scalar assigned through advanced indexing becomes a host-to-device copy,
        # which a CUDA graph capture refuses; scatter_ takes the scalar as an argument)
        self.allowed[:, 0, 0, :].scatter_(1, self.col[:, None], True)
        mask = self.allowed
        if self.eager_dtype is not None:  # eager attention adds its mask to the scores
            mask = additive_mask(mask, self.keys[0].dtype, self.eager_dtype)
        logits, _ = forward(self.engine.lm.model, self.tok[:, None], mask, self.pos[:, None], self, last_only=True)
        self.logits.copy_(logits[:, -1, :])
        step = self.active.long()
        self.col.add_(step)
        self.pos.add_(step)

    def _capture(self) -> None:
        """Capture one step (:func:`capture_step`), undoing the warm-up from a copy of the buffers it writes."""
        saved = [t.clone() for t in (self.allowed, self.col, self.pos, self.logits)]

        def restore():
            for dst, src in zip((self.allowed, self.col, self.pos, self.logits), saved):
                dst.copy_(src)

        self.graph, self.error = capture_step(self._forward, restore)
        self.captured = self.graph is not None
        if not self.captured:
            self.engine.stats["graph_fallbacks"] += 1
            if self.engine.graph_error is None:
                warnings.warn(f"CUDA graph capture failed for {self.slots} decoding slots; their decoding "
                              f"steps run eagerly (same numbers, slower): {self.error}", RuntimeWarning, stacklevel=3)
            self.engine.graph_error = self.error

    # -- the rows ---------------------------------------------------------------------
    def add(self, pre: Prefill) -> list[int]:
        """Copy a prefilled group into free slots; their slot numbers."""
        import torch

        W, n = pre.mask.shape[1], pre.mask.shape[0]
        room = self.capacity - self.slots + len(self.free)
        if n > room:
            raise ValueError(f"{n} rows do not fit the {room} free of {self.capacity} slots")
        need, rows = W + self.steps, self.slots - len(self.free) + n
        grow = rows > self.slots
        if need > self.T or grow:
            more = -(-max(rows, self.slots + self.slots // 2) // self.SLOT_ROUND) * self.SLOT_ROUND
            self._allocate(-(-max(need, self.T) // self.round_to) * self.round_to, pre,
                           min(self.capacity, more) if grow else self.slots)
        slots, self.free = self.free[:n], self.free[n:]
        # one copy per layer for all the group's rows (an index_copy_, no host sync)
        idx = index_tensor(slots, self.col.device)
        for dst, layer in zip(self.keys, pre.cache.layers):
            dst[:, :, :W].index_copy_(0, idx, layer.keys)
        for dst, layer in zip(self.values, pre.cache.layers):
            dst[:, :, :W].index_copy_(0, idx, layer.values)
        allowed = torch.zeros((len(slots), 1, 1, self.T), dtype=torch.bool, device=self.col.device)
        allowed[:, 0, 0, :W] = pre.mask.bool()
        self.allowed.index_copy_(0, idx, allowed)
        self.col.index_fill_(0, idx, W)
        self.pos.index_copy_(0, idx, pre.next_pos)
        self.active.index_fill_(0, idx, True)
        self.logits.index_copy_(0, idx, pre.logits)
        pre.cache = None  # copied into the slots
        return slots

    def _index(self, pos: list[int]):
        """``pos`` as a device index, made again only when the rows change (a join or a leave)."""
        if self._pos is None or self._pos[0] != pos:
            self._pos = (list(pos), index_tensor(pos, self.col.device))
        return self._pos[1]

    def logits_of(self, pos: list[int]):
        """Next-token logits ``(len(pos), V)`` of slots ``pos`` (all, in order: a buffer the next step overwrites)."""
        return self.logits if pos == list(range(self.slots)) else self.logits.index_select(0, self._index(pos))

    def keep(self, pos: list[int]) -> list[int]:
        """Free the occupied slots not in ``pos``; the kept rows stay where they are."""
        gone = sorted(set(range(self.slots)) - set(self.free) - set(pos))
        if gone:
            idx = index_tensor(gone, self.col.device)
            self.active.index_fill_(0, idx, False)
            self.col.index_fill_(0, idx, 0)
            self.allowed.index_fill_(0, idx, False)
            self.allowed[:, 0, 0, 0].index_fill_(0, idx, True)  # a free slot attends to its column 0
            self.free = sorted(self.free + gone)
        return pos

    def columns(self):
        """``(layers, mask, ends)`` of every slot (:func:`~synclib.engine.probes.score_points`): the ``(keys, values)``
        buffers per layer, the ``(slots, T)`` open columns, and each slot's next column (``col``)."""
        return list(zip(self.keys, self.values)), self.allowed[:, 0, 0, :].long(), self.col

    def feed(self, pos: list[int], tok) -> None:
        """One step of every slot, the slots ``pos`` fed ``tok``."""
        import torch

        self.tok.index_copy_(0, self._index(pos), tok)
        self.engine.stats["forward_calls"] += 1
        if self.graph is not None:
            self.graph.replay()
            self.engine.stats["graph_steps"] += 1
            return
        with torch.inference_mode(), decode_attention():
            self._forward()


def capture_step(forward_step, reset):
    """One decoding step captured as a CUDA graph: ``forward_step()`` is warmed up on a side stream, ``reset()`` undoes
    the warm-up's writes, the step is captured, and ``reset()`` undoes the capture's.  Returns ``(graph, None)``, or
    ``(None, "TypeName: message")`` when capture failed (the caller then runs ``forward_step`` eagerly)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.inference_mode(), decode_attention(), torch.cuda.stream(side):
            forward_step()
            reset()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                forward_step()
        torch.cuda.current_stream().wait_stream(side)
        reset()
        return graph, None
    except Exception as exc:  # noqa: BLE001 - any capture failure: run the same step eagerly
        torch.cuda.current_stream().wait_stream(side)
        reset()
        return None, f"{type(exc).__name__}: {exc}"
