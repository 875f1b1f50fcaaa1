"""Continuous batching: generation rows that join and leave a decoding batch at any step.

A :class:`DecodeStream` decodes rows held in a row store (:class:`~synclib.engine.dynamic.DynamicRows` or
:class:`~synclib.engine.fixed.FixedSlots`).  Refilled (the default), a row leaves at the step it ends and queued rows
are prefilled (reusing their sessions' keys/values) and join the running batch, so no row waits for a longer reply.
Not refilled, rows join only an empty batch, which decodes until its last row ends (:meth:`Engine.generate`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Hashable

import numpy as np

from synclib.engine.dynamic import DynamicRows
from synclib.engine.fixed import FixedSlots
from synclib.engine.forward import index_tensor, is_oom
from synclib.engine.masks import full_attention_only
from synclib.engine.prefill import select_rows
from synclib.engine.probes import Point, Probe, score_points
from synclib.engine.requests import Request, Result, make_result, uniforms
from synclib.engine.sampling import row_ends, sample

__all__ = ["DecodeStream"]


@dataclass
class _StreamRow:
    """One row of a :class:`DecodeStream` (host side): ``pos`` where its row store keeps it, ``fed`` its tokens fed so
    far, ``done`` whether it ended (result returned) while staying in a batch not refilled; with a ``probe``, its
    ``points`` wait to be scored and ``scores`` hold what they gave (:mod:`synclib.engine.probes`)."""

    tag: Hashable
    request: Request
    ids: list
    states: np.ndarray
    reused: int
    pos: int = -1
    tokens: list = field(default_factory=list)
    fed: int = 0
    probe: Probe | None = None
    done: bool = False
    marked: bool = False
    points: list = field(default_factory=list)
    scores: list = field(default_factory=lambda: [None, None])


class DecodeStream:
    """Continuous batching: generation rows that join and leave a decoding batch at any step.

    Prefill-only rows (:meth:`read`) share the prefill of the next rows that join; a row's
    :class:`~synclib.engine.probes.Probe` is scored over the stream's keys/values before the row leaves
    (:attr:`Result.scores`).  A row's tokens do not depend on the batch (it samples with its own seeded uniforms).

    Parameters
    ----------
    engine : Engine
    max_new_tokens, sampling, first_line_only
        As :meth:`Engine.generate` (``sampling`` is ``(temperature, top_k, top_p)``).
    capacity : int
        Most rows decoding at once.
    refill : bool, default True
        Whether queued rows join a batch that is decoding (``join_min`` and ``kv_tokens`` say when).  False: up to
        ``capacity`` rows join an empty batch, which decodes until its last row ends, ended rows staying in it until
        half have ended (:meth:`~synclib.engine.dynamic.DynamicRows.worth_keeping`); reads wait for an empty batch too.
    kv_tokens : int, optional
        Most key/value tokens the decoding rows may reach together, each reserving its prompt plus
        ``max_new_tokens - 1`` until it ends; queued rows join in order while theirs fits (a row that alone exceeds it
        joins only an empty batch: ``stats["over_budget"]``; ``stats["kv_reserved_peak"]``: the most reserved at
        once).  Default: no limit.
    join_min : int, optional
        Queued rows join only when at least this many wait (or the batch is empty): one prefill for several rows
        costs less than one per row.  Default: a quarter of ``capacity``.
    on_step : callable, optional
        Called after every decoding step with the number of rows it advanced.
    decode : {"dynamic", "static", "graph"}, default "dynamic"
        As :class:`Engine`'s ``decode``; the slot modes need a model whose every layer attends to the full context
        through an explicit mask.

    Counters go to :attr:`stats` and ``engine.stats`` (``decode_steps``, ``generated_tokens``, ``stream_joins``,
    ``host_reads``: one per step, ``stream_reads``: rows read with a join, ``probe_points``, ``probe_calls``); wall
    times to ``engine.seconds`` (``join``, prefill included; ``decode``; ``probe``).
    """

    def __init__(self, engine, max_new_tokens: int, sampling: tuple, first_line_only: bool,
                 capacity: int, join_min: int | None = None, on_step=None, decode: str = "dynamic",
                 kv_tokens: int | None = None, refill: bool = True):
        import torch

        if int(capacity) < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if kv_tokens is not None and int(kv_tokens) < 1:
            raise ValueError(f"kv_tokens must be >= 1 or None, got {kv_tokens}")
        if decode not in ("dynamic", "static", "graph"):
            raise ValueError(f"decode must be 'dynamic', 'static' or 'graph', got {decode!r}")
        if decode != "dynamic" and not full_attention_only(engine.lm.model):
            raise ValueError(f"decode={decode!r} needs a model whose every layer attends to the full context "
                             f"through sdpa or eager attention; {engine.lm.name} does not (use 'dynamic')")
        self.engine, self.lm = engine, engine.lm
        self.max_new_tokens, self.sampling, self.first_line_only = int(max_new_tokens), sampling, first_line_only
        self.capacity = int(capacity)
        self.kv_tokens = None if kv_tokens is None else int(kv_tokens)
        self.join_min = max(1, int(join_min) if join_min is not None else self.capacity // 4)
        self.on_step = on_step
        self.decode = decode
        self.refill = bool(refill)
        self.stats: Counter = Counter()
        self._queue: list = []          # (tag, Request, token ids)
        self._reads: list = []          # (tag, prompt, session): prefill-only rows, see read
        self._read: list = []           # (tag, states) read, for take_reads
        self._rows: list[_StreamRow] = []
        steps = self.max_new_tokens - 1
        if decode == "dynamic":
            room = steps if not self.refill and self.lm.device.type == "cpu" and steps > 0 else None
            self._batch = DynamicRows(engine, self.stats, room=room, trim=self.refill)
        else:
            self._batch = FixedSlots(engine, self.capacity, steps, graph=decode == "graph", round_to=FixedSlots.ROUND)
        dev = self.lm.device
        self._U = torch.zeros((0, self.max_new_tokens), dtype=torch.float64, device=dev)
        self._step = torch.zeros(0, dtype=torch.long, device=dev)
        self._seen = torch.zeros(0, dtype=torch.bool, device=dev)
        self._stop = engine._stop_ids()
        self._lines = None

    def submit(self, tag: Hashable, request: Request, probe: Probe | None = None) -> None:
        """Queue a row; :meth:`step` returns its :class:`Result` (``probe`` scores included) and ``tag`` at its end."""
        if probe is not None and not isinstance(probe, Probe):
            raise TypeError(f"probe must be a synclib.engine.Probe or None, got {type(probe).__name__}")
        self._queue.append((tag, request, self.engine._ids(request.prompt), probe))

    def read(self, tag: Hashable, prompt, session: Hashable = None) -> None:
        """Queue a prefill-only row: its states at the last prompt token as :meth:`Engine.read_states` gives them
        (``session`` reused and updated), prefilled with the next rows that join, or once :attr:`Engine.max_rows`
        reads wait or no row is decoding; :meth:`take_reads` returns it."""
        self._reads.append((tag, prompt, session))

    def take_reads(self) -> list[tuple[Hashable, np.ndarray]]:
        """The rows read since the last call: ``(tag, states (n_layers, d_model) float32)``."""
        out, self._read = self._read, []
        return out

    @property
    def reads_waiting(self) -> int:
        """Reads queued (:meth:`read`), not prefilled yet."""
        return len(self._reads)

    def __len__(self) -> int:
        """Rows queued or decoding (not those that ended and stay in the batch)."""
        return len(self._queue) + sum(not r.done for r in self._rows)

    def _admit(self) -> None:
        """Prefill queued rows (see ``join_min``, ``kv_tokens``) and the waiting reads; add the rows to the batch."""
        if not self.refill and self._rows:
            return
        free = self.capacity - len(self._rows)
        room = self._room(free)
        # fewer than join_min rows wait while others decode, unless the slots or the token budget allow no more
        joins = room > 0 and (not self._rows or room >= min(self.join_min, free) or room < min(len(self._queue), free))
        reads = bool(self._reads) and (joins or not self._rows or len(self._reads) >= self.engine.max_rows)
        if joins or reads:
            with self.engine.timed("join" if joins else "read"):
                self._join(room if joins else 0)

    def _reserve(self, ids: list) -> int:
        """Key/value tokens a row of prompt ``ids`` can reach (see ``kv_tokens``)."""
        return len(ids) + self.max_new_tokens - 1

    @property
    def _reserved(self) -> int:
        """Key/value tokens the decoding rows reserve (see ``kv_tokens``)."""
        return sum(self._reserve(r.ids) for r in self._rows)

    def _room(self, free: int) -> int:
        """How many queued rows may join now, in order: at most ``free`` (slots), and those
        whose reserves fit ``kv_tokens`` (the first row always, when no row is decoding)."""
        room = max(0, min(len(self._queue), free))
        if self.kv_tokens is None or room == 0:
            return room
        left, n = self.kv_tokens - self._reserved, 0
        while n < room and (need := self._reserve(self._queue[n][2])) <= left:
            left -= need
            n += 1
        if n == 0 and not self._rows:
            self.stats["over_budget"] += 1
            return 1
        return n

    def _join(self, room: int) -> None:
        """Admit up to ``room`` queued rows and up to :attr:`Engine.max_rows` waiting reads in one prefill.  Out of
        memory (prefill, or fixed slots growing), :meth:`Engine._out_of_memory` decides: caches dropped and retried,
        then half the reads or rows (the rest stay queued; not refilled, halving rows lowers ``capacity`` and
        :attr:`Engine.max_rows` too).  A dynamic batch out of memory while merging the new rows raises."""
        import torch

        eng = self.engine
        n_reads = min(len(self._reads), max(1, eng.max_rows))
        while True:
            take, reads = self._queue[:room], self._reads[:n_reads]
            handed_over = eng.sessions.handed_over
            try:
                ids = [x for _, _, x, _ in take] + [eng._ids(prompt) for _, prompt, _ in reads]
                sessions = [r.session for _, r, _, _ in take] + [session for _, _, session in reads]
                pre = eng._prefill(list(zip(ids, sessions)))
                states, reused = pre.states, pre.reused
                if reads:
                    pre = select_rows(pre, list(range(len(take)))) if take else None
                # FixedSlots.add is all or nothing, so it is retried; a dynamic batch's merge is not
                pos = self._batch.add(pre) if take and isinstance(self._batch, FixedSlots) else None
                break
            except Exception as exc:  # noqa: BLE001 - only OOM is handled
                if not is_oom(exc):
                    raise
                if eng._out_of_memory(len(take) + len(reads), handed_over):  # fewer rows: the reads first
                    n_reads, room = (len(reads) // 2, room) if reads else (0, len(take) // 2)
                    if not reads and not self.refill:
                        self.capacity = eng.max_rows = min(eng.max_rows, room)
                del exc
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        self._queue, self._reads = self._queue[len(take):], self._reads[len(reads):]
        self._read += [(tag, states[len(take) + i]) for i, (tag, _, _) in enumerate(reads)]
        self.stats["reads"] += len(reads)
        eng.stats["stream_reads"] += len(reads)
        if not take:
            return
        if pos is None:
            pos = self._batch.add(pre)
        U = uniforms([r.seed for _, r, _, _ in take], self.max_new_tokens)
        new = [_StreamRow(tag, r, x, states[i], reused[i], pos[i], probe=probe)
               for i, (tag, r, x, probe) in enumerate(take)]
        for row in new:  # the first point: the prompt's last token after the rest of it
            if row.probe is not None and row.probe.first:
                row.points.append(Point(row, len(row.ids) - 1, row.ids[-1], 0))
        self._rows += new
        reserved = self._reserved
        for stats in (self.stats, eng.stats):
            stats["kv_reserved_peak"] = max(stats["kv_reserved_peak"], reserved)
        self._U = torch.cat([self._U, U.to(self._U.device)])
        self._step = torch.cat([self._step, self._step.new_zeros(len(take))])
        self._seen = torch.cat([self._seen, self._seen.new_zeros(len(take))])
        self.stats["joins"] += 1
        eng.stats["stream_joins"] += 1

    def step(self) -> list[tuple[Hashable, Result]]:
        """Admit queued rows, sample one token for every row and advance those that go on by one forward pass; return
        the ``(tag, Result)`` of the rows that ended at this step, in batch order."""
        self._admit()
        if not self._rows:
            return []
        with self.engine.timed("decode"):
            tok, kept, why, gone = self._sample()
        if any(g and row.points for g, row in zip(gone, self._rows)):  # before their keys/values leave
            with self.engine.timed("probe"):
                self._score()
        with self.engine.timed("decode"):
            return self._advance(tok, why, gone)

    def _sample(self):
        """Sample one token for every row: ``tok`` (B,) on the device, and as host lists the tokens, kept flags, end
        reasons and end flags; kept ones join the rows; a probed row whose token ``mark`` accepts gets a 2nd point."""
        import torch

        B = len(self._rows)
        logits = self._batch.logits_of([r.pos for r in self._rows])
        if self.first_line_only and self._lines is None:
            self._lines = self.engine._line_flags(logits.shape[-1])
        u = self._U[torch.arange(B, device=self._U.device), self._step]
        tok = sample(logits, u, self.sampling, self.engine._sample_work(logits.shape[-1]))
        live = torch.ones(B, dtype=torch.bool, device=tok.device)
        keep, is_stop, at_line, self._seen = row_ends(tok, live, self._seen, self._stop, self._lines)
        self._step += 1
        ended = is_stop | at_line | (self._step >= self.max_new_tokens)
        why = torch.where(is_stop, 1, torch.where(at_line, 2, 0))
        toks, kept, why, gone = torch.stack([tok, keep.long(), why, ended.long()]).tolist()  # one host read
        self.stats["host_reads"] += 1
        self.engine.stats["host_reads"] += 1
        self.engine._count_step(B, self.on_step, self.stats)
        for i, row in enumerate(self._rows):
            if row.done:
                gone[i] = 0
                continue
            if not kept[i]:
                continue
            probe = row.probe
            if (probe is not None and probe.then and not row.marked and len(row.tokens) < probe.within
                    and probe.mark(toks[i])):
                row.points.append(Point(row, len(row.ids) + len(row.tokens), toks[i], 1))
                row.marked = True
            row.tokens.append(toks[i])
        return tok, kept, why, gone

    def _score(self) -> None:
        """Score every row's waiting probe points over the row store (:func:`~synclib.engine.probes.score_points`),
        :attr:`Engine.max_rows` a forward; out of memory, half as many (``stats["probe_oom_retries"]``)."""
        import torch

        eng = self.engine
        points = [p for row in self._rows for p in row.points]
        per = eng.max_rows
        while True:
            try:
                logps, calls = score_points(self.lm.model, self._batch.columns(), points, self.lm.pad_token_id, per)
                break
            except Exception as exc:  # noqa: BLE001 - only OOM is handled
                if not is_oom(exc) or per == 1:
                    raise
                del exc
                per = max(1, per // 2)
                self.stats["probe_oom_retries"] += 1
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        for p, logp in zip(points, logps):
            p.row.scores[p.which] = logp
        for row in self._rows:
            row.points = []
        for stats in (self.stats, eng.stats):
            stats["probe_points"] += len(points)
            stats["probe_calls"] += calls
        eng.stats["forward_calls"] += calls

    def _advance(self, tok, why, gone) -> list[tuple[Hashable, Result]]:
        """The ended rows' results; the others stay and are fed their tokens (one forward)."""
        finished, stay = [], []
        for i, row in enumerate(self._rows):
            if gone[i]:
                scores = tuple(row.scores) if row.probe is not None else ()
                finished.append((row.tag, make_result(self.lm, row.tokens, row.ids, row.states, why[i], row.reused,
                                                      scores)))
                row.done = True
            elif not row.done:
                stay.append(i)
        B = len(self._rows)
        if stay and not self.refill:  # the ended rows stay until it is worth a copy (or keep their slots)
            if not (self._batch.compacts and self._batch.worth_keeping(len(stay), B)):
                stay = list(range(B))
        if len(stay) < B:
            tok = self._leave(stay, tok)
        if self._rows:
            self._batch.feed([r.pos for r in self._rows], tok)
            for row in self._rows:
                row.fed += 1
        return finished

    def _leave(self, stay: list[int], tok):
        """Keep the rows at indices ``stay`` of this step; the tokens they are fed next."""
        new_pos = self._batch.keep([self._rows[i].pos for i in stay])
        self._rows = [self._rows[i] for i in stay]
        for row, p in zip(self._rows, new_pos):
            row.pos = p
        idx = index_tensor(stay, self._U.device)
        self._U, self._step, self._seen = self._U[idx], self._step[idx], self._seen[idx]
        return tok[idx]

    def run(self) -> list[tuple[Hashable, Result]]:
        """Step until every queued and decoding row has ended and every read is made; the
        generation rows' results (the reads': :meth:`take_reads`)."""
        out = []
        while len(self) or self._reads:
            out += self.step()
        return out
