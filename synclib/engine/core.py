"""The :class:`Engine`: batched, hooked prefill and sampling over a loaded model, with session reuse.

It holds a :class:`~synclib.models.LoadedModel`, its session caches
(:class:`~synclib.engine.sessions.SessionCache`) and its counters, and runs rows in batches:
it orders them by new-token count, prefills each batch once with hooks
(:mod:`synclib.engine.prefill`), and then decodes (:meth:`Engine.generate`: one batch to its
longest reply, in a row store of :mod:`synclib.engine.dynamic` or :mod:`synclib.engine.fixed`),
only reads states (:meth:`Engine.read_states`), or scores candidates
(:mod:`synclib.engine.candidates`).  Out of memory, a batch is retried in halves.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from time import perf_counter
from typing import Callable, Hashable, Sequence

import numpy as np

from synclib.engine.candidates import CandidateWords, continuation_logprobs
from synclib.engine.dynamic import DynamicRows
from synclib.engine.fixed import FixedSlots
from synclib.engine.forward import forward, is_oom
from synclib.engine.masks import full_attention_only
from synclib.engine.prefill import (Prefill, gather_prefixes, last_token_states, layout, merge_prefills,
                                    prefill_groups)
from synclib.engine.requests import DECODE_MODES, Request, Result, check_sampling, uniforms
from synclib.engine.sampling import Replies, SampleWork, line_flags, sample
from synclib.engine.sessions import SessionCache
from synclib.engine.stream import DecodeStream
from synclib.memory import CacheBudget, DeviceBudget, return_freed_memory, session_budget

__all__ = ["Engine", "generate", "read_states", "word_distributions"]


class Engine:
    """Batched, hooked prefill and sampling over a loaded model, with per-session KV reuse.

    Parameters
    ----------
    lm : LoadedModel
        From :func:`synclib.models.load_model`.
    max_rows : int, default 16
        Most rows per forward pass (the config's ``simulate.max_rows``).  On out-of-memory a
        batch is retried in halves and the cap is lowered for later calls (``self.max_rows``).
    kv_reuse : bool, default True
        Keep each session's prompt keys/values and prefill only the new suffix: after its own
        previous prompt, or after the longest run of whole blocks another session's prompt
        started with (:mod:`synclib.engine.sessions`; each block is held once).
    max_cache_bytes : int or CacheBudget, optional
        Budget of the session caches in bytes, or a :class:`synclib.memory.CacheBudget`
        that several engines share (a model pair's two engines in a simulation).  A session
        that does not fit is not stored and its next prompt is prefilled whole (counted in
        ``stats["cache_skips"]``); the resident ones stay until forgotten or replaced.
        (Dialog turns visit their sessions in a cycle, and dropping the least recently used
        one would drop exactly the one the next turn needs: over budget, LRU reuses nothing
        while this keeps the share that fits.)
        Default: on the CPU :func:`synclib.memory.session_budget` (a quarter of the memory
        available, 256 MiB to 4 GiB); on CUDA a :class:`synclib.memory.DeviceBudget`, which
        stores a session while the device keeps a tenth of its memory (at least 2 GiB) free
        for the decoding slots and the forward passes (when they run out anyway, the
        session caches are dropped and the work retried: ``stats["oom_cache_drops"]``).
    decode : {"auto", "graph", "static", "dynamic"}, default "auto"
        How the decoding steps run.  ``"dynamic"``: the cache and mask grow by a column per
        step and finished rows leave the batch every ``sync_every`` steps (best on the CPU,
        where a step's cost follows the rows).  ``"static"``: preallocated keys/values and
        mask, fixed shapes, steps run eagerly (:class:`~synclib.engine.fixed.FixedSlots`).  ``"graph"``: as
        ``"static"``, each step one CUDA-graph replay (falls back to eager steps where the
        capture fails, counted in ``stats["graph_fallbacks"]``).  ``"auto"``: ``"graph"`` on
        CUDA for models it supports (every layer full attention through ``sdpa`` or
        ``eager``), else ``"dynamic"``.  All give the same tokens up to float rounding.
    block_size : int, default 32
        Tokens per block of the session caches: sessions share keys/values in whole blocks.

    Attributes
    ----------
    stats : collections.Counter
        ``prefill_tokens`` (tokens run through prefill, padding excluded),
        ``prefill_computed`` (token positions computed in prefill, left padding included:
        ``prefill_tokens / prefill_computed`` is the useful share), ``reused_tokens`` (prompt
        tokens taken from session caches), ``shared_tokens`` (the part of them taken from
        blocks another session stored), ``generated_tokens`` (the rows of every decoding
        step, finished rows still in the batch included), ``forward_calls``, ``oom_retries``,
        ``cache_skips`` (sessions not stored: the budget was full), ``recomputed_tokens``
        (prompt tokens prefilled again because their session was not stored), ``graph_steps``
        (decoding steps replayed as a CUDA graph), ``graph_fallbacks`` (batches whose capture failed); with a
        :class:`DecodeStream`, ``stream_joins``; ``decode_steps``; ``slot_allocations`` (fixed-slot
        buffers allocated: one per ``static``/``graph`` batch, and a stream's each time its longest
        prompt outgrows them); ``host_reads`` (device-to-host reads of sampled tokens: one per
        decoding step of a stream).
    seconds : collections.Counter
        Wall seconds per category of work, added by :meth:`timed` (``decode``: a stream's
        decoding steps, ``join``: its joining rows' prefill and admission, ``read``: its reads
        prefilled in forwards of their own, ``generate``: whole
        :meth:`generate` calls, and the categories its callers time, e.g. the simulation's
        ``passive`` and ``tom``).
    sync_timing : bool
        Wait for the device at the end of every timed section, so that asynchronous GPU
        work is counted where it was launched (off by default: it costs a host sync each).
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
        #: decoding steps between the host's checks for finished rows (None: 1 on CPU, 8 on GPUs)
        self.sync_every: int | None = None

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
        order = self.order(ids, sessions)
        res = self._batched(order, lambda chunk: fn(chunk, [(ids[i], sessions[i]) for i in chunk]))
        out: list = [None] * len(ids)
        for i, r in zip(order, res):
            out[i] = r
        return out

    def order(self, ids: Sequence[list], sessions: Sequence) -> list[int]:
        """The order in which the engine batches rows of token ``ids`` with their ``sessions``
        (indices into them): rows with similar new-token counts together, most first, then the
        longest first.  A caller that queues rows on a stream that is not refilled
        (:class:`DecodeStream`) queues them in this order to get :meth:`generate`'s batches."""
        return sorted(range(len(ids)), key=lambda i: (-self.sessions.new_tokens(ids[i], sessions[i]), -len(ids[i])))

    def _batched(self, items: list, fn: Callable[[list], list]) -> list:
        """Apply ``fn`` to chunks of ``items`` (at most ``max_rows``).

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
        """The one rule after work on ``rows`` rows ran out of memory (call it in the ``except``):
        count it; drop the session caches if any are held, or if the failed work took some over
        (``sessions.handed_over`` grew from ``handed_over``), and return False (retry as it was:
        the caches only save work); else return True (retry with fewer rows).  One row that
        does not fit re-raises the error being handled."""
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
        """Prefill ``rows`` (token ids, session); update their sessions.

        Rows whose new-token counts differ a lot (a session cache missed beside rows that
        hit theirs) are prefilled in separate padded groups (:func:`prefill_groups`) and
        merged, left-padded, into one batch for decoding: in one group every row would
        compute as many tokens as the longest new segment, so a single miss would undo the
        batch's prefix reuse.
        """
        new = [self.sessions.new_tokens(ids, session) for ids, session in rows]
        groups = prefill_groups(new)
        if len(groups) == 1:
            return self._prefill_group(rows)
        self.stats["prefill_splits"] += len(groups) - 1
        return merge_prefills([self._prefill_group([rows[i] for i in g]) for g in groups], groups)

    def _prefill_group(self, rows: list[tuple[list, Hashable]]) -> Prefill:
        """Prefill ``rows`` (token ids, session) in one padded batch (:func:`layout`) over their
        sessions' cached prefixes; update their sessions."""
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
        """Count a prefill of ``rows`` laid out as ``batch``, ``shared`` of whose reused tokens
        came from other sessions' blocks."""
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
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        sampling = (temperature, top_k, top_p)
        reqs = list(requests)
        with self.timed("generate"):
            return self._run_rows([r.prompt for r in reqs], [r.session for r in reqs],
                                  lambda chunk, rows: self._generate_batch(
                                      [ids for ids, _ in rows], [reqs[i] for i in chunk], max_new_tokens,
                                      sampling, on_step, first_line_only))

    def stream(self, max_new_tokens: int = 300, temperature: float = 0.7, first_line_only: bool = False,
               top_k: int | None = None, top_p: float | None = None, on_step: Callable[[int], None] | None = None,
               capacity: int | None = None, decode: str | None = None, **admission) -> "DecodeStream":
        """A :class:`DecodeStream` over this engine: continuous batching of generation rows.

        The arguments are :meth:`generate`'s; ``capacity`` (default ``max_rows``), ``decode``
        (default: the engine's own mode, so ``"dynamic"`` on the CPU and ``"graph"`` on CUDA
        for the models that allow it) and the keywords ``admission`` (``join_min``,
        ``kv_tokens``, ``refill``) are :class:`DecodeStream`'s.  The slot modes are tested
        against the dynamic one on the CPU and, with CUDA graphs, on a GPU
        (``tests/test_engine_cuda.py``); their speed there is in ``bench/gpu_notes.md``.
        """
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        return DecodeStream(self, max_new_tokens, (temperature, top_k, top_p), first_line_only,
                            capacity or self.max_rows, on_step=on_step, decode=decode or self.decode, **admission)

    # -- decoding ------------------------------------------------------------------------
    def _generate_batch(self, ids, reqs, max_new_tokens, sampling, on_step, first_line_only=False
                        ) -> list[Result]:
        """Prefill and decode one batch until its longest reply ends.

        The loop keeps the GPU busy: sampling, stop and line checks and the bookkeeping are
        tensor operations on the device (:class:`~synclib.engine.sampling.Replies`), and the
        host learns which rows have finished only every ``sync_every`` steps (every step on
        the CPU, where it costs nothing).  In a batch that compacts, finished rows leave once
        half of its rows have finished (:meth:`~synclib.engine.dynamic.DynamicRows.worth_keeping`);
        a finished row still in the batch decodes tokens that are never kept.
        """
        import torch

        dev, B = self.lm.device, len(reqs)
        U = uniforms([r.seed for r in reqs], max_new_tokens).to(dev)
        pre = self._prefill([(x, r.session) for x, r in zip(ids, reqs)])
        V = pre.logits.shape[-1]
        replies = Replies(B, max_new_tokens, self._stop_ids(), self._line_flags(V) if first_line_only else None)
        work = self._sample_work(V)
        store = self._row_store(B, max_new_tokens)
        pos, rows = store.add(pre), torch.arange(B, device=dev)  # rows: each batch row's original row
        sync_every = self.sync_every or (1 if dev.type == "cpu" else 8)
        for step in range(max_new_tokens):
            tok = sample(store.logits_of(pos), U[rows, step], sampling, work)
            replies.record(rows, step, tok)
            self._count_step(rows.numel(), on_step)
            if step == max_new_tokens - 1:
                break
            if (step + 1) % sync_every == 0:
                still = replies.going_on(rows)
                if still.numel() == 0:
                    break
                if store.compacts and store.worth_keeping(still.numel(), rows.numel()):
                    pos, rows, tok = store.keep([pos[i] for i in still.tolist()]), rows[still], tok[still]
            store.feed(pos, tok)
        return replies.results(self.lm, ids, pre)

    def _row_store(self, B: int, max_new_tokens: int):
        """Where one batch's rows decode: fixed slots (``decode`` static or graph) or one
        growing batch that finished rows leave (on the CPU with room for the reply,
        :func:`~synclib.engine.dynamic.with_room`)."""
        steps = max_new_tokens - 1
        if self.decode != "dynamic" and steps > 0:
            return FixedSlots(self, B, steps, graph=self.decode == "graph")
        room = steps if self.lm.device.type == "cpu" and steps > 0 else None
        return DynamicRows(self, Counter(), room=room, trim=False)

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
        """The buffers the CPU's sampling steps work in (:class:`~synclib.engine.sampling.SampleWork`),
        kept; None on other devices, whose allocators keep freed blocks for the next step themselves."""
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

        ``log P(seq | prompt)`` by teacher forcing: the first token's probability is read
        from the prompt's prefill, the later ones from feeding the sequence over the
        prefill's keys/values (:func:`continuation_logprobs`; a sequence's proper prefixes
        are fed once per row).  Nothing is normalised: a candidate that is a token prefix
        of another (``"1"`` and ``"10"``) is not told apart from it; end each sequence with
        a terminator (the constrained judge appends the end-of-turn token) or use
        :meth:`word_distributions` for that.  (A :class:`DecodeStream` row's
        :class:`~synclib.engine.probes.Probe` scores the same way, inside the stream.)

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

    def word_distributions(self, prompts: Sequence, candidates: Sequence[str],
                           sessions: Sequence | None = None, return_mass: bool = False):
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
            Or their :class:`~synclib.engine.CandidateWords` for this model's tokenizer
            (spelled once for many calls).
        sessions : sequence of P hashable, optional
            Session key per prompt for KV reuse.
        return_mass : bool, default False
            Also return the unnormalised total probability of the candidates (how much of
            the model's next-token distribution they cover).

        Returns
        -------
        numpy.ndarray
            ``(P, C)`` float64, rows summing to 1 (NaN rows when the candidates have zero
            probability); with ``return_mass``, also ``(P,)``.
        """
        words = candidates if isinstance(candidates, CandidateWords) else CandidateWords(self.lm.tokenizer, candidates)
        prompts = list(prompts)
        logps = self.sequence_logprobs(prompts, [words.seqs] * len(prompts), sessions)
        probs = np.empty((len(prompts), len(words.words)))
        mass = np.empty(len(prompts))
        for i, logp in enumerate(logps):
            probs[i], mass[i] = words.distribution(logp)
        return (probs, mass) if return_mass else probs


# -- one-shot wrappers -----------------------------------------------------------------
def generate(lm, requests: Sequence[Request], max_new_tokens: int = 300, temperature: float = 0.7,
             max_rows: int = 16) -> list[Result]:
    """:meth:`Engine.generate` with a fresh engine (sessions are not kept afterwards)."""
    return Engine(lm, max_rows=max_rows).generate(requests, max_new_tokens, temperature)


def read_states(lm, prompts: Sequence, max_rows: int = 16) -> np.ndarray:
    """Prefill-only states ``(len(prompts), n_layers, d_model)`` float32 (passive reader).

    ``prompts`` are chat-formatted texts (:meth:`LoadedModel.chat_prompt`) or token ids.
    """
    return Engine(lm, max_rows=max_rows, kv_reuse=False).read_states(prompts)


def word_distributions(lm, prompts: Sequence, candidates: Sequence[str], max_rows: int = 16,
                       return_mass: bool = False):
    """:meth:`Engine.word_distributions` with a fresh engine: ``(len(prompts), len(candidates))``."""
    return Engine(lm, max_rows=max_rows, kv_reuse=False).word_distributions(
        prompts, candidates, return_mass=return_mass)
