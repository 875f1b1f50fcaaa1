"""The :class:`Engine`: batched, hooked prefill and sampling over a loaded model, with session reuse.

It orders rows by new-token count (:meth:`Engine.order`), prefills each batch once with hooks
(:mod:`synclib.engine.prefill`), then reads states, scores candidates (:mod:`synclib.engine.candidates`) or
decodes on a :class:`DecodeStream`.  Out of memory, the session caches are dropped, then a batch is retried in halves.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from time import perf_counter
from typing import Callable, Hashable, Sequence

import numpy as np

from synclib.engine.candidates import continuation_logprobs
from synclib.engine.forward import forward, is_oom
from synclib.engine.masks import full_attention_only
from synclib.engine.prefill import Prefill, gather_prefixes, last_token_states, layout, merge_prefills, prefill_groups
from synclib.engine.requests import DECODE_MODES, Request, Result, check_sampling
from synclib.engine.sampling import SampleWork, line_flags
from synclib.engine.sessions import SessionCache
from synclib.engine.stream import DecodeStream
from synclib.memory import CacheBudget, DeviceBudget, return_freed_memory, session_budget

__all__ = ["Engine"]


class Engine:
    """Batched, hooked prefill and sampling over a loaded model, with per-session KV reuse.

    Parameters
    ----------
    lm : LoadedModel
        From :func:`synclib.models.load_model`.
    max_rows : int, default 16
        Most rows per forward pass (the config's ``simulate.max_rows``).  On out-of-memory a batch is retried in
        halves and ``self.max_rows`` lowered for later calls (a refilled stream's joins are halved without lowering it).
    kv_reuse : bool, default True
        Keep each session's prompt keys/values and prefill only the new suffix: after its own previous prompt, or
        after the longest run of whole blocks another session's prompt started with (:mod:`synclib.engine.sessions`).
    max_cache_bytes : int or CacheBudget, optional
        Budget of the session caches in bytes, or a :class:`synclib.memory.CacheBudget` several engines share.  A
        session that does not fit is not stored (``stats["cache_skips"]``); resident ones stay until forgotten or
        replaced (not LRU: dialog turns visit their sessions in a cycle).  Default: on the CPU
        :func:`synclib.memory.session_budget`, on CUDA :meth:`synclib.memory.DeviceBudget.for_device`.
    decode : {"auto", "graph", "static", "dynamic"}, default "auto"
        ``"dynamic"``: cache and mask grow by a column per step, finished rows leave the batch (best on the CPU).
        ``"static"``: fixed shapes in preallocated slots (:class:`~synclib.engine.fixed.FixedSlots`), eager steps;
        ``"graph"``: the same, each step one CUDA-graph replay (eager where capture fails).  ``"auto"``: ``"graph"``
        on CUDA for models whose every layer is full attention through ``sdpa`` or ``eager``, else ``"dynamic"``.
        All give the same tokens up to float rounding.
    block_size : int, default 32
        Tokens per block of the session caches: sessions share keys/values in whole blocks.

    Attributes
    ----------
    stats : collections.Counter
        ``prefill_tokens`` (padding excluded), ``prefill_computed`` (padding included), ``reused_tokens`` and
        ``shared_tokens`` (prompt tokens from session caches, from other sessions' blocks), ``recomputed_tokens``
        (prefilled again because their session was not stored), ``cache_skips``, ``generated_tokens`` (rows of every
        decoding step, finished ones included), ``forward_calls``, ``oom_retries``, ``oom_cache_drops``,
        ``graph_steps``, ``graph_fallbacks``, ``slot_allocations``, ``host_reads`` and :class:`DecodeStream`'s.
    seconds : collections.Counter
        Wall seconds per category (:meth:`timed`): a stream's ``decode``, ``join`` and ``read``, whole ``generate``
        calls, and the categories callers time (e.g. the simulation's ``passive`` and ``tom``).
    sync_timing : bool
        Wait for the device at the end of every timed section, so that GPU work is counted where it was launched.
    """


    def __init__(self, lm, max_rows: int = 16, kv_reuse: bool = True,
                 max_cache_bytes: "int | CacheBudget | None" = None, decode: str = "auto",
                 block_size: int = 32):
        if int(max_rows) < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, got {decode!r}")
        if decode in ("graph", "static") and not full_attention_only(lm.model):
            raise ValueError(f"decode={decode!r} needs a model whose every layer attends to the full context "
                             f"through sdpa or eager attention; {lm.name} does not (use 'dynamic' or 'auto')")
        if decode == "auto":
            decode = "graph" if lm.device.type == "cuda" and full_attention_only(lm.model) else "dynamic"
        #: the decoding mode in use ("graph", "static" or "dynamic"; see the ``decode`` parameter)
        self.decode = decode
        #: the last CUDA graph capture failure (``"TypeName: message"``), None if none failed
        self.graph_error: str | None = None
        self.lm = lm
        self.max_rows = int(max_rows)
        self.kv_reuse = bool(kv_reuse)
        if max_cache_bytes is None:
            max_cache_bytes = DeviceBudget.for_device(lm.device) if lm.device.type == "cuda" \
                else session_budget("auto")
        if lm.device.type == "cpu":
            return_freed_memory()
        #: the session caches' budget (:class:`synclib.memory.CacheBudget`, possibly shared)
        self.budget = max_cache_bytes if isinstance(max_cache_bytes, CacheBudget) else CacheBudget(max_cache_bytes)
        self.stats: Counter = Counter()
        self.seconds: Counter = Counter()
        self.sync_timing = False
        self.sessions = SessionCache(self.budget, self.kv_reuse, self.stats, block_size)
        self._lines = None  # per-token line-break flags, see _line_flags
        self._work = None  # the CPU's sampling buffers, see _sample_work

    @contextmanager
    def timed(self, category: str):
        """Add the wall time of the ``with`` block to ``seconds[category]`` (see ``sync_timing``)."""
        t0 = perf_counter()
        try:
            yield
        finally:
            if self.sync_timing and self.lm.device.type == "cuda":
                import torch

                torch.cuda.synchronize(self.lm.device)
            self.seconds[category] += perf_counter() - t0

    # -- session cache ---------------------------------------------------------------
    @property
    def max_cache_bytes(self) -> int:
        """The session caches' budget in bytes (shared with the budget's other engines)."""
        return self.budget.limit

    def forget(self, session: Hashable) -> None:
        """Drop the cached keys/values of ``session`` (call when an episode ends)."""
        self.sessions.forget(session)

    def clear(self) -> None:
        """Drop every session cache."""
        self.sessions.clear()

    @property
    def cached_sessions(self) -> int:
        """Number of sessions holding keys/values."""
        return len(self.sessions)

    # -- rows in batches ----------------------------------------------------------------
    def _ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.lm.encode(prompt)
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("empty prompt (no tokens)")
        return ids

    def _run_rows(self, prompts: Sequence, sessions: Sequence | None,
                  fn: Callable[[list, list], list]) -> list:
        """Apply ``fn(chunk, rows) -> list`` (one batch's prompt indices and their ``(token ids, session)``; a result
        per row) to the prompts in engine order and batches; results in prompt order (``sessions`` None: no reuse)."""
        ids = [self._ids(p) for p in prompts]
        sessions = list(sessions) if sessions is not None else [None] * len(ids)
        if len(sessions) != len(ids):
            raise ValueError(f"sessions has {len(sessions)} entries for {len(ids)} prompts")
        order = self.order(ids, sessions)
        res = self._batched(order, lambda chunk: fn(chunk, [(ids[i], sessions[i]) for i in chunk]))
        out: list = [None] * len(ids)
        for i, r in zip(order, res):
            out[i] = r
        return out

    def order(self, ids: Sequence[list], sessions: Sequence) -> list[int]:
        """Indices of rows ``ids`` (with their ``sessions``) in batching order: similar new-token counts together,
        most first, then the longest first (:meth:`generate` queues its rows in this order)."""
        return sorted(range(len(ids)), key=lambda i: (-self.sessions.new_tokens(ids[i], sessions[i]), -len(ids[i])))

    def _batched(self, items: list, fn: Callable[[list], list]) -> list:
        """Apply ``fn`` to chunks of ``items`` (at most ``max_rows``); out of memory, :meth:`_out_of_memory` decides.
        Results do not change: a row's outputs depend neither on its batch nor on what was cached."""
        import torch

        out: list = []
        start = 0
        while start < len(items):
            chunk = items[start:start + self.max_rows]
            handed_over = self.sessions.handed_over
            try:
                out.extend(fn(chunk))
                start += len(chunk)
            except Exception as exc:  # noqa: BLE001 - only OOM is handled
                if not is_oom(exc):
                    raise
                if self._out_of_memory(len(chunk), handed_over):
                    self.max_rows = max(1, len(chunk) // 2)
                del exc
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        return out

    def _out_of_memory(self, rows: int, handed_over: int) -> bool:
        """After work on ``rows`` rows ran out of memory (call it in the ``except``): count it; if session caches are
        held or the failed work took some over (``sessions.handed_over`` grew from ``handed_over``), drop them and
        return False (retry as it was); else return True (retry with fewer rows).  One row that does not fit
        re-raises."""
        self.stats["oom_retries"] += 1
        if len(self.sessions) or self.sessions.handed_over > handed_over:
            self.stats["oom_cache_drops"] += 1
            self.clear()
            return False
        if rows == 1:
            raise  # the out-of-memory error the caller is handling
        return True

    # -- prefill -------------------------------------------------------------------------
    def _prefill(self, rows: list[tuple[list, Hashable]]) -> Prefill:
        """Prefill ``rows`` (token ids, session) and update their sessions; rows whose new-token counts differ a lot
        go in separate groups (:func:`prefill_groups`), merged left-padded into one batch, so that one cache miss
        does not make every row compute as many tokens as the longest."""
        new = [self.sessions.new_tokens(ids, session) for ids, session in rows]
        groups = prefill_groups(new)
        if len(groups) == 1:
            return self._prefill_group(rows)
        self.stats["prefill_splits"] += len(groups) - 1
        return merge_prefills([self._prefill_group([rows[i] for i in g]) for g in groups], groups)

    def _prefill_group(self, rows: list[tuple[list, Hashable]]) -> Prefill:
        """Prefill ``rows`` (token ids, session) in one padded batch over their cached prefixes; update sessions."""
        import torch

        found = [self.sessions.lookup(ids, session) for ids, session in rows]
        for (_, session), (entry, _) in zip(rows, found):
            if entry is not None:
                self.sessions.touch(session)
        batch = layout([ids for ids, _ in rows], [a for _, a in found], self.lm.pad_token_id, self.lm.device)
        cache = gather_prefixes([entry for entry, _ in found], batch.reused, batch.P)
        shared = sum(p for (entry, _), p in zip(found, batch.reused) if entry is not None and entry.shared)
        if self.kv_reuse:
            self.sessions.hand_over([session for _, session in rows])
        del found
        sink: list = []
        with torch.inference_mode(), last_token_states(self.lm.decoder_layers, sink):
            logits, cache = forward(self.lm.model, batch.input_ids, batch.mask, batch.positions[:, batch.P:], cache,
                                    last_only=True)
        self._count_prefill(rows, batch, shared)
        states = torch.stack(sink, dim=1).cpu().numpy()  # (B, L, D)
        if self.kv_reuse:
            self.sessions.store_rows(rows, cache)
        return Prefill(logits=logits[:, -1, :].float(), states=states, cache=cache, mask=batch.mask,
                       next_pos=batch.positions[:, -1] + 1, reused=batch.reused)

    def _count_prefill(self, rows, batch, shared: int = 0) -> None:
        """Count a prefill of ``rows`` laid out as ``batch``; ``shared`` reused tokens came from other sessions."""
        B, S = batch.input_ids.shape
        self.stats["forward_calls"] += 1
        self.stats["prefill_tokens"] += sum(len(ids) - p for (ids, _), p in zip(rows, batch.reused))
        self.stats["prefill_computed"] += B * S  # with the left padding: prefill_tokens / this = useful share
        self.stats["reused_tokens"] += sum(batch.reused)
        self.stats["shared_tokens"] += shared
        self.stats["recomputed_tokens"] += sum(max(0, self.sessions.recomputed(ids, session) - p)
                                               for (ids, session), p in zip(rows, batch.reused))

    # -- public API --------------------------------------------------------------------
    def read_states(self, prompts: Sequence, sessions: Sequence | None = None) -> np.ndarray:
        """Prefill only; the ``(len(prompts), n_layers, d_model)`` float32 states at the last prompt token of each of
        ``prompts`` (chat-formatted text or token ids), with ``sessions`` (one key or None per prompt) reused."""
        states = self._run_rows(prompts, sessions, lambda chunk, rows: list(self._prefill(rows).states))
        out = np.empty((len(states), self.lm.n_layers, self.lm.d_model), dtype=np.float32)
        for i, st in enumerate(states):
            out[i] = st
        return out

    def generate(self, requests: Sequence[Request], max_new_tokens: int = 300,
                 temperature: float = 0.7, on_step: Callable[[int], None] | None = None,
                 first_line_only: bool = False, top_k: int | None = None,
                 top_p: float | None = None) -> list[Result]:
        """Sample a reply for every request (``temperature`` 0: greedy); record its last-prompt-token states.
        Returns a list of Result, in the order of ``requests``.

        Parameters
        ----------
        top_k, top_p : optional
            Keep only the ``top_k`` most likely tokens, then the smallest set whose probability reaches ``top_p``, as
            ``transformers``' warpers do (:func:`sampling_distribution`); None (or 0, or top_p 1.0) leaves them off.
        on_step : callable, optional
            Called after every decoding step with the number of tokens generated in it.
        first_line_only : bool, default False
            Stop a row at the token that completes its first line (a line break after non-whitespace text; kept): for
            callers that keep only that line, whose text does not change (each row's random stream is its own).

        Rows are queued in :meth:`order` on a :class:`DecodeStream` that is not refilled: each batch of
        :attr:`max_rows` is prefilled once and decodes until its last row ends.
        """
        reqs = list(requests)
        with self.timed("generate"):
            stream = self.stream(max_new_tokens, temperature, first_line_only, top_k, top_p, on_step, refill=False)
            ids = [self._ids(r.prompt) for r in reqs]
            for i in self.order(ids, [r.session for r in reqs]):
                stream.submit(i, replace(reqs[i], prompt=ids[i]))  # encoded once
            out: list = [None] * len(reqs)
            for i, res in stream.run():
                out[i] = res
            return out

    def stream(self, max_new_tokens: int = 300, temperature: float = 0.7, first_line_only: bool = False,
               top_k: int | None = None, top_p: float | None = None, on_step: Callable[[int], None] | None = None,
               capacity: int | None = None, decode: str | None = None, **admission) -> "DecodeStream":
        """A :class:`DecodeStream` over this engine, with :meth:`generate`'s arguments; ``capacity`` (default
        ``max_rows``), ``decode`` (default: the engine's) and ``admission`` (``join_min``, ``kv_tokens``, ``refill``)
        are the stream's own."""
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        return DecodeStream(self, max_new_tokens, (temperature, top_k, top_p), first_line_only,
                            capacity or self.max_rows, on_step=on_step, decode=decode or self.decode, **admission)

    # -- decoding helpers (the stream's) --------------------------------------------------
    def _count_step(self, rows: int, on_step, *counters) -> None:
        """Count one decoding step of ``rows`` rows (in ``stats`` and ``counters``); report it."""
        for c in (self.stats, *counters):
            c["decode_steps"] += 1
            c["generated_tokens"] += rows
        if on_step is not None:
            on_step(rows)

    def _stop_ids(self):
        """The model's stop token ids, ``(S,)`` long on its device."""
        import torch

        return torch.tensor(sorted(self.lm.stop_token_ids), dtype=torch.long, device=self.lm.device)

    def _sample_work(self, vocab: int) -> SampleWork | None:
        """The CPU's kept sampling buffers (:class:`~synclib.engine.sampling.SampleWork`); None on other devices."""
        if self.lm.device.type != "cpu":
            return None
        if self._work is None or self._work.V != vocab:
            self._work = SampleWork(vocab)
        return self._work

    def _line_flags(self, vocab: int):
        """:func:`~synclib.engine.sampling.line_flags` of the model's tokenizer, cached."""
        if self._lines is None or self._lines[0].numel() != vocab:
            self._lines = line_flags(self.lm.tokenizer, vocab, self.lm.device)
        return self._lines

    # -- candidate scoring -----------------------------------------------------------------
    def sequence_logprobs(self, prompts: Sequence, sequences: Sequence[Sequence[Sequence[int]]],
                          sessions: Sequence | None = None) -> list[np.ndarray]:
        """Log-probability of each candidate token sequence right after each prompt.

        ``log P(seq | prompt)`` by teacher forcing over the prompt's prefill (:func:`continuation_logprobs`; a
        sequence's proper prefixes are fed once per row).  Nothing is normalised: a candidate that is a token prefix
        of another (``"1"`` and ``"10"``) is not told apart from it; end each sequence with a terminator (the
        constrained judge appends the end-of-turn token) or use :class:`~synclib.engine.CandidateWords`.

        Parameters
        ----------
        prompts : sequence of P str or token-id lists
        sequences : sequence of P sequences of non-empty token-id sequences
            ``sequences[i]`` are the candidates of prompt ``i`` (any number per prompt).
        sessions : sequence of P hashable, optional
            Session key per prompt for KV reuse.  Several rows may name the same session, e.g. one prefilled
            beforehand (:meth:`read_states`) with the prompts' shared prefix, so that it is computed once (each row
            then stores its own prompt there: the last one stays).

        Returns ``out`` (P arrays): ``out[i][j]`` the float64 natural-log probability of ``sequences[i][j]`` after
        ``prompts[i]``.
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
                              lambda chunk, rows: self._logprob_batch(rows, [seqs[i] for i in chunk]))

    def _logprob_batch(self, rows, seqs) -> list[np.ndarray]:
        """:meth:`sequence_logprobs` of one batch: ``rows`` (token ids, session), ``seqs`` per row."""
        import torch

        pre = self._prefill(rows)
        logp_first = torch.log_softmax(pre.logits, dim=-1)  # (B, V)
        items = [(b, s) for b, row in enumerate(seqs) for s in row]
        rest, calls = continuation_logprobs(self.lm.model, pre.cache, pre.mask, pre.next_pos, items,
                                            self.lm.pad_token_id, self.max_rows)
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
