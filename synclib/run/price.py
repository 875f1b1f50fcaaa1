"""What a GPU run costs before it starts: the price lines of ``synclib run --dry-run`` on CUDA.

Every number names the measurement it comes from (:func:`reference`) and the rule that scales it to the grid. A
simulation job (:func:`price_simulation`) is scaled part by part: decoding steps by parameter bytes (memory-bound:
every step reads the weights) and by the measured rows per step over the rows that fit the card
(:func:`fitting_rows`); the prefills (joins, ToM read-outs, the passive reader) by parameters x the measured
float32/bfloat16 prefill ratio; writing the cube by its bytes; every dialog to ``max_utterances``. The analysis:
its ridge grids x the measured grid at paper scale; the judge: its requests and tokens at most (an endpoint's
throughput is not measured). Nothing here imports torch or loads a model.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from synclib import paths
from synclib.memory import GiB
from synclib.shapes import DTYPE_BYTES, model_shape
from synclib.simulate.options import Batching, default_units_per_part
from synclib.tasks.datasets import TASK_SETS, is_cached
from synclib.tasks.prompts import judge_intro
from synclib.tasks.scenarios import load_tasks

__all__ = ["LOCAL_DIR", "load_bench", "LoopRef", "loop_reference", "reference", "fitting_rows", "assumptions",
           "judge_prompt_tokens",
           "prefill_dtype_ratio", "scheduling_ratio", "kv_prompt_tokens", "SimPrice", "price_simulation",
           "analysis_grids", "price_analysis", "price_judge", "logins", "check_scheduler", "card_name"]



#: where a run keeps its own measurements (``synclib bench``): ``RESULTS/bench``
LOCAL_DIR = "bench"
#: hub organisations whose models are gated (config/paper.yaml: "Llama models are gated")
GATED = ("meta-llama/",)


def card_name(gpu: str) -> str:
    """The device class of a card name: ``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", gpu or "")
    return m.group(1) if m else (gpu or "a GPU")


# --------------------------------------------------------------------------- measurements
def load_bench(name: str, bench: Path | None = None) -> dict | None:
    """``NAME`` in ``bench`` (default ``bench/results``) as a dict; None when it is missing or unreadable."""
    f = Path(bench or paths.BENCH_RESULTS) / name
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class LoopRef:
    """One measured run of the dialog loop: ours on a GPU or the user's own (``synclib bench``)."""

    file: str
    gpu: str
    gpu_gib: float | None
    date: str
    label: str
    mode: str                  # scheduling: "turns" | "continuous"
    dtype: str
    params: int                # parameters of one agent's model (a pair of two: their mean)
    layers: int
    width: int
    tasks: int
    seeds: int
    batch: int | None
    wall: float
    generated: int             # genuine + ToM utterances generated
    reads: int                 # passive reader's utterances read (prefill only)
    passive: bool
    tom: bool
    max_utterances: int
    parts: dict | None         # seconds per part of the loop (join, decode, tom, passive, cube, other)
    values_per_round: int | None = None  # hidden-state values one round stores, both agents (layers x width)
    local: bool = False        # measured by `synclib bench` for this run (RESULTS/bench)
    commit: str | None = None  # the engine's commit that measured it
    weights: str = ""          # what weights ran
    tasks_from: str = ""       # which task set
    replies: str = ""          # how replies ended
    prompt_max: int | None = None  # the longest prompt it reached (tokens)
    two_streams: bool = False  # two models' streams took turns (a continuous pair of two models)
    rows_per_step: float | None = None  # the rows a decoding step of the measured loop held, on average
    path: Path | None = None

    @property
    def card(self) -> str:
        return card_name(self.gpu) if self.gpu_gib is not None or self.gpu != "cpu" else "the CPU"

    @property
    def rate(self) -> float:
        return self.generated / self.wall

    @property
    def stored_values(self) -> int:
        """Hidden-state values the measured run stored."""
        views = self.tasks * self.seeds * (1 + int(self.passive) + int(self.tom))
        per_round = self.values_per_round or 2 * self.layers * self.width  # a self-pair: both agents the same
        return views * math.ceil(self.max_utterances / 2) * per_round

    def describe(self) -> str:
        return (f"{self.file} ({self.date}, {self.gpu}): {self.label}, {self.tasks} tasks x {self.seeds} seed(s), "
                f"{self.rate:.2f} utterances/s, a {self.params / 1e9:.2f}B-parameter {self.layers}x{self.width} "
                f"shape in {self.dtype}")


#: the shapes of the benchmarks' random models (bench/bench_simulate.py's presets)
_PRESETS = {"mistral7b": "Mistral-7B's shape", "tiny": "a tiny Mistral-like shape (4 layers x 256)"}


def _dtype_name(d) -> str:
    return str(d or "bfloat16").replace("torch.", "")


def _scheduling_refs(f: Path, d: dict, date: str, local: bool) -> list[LoopRef]:
    """The loops of one scheduling benchmark (``bench_scheduling.py`` or ``synclib bench``)."""
    m = d.get("machine", {})
    gpu, gib = m.get("gpu") or ("cpu" if str(m.get("device", "")).startswith("cpu") else "a GPU"), m.get("gpu_memory_gib")
    st = d.get("settings", {})
    out = []
    for name, r in d.get("results", {}).items():
        model = r.get("model", {})
        for mode, v in r.get("modes", {}).items():
            seeds = len(st.get("seeds", [0]))
            u = int(st.get("max_utterances", 16))
            passive, tom = bool(st.get("passive")), bool(st.get("tom"))
            layers, widths = model.get("n_layers_each"), model.get("d_model_each")
            random = "newline_every" in model or model.get("preset") in ("mistral7b", "tiny")
            every = model.get("newline_every")
            if random:
                replies = f"a random model's, ending at a line break about every {every} tokens" if every \
                    else "a random model's"
            else:
                replies = (f"the models' own (at most {st.get('max_new_tokens')} tokens"
                           + (", to the first line break)" if st.get("stop_at_first_line", True) else ")"))
            out.append(LoopRef(
                f.name, gpu, gib, date, (f"synclib bench of {name}, " if local else "") + f"{mode} scheduling", mode,
                _dtype_name(st.get("dtype") or model.get("dtype")),
                int(model.get("n_params") or 7_241_732_096), int(model.get("n_layers") or 32),
                int(model.get("d_model") or 4096), int(st.get("tasks", 0)), seeds, st.get("batch_size"),
                float(v["wall_s"]), int(v["utterances"]),
                int(v["reads"]) if "reads" in v else (st.get("tasks", 0) * seeds * u if passive else 0),
                passive, tom, u, v.get("seconds"),
                values_per_round=sum(a * b for a, b in zip(layers, widths)) if layers and widths else None,
                local=local, commit=d.get("commit") or m.get("commit"),
                weights=(f"random weights at {_PRESETS.get(model.get('preset'), 'a random shape')} (not trained "
                         "checkpoints)" if random
                         else model.get("weights", "") + (f" ({', '.join(model['specs'])})" if model.get("specs") else "")),
                tasks_from=st.get("tasks_from") or "the embedded tasks",
                replies=replies,
                prompt_max=v.get("prompt_tokens_max"),
                two_streams=mode == "continuous" and len(set(model.get("specs") or [])) == 2,
                rows_per_step=v.get("rows_per_step"), path=f))
    return out


def _simulate_refs(f: Path, d: dict, date: str) -> list[LoopRef]:
    """The dialog loops of a ``bench_simulate`` / end-to-end benchmark (no passive reader, no ToM)."""
    m = d.get("machine", {})
    gpu, gib = m.get("gpu", "a GPU"), m.get("gpu_memory_gib")
    steps = d.get("steps") if isinstance(d.get("steps"), list) else []
    sims = [(s.get("label", "dialog loop"), s.get("simulate", {})) for s in steps if isinstance(s, dict)]
    if d.get("benchmark") == "bench_simulate" and isinstance(d.get("simulate"), dict):
        sims.append(("bench_simulate's dialog loop", d["simulate"]))
    model = d.get("model") or {}
    out = []
    for label, s in sims:
        if not s.get("utterances_per_s") or not s.get("seconds"):
            continue
        out.append(LoopRef(
            f.name, gpu, gib, date, label + " (no passive reader, no ToM)", "turns", _dtype_name(s.get("dtype")),
            int(model.get("n_params") or 7_241_732_096), int(model.get("n_layers") or 32),
            int(model.get("d_model") or 4096), int(s.get("episodes", 0)), len(s.get("seeds", [0])),
            s.get("batch_size"), float(s["seconds"]), int(s["utterances"]), 0, False, False,
            int(s.get("max_utterances", 16)), None, commit=d.get("commit") or m.get("commit"),
            weights="random weights at Mistral-7B's shape (not trained checkpoints)", tasks_from="the embedded tasks",
            replies="a random model's", path=f))
    return out


def loop_reference(bench: Path | None = None, local: Path | None = None,
                   device: str | None = "cuda") -> LoopRef | None:
    """The newest ``synclib bench`` record in ``local`` (``RESULTS/bench``) on the same kind of device (any for
    ``device`` None), else the newest GPU loop in ``bench`` (default ``bench/results``), a ``scheduling``
    benchmark on a tie; None when nothing fits (a CPU run without its own record)."""
    cuda = str(device).startswith("cuda")
    if local is not None:
        mine = []
        for f in sorted(Path(local).glob("loop-*.json")):
            try:
                d = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if device is None or str(d.get("machine", {}).get("device", "")).startswith("cuda") == cuda:
                stamp = f"{d.get('date', '')} {d.get('time', '')}"
                mine += [(stamp, r) for r in _scheduling_refs(f, d, str(d.get("date", ""))[:10], True)]
        if mine:
            return max(mine, key=lambda t: t[0])[1]
    if not cuda:
        return None
    found = []
    for f in sorted(Path(bench or paths.BENCH_RESULTS).glob("*cuda*.json")):
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        date = str(d.get("date", ""))[:10]
        if d.get("benchmark") == "scheduling":
            found += [(date, 1, r) for r in _scheduling_refs(f, d, date, False)]
        found += [(date, 0, r) for r in _simulate_refs(f, d, date)]
    if not found:
        return None
    return max(found, key=lambda t: (t[0], t[1]))[2]


def reference(cfg: dict) -> LoopRef | None:
    """The measured loop a config's simulations are priced from (:func:`loop_reference` for its device)."""
    device = str(cfg["device"])
    return loop_reference(local=Path(cfg["results_dir"]) / LOCAL_DIR, device="cuda" if device.startswith("cuda") else
                          "cpu" if device.startswith("cpu") else None)


def prefill_dtype_ratio(bench: Path | None = None) -> tuple[float, str] | None:
    """Measured float32 / bfloat16 prefill time on a GPU (largest batch in both), and its source; or None."""
    for f in sorted(Path(bench or paths.BENCH_RESULTS).glob("simulate_cuda*.json")):
        d = json.loads(f.read_text())
        eng = d.get("engine", {})
        f32 = {r["batch_size"]: r for r in eng.get("float32", []) if r.get("prefill_only_s")}
        bf = {r["batch_size"]: r for r in eng.get("bfloat16", []) if r.get("prefill_only_s")}
        both = sorted(set(f32) & set(bf))
        if both:
            b = both[-1]
            r = f32[b]["prefill_only_s"] / bf[b]["prefill_only_s"]
            return r, (f"{f.name}: prefill of {b} x {f32[b].get('prompt_tokens', '?')} tokens "
                       f"{f32[b]['prefill_only_s']} s in float32, {bf[b]['prefill_only_s']} s in bfloat16, "
                       f"{d.get('machine', {}).get('gpu', 'a GPU')}")
    return None


def scheduling_ratio(measured: str, wanted: str, bench: Path | None = None) -> tuple[float, str] | None:
    """Time with ``wanted`` over ``measured`` scheduling, and its source; None when equal or not measured both."""
    if measured == wanted:
        return None
    for f in sorted(Path(bench or paths.BENCH_RESULTS).glob("*cuda*.json")):
        d = json.loads(f.read_text())
        if d.get("benchmark") != "scheduling":
            continue
        for r in d.get("results", {}).values():
            modes = r.get("modes", {})
            if measured in modes and wanted in modes:
                a, b = modes[measured]["utterances_per_s"], modes[wanted]["utterances_per_s"]
                return a / b, (f"{f.name}: {wanted} {b} against {measured} {a} utterances/s, "
                               f"{d.get('machine', {}).get('gpu', 'a GPU')}")
    return None


def kv_prompt_tokens(bench: Path | None = None) -> tuple[int, str]:
    """The longest prompt (tokens) a measured loop reached, and where; 2,048 when no benchmark recorded one."""
    best = None
    for f in sorted(Path(bench or paths.BENCH_RESULTS).glob("*cuda*.json")):
        d = json.loads(f.read_text())
        sims = [s.get("simulate", {}) for s in d.get("steps", []) if isinstance(s, dict)] \
            if isinstance(d.get("steps"), list) else []
        sims.append(d.get("simulate") or {})
        for s in sims:
            n = (s.get("prompt_tokens_agent1") or {}).get("max") if isinstance(s, dict) else None
            if n and (best is None or n > best[0]):
                best = (int(n), f"the longest prompt of a measured 16-utterance dialog, {f.name}")
    return best or (2048, "an assumed 2,048-token prompt (no benchmark recorded one)")


# --------------------------------------------------------------------------- a simulation job
@dataclass
class SimPrice:
    seconds: float | None
    note: str
    weights: float | None = None     # bytes
    kv: float | None = None          # bytes of the keys/values of the rows priced
    disk: float | None = None        # bytes of the cube's hidden states
    gpu_bytes: float | None = None   # weights + kv
    rows: int | None = None          # rows per forward priced: those that fit the card
    rows_configured: int | None = None  # rows the config asks for (rows_what says where from)
    rows_what: str = ""
    kv_row: float | None = None      # key/value bytes of one row (prompt + max_new_tokens tokens)
    fits: bool | None = None         # the weights and one row fit the card (None: no card to fit)

    @property
    def gpu_gib(self) -> float | None:
        return None if self.gpu_bytes is None else self.gpu_bytes / GiB


#: the share of a card's memory the weights and decoding rows may take; the rest is working memory
#: (activations, the allocator), and what ``cache_gib: auto`` keeps free (:class:`synclib.memory.DeviceBudget`)
CARD_SHARE = 0.9


def compute_dtype(cfg: dict) -> str:
    """The configured dtype; ``auto``: :func:`synclib.models.default_dtype`'s rule, without torch."""
    if cfg["dtype"] not in (None, "auto"):
        return cfg["dtype"]
    # lazy: the models' module (transformers' config) only where a CPU is priced
    from synclib.models import cpu_has_native_bf16

    return "bfloat16" if str(cfg["device"]).startswith("cuda") or cpu_has_native_bf16() else "float32"


def cube_bytes(cfg: dict, work: dict, shapes) -> float:
    """Uncompressed bytes (an upper bound) of one ordered run's hidden states: (genuine dialogs + passive reads
    + ToM dialogs) x rounds x (layers x width of A + of B) x the store dtype's bytes."""
    rounds = math.ceil(cfg["simulate"]["max_utterances"] / 2)
    units = work["dialogs"] + work["passive_reads"] + work["tom_dialogs"]
    per = sum(s.layers * s.width for s in shapes)
    return float(units * rounds * per * DTYPE_BYTES[cfg["simulate"]["store_dtype"]])


def _rows(cfg: dict, specs, cols: int) -> tuple[int, str]:
    """Configured rows of one model's batch or stream, and their source; ``cols``: a row's key/value tokens."""
    sim = cfg["simulate"]
    units = sim["units_per_part"] or default_units_per_part(cfg["device"])
    if sim["scheduling"] == "continuous":
        parts = 2 if sim["kv_tokens"] else 1
        rows = Batching.from_config(cfg).stream_capacity([units * (1 + int(sim["tom"]))] * 2)
        what = ("simulate.max_in_flight" if sim["max_in_flight"] else
                f"{'2 parts x ' if parts == 2 else ''}{units} units{' x 2 (genuine + ToM)' if sim['tom'] else ''} "
                "in one stream")
        if sim["kv_tokens"] and sim["kv_tokens"] // cols < rows:
            return max(1, sim["kv_tokens"] // cols), f"simulate.kv_tokens {sim['kv_tokens']:,}"
        return rows, what
    rows = sim["max_rows"] or units
    return rows, "simulate.max_rows" if sim["max_rows"] else f"simulate.units_per_part {units}"


def prompt_tokens(ref: LoopRef | None, bench: Path | None = None) -> tuple[int, str]:
    """The longest prompt a row is priced for: the measured loop's, else :func:`kv_prompt_tokens`."""
    if ref is not None and ref.prompt_max:
        return ref.prompt_max, f"the longest prompt of the measured loop, {ref.file}"
    return kv_prompt_tokens(bench)


def fitting_rows(configured: int, weights: float, kv_row: float, card_bytes: float | None) -> int:
    """The configured rows halved, as the engine halves a batch that runs out of memory, until they fit beside
    the weights in :data:`CARD_SHARE` of ``card_bytes``; 0 when one row does not; ``configured`` without a card."""
    if card_bytes is None:
        return configured
    room = CARD_SHARE * card_bytes - weights
    rows = configured
    while rows > 1 and rows * kv_row > room:
        rows //= 2
    return rows if rows * kv_row <= room else 0


def price_simulation(cfg: dict, specs: tuple, work: dict, ref: LoopRef | None,
                     bench: Path | None = None) -> SimPrice:
    """Seconds on ``ref``'s card, GPU memory and disk of one simulation job (see the module doc). Decoding time
    is scaled by ``ref.rows_per_step / rows`` where above 1; more rows than measured are not credited."""
    shapes = [model_shape(s) for s in specs]
    unknown = [s for s, sh in zip(specs, shapes) if sh is None]
    sim = cfg["simulate"]
    if unknown:
        return SimPrice(None, f"the shape of {', '.join(unknown)} is not known before it loads (not among the "
                              "known models, no local config.json): no estimate")
    dtype = compute_dtype(cfg)
    bpp = DTYPE_BYTES[dtype]
    same = specs[0] == specs[1]
    two_streams = sim["scheduling"] == "continuous" and not same
    weights = float(sum(s.n_params for s in shapes[: 1 if same else 2]) * bpp)
    prompt, _ = prompt_tokens(ref, bench)
    cols = prompt + sim["max_new_tokens"]
    configured, what = _rows(cfg, specs, cols)
    # turns: one model's batch at a time; continuous: each model's stream holds its slots
    kv_tok = [s.kv_bytes_per_token(bpp) for s in shapes]
    kv_row = float(cols * (sum(kv_tok) if two_streams else max(kv_tok)))
    card = ref.gpu_gib * GiB if ref is not None and ref.gpu_gib else None
    rows = fitting_rows(configured, weights, kv_row, card)
    disk = cube_bytes(cfg, work, shapes)
    kv = rows * kv_row
    out = SimPrice(None, "", weights, kv, disk, weights + kv, rows, configured, what, kv_row,
                   None if card is None else rows > 0)
    if ref is None:
        out.note = "no measured dialog loop on a GPU in bench/results: no time estimate"
        return out
    if rows == 0:
        out.note = (f"does not fit the {ref.gpu_gib:.1f} GiB of {ref.card}: the weights ({weights / GiB:.1f} GiB, "
                    f"{dtype}) and one row's keys/values ({kv_row / GiB:.2f} GiB) exceed {CARD_SHARE:.0%} of it; "
                    "use bfloat16 or a larger card")
        return out
    gen = sim["max_utterances"] * (work["dialogs"] + work["tom_dialogs"])
    reads = sim["max_utterances"] * work["passive_reads"]
    ref_bpp = DTYPE_BYTES.get(ref.dtype, 2)
    # bytes of one stream's model (a pair's mean), x2 where two streams step in turn
    f_dec = (sum(s.n_params for s in shapes) / 2 * bpp * (2 if two_streams else 1)
             / (ref.params * ref_bpp * (2 if ref.two_streams else 1)))
    f_pre = sum(s.n_params for s in shapes) / (2 * ref.params)
    if dtype != ref.dtype:
        pr = prefill_dtype_ratio(bench)
        r = pr[0] if pr else bpp / ref_bpp
        f_pre *= r if dtype == "float32" else 1 / r
    f_rows = max(1.0, ref.rows_per_step / rows) if ref.rows_per_step else 1.0
    sched = scheduling_ratio(ref.mode, sim["scheduling"], bench)
    f_sched = sched[0] if sched else 1.0
    if ref.parts:
        p = ref.parts
        pre = p.get("join", 0) + p.get("tom", 0)
        secs = (p.get("decode", 0) / ref.generated * gen * f_dec * f_rows + pre / ref.generated * gen * f_pre
                + p.get("other", 0) / ref.generated * gen
                + (p.get("passive", 0) / ref.reads * reads * f_pre if ref.reads else 0)
                + p.get("cube", 0) * disk / (ref.stored_values * 4))
    else:
        secs = ref.wall / ref.generated * (gen + reads) * (f_dec * f_rows + f_pre) / 2
    out.seconds = secs * f_sched
    out.note = (f"{gen:,} utterances generated + {reads:,} read at most, x{f_dec:.2f} decoding"
                + (f" x{f_rows:.2f} for {rows} rows (measured {ref.rows_per_step:g} a step)" if f_rows != 1 else "")
                + f", x{f_pre:.2f} prefill" + (f", x{f_sched:.3f} {sim['scheduling']}" if sched else "")
                + f" of {ref.file}")
    return out


def price_basis(cfg: dict, ref: LoopRef, bench: Path | None = None) -> list[str]:
    """The lines that say where the simulations' price comes from and how it scales."""
    dtype = compute_dtype(cfg)
    lines = [f"  measured: {ref.describe()}"]
    if ref.parts:
        lines.append("  its seconds by part: " + ", ".join(f"{k} {v:.0f}" for k, v in ref.parts.items()))
    two = cfg["simulate"]["scheduling"] == "continuous"
    lines.append("  scaled per model: decoding steps (memory-bound: every step reads the weights) by parameter "
                 f"bytes, and by the measured rows per step ({ref.rows_per_step or '?'}) over the rows that fit the "
                 "card where fewer (more are not credited); prefills (joins, ToM read-outs, passive reader) by "
                 "parameters; the cube's writing by its bytes; a pair of two models: "
                 + ("the sum of their parameter bytes for decoding (two streams take turns), the mean for prefill"
                    if two else "the mean of the two (each model speaks half the turns)"))
    if dtype != ref.dtype:
        pr = prefill_dtype_ratio(bench)
        bpp, rb = DTYPE_BYTES[dtype], DTYPE_BYTES.get(ref.dtype, 2)
        lines.append(f"  {ref.dtype} -> {dtype}: decoding x{bpp / rb:g} (bytes per parameter; no graph-decoding "
                     f"{dtype} rate measured), prefill x" + (f"{pr[0] if dtype == 'float32' else 1 / pr[0]:.2f} "
                                                             f"(measured: {pr[1]})" if pr else f"{bpp / rb:g} (bytes)"))
    sched = scheduling_ratio(ref.mode, cfg["simulate"]["scheduling"], bench)
    if sched:
        lines.append(f"  {ref.mode} -> {cfg['simulate']['scheduling']} scheduling: x{sched[0]:.3f} ({sched[1]})")
    return lines


def assumptions(cfg: dict, ref: LoopRef) -> list[str]:
    """The dry run's ``assumptions`` lines: what the price takes from its measurement as it is."""
    sim = cfg["simulate"]
    dtype = compute_dtype(cfg)
    where = f"{ref.gpu}" + (f", {ref.gpu_gib:.1f} GiB" if ref.gpu_gib else "")
    commit = (f"the engine of commit {ref.commit}" if ref.commit else
              "the engine's commit not recorded in the file")
    out = ["assumptions of the simulations' price:",
           f"  - measured {'here, by synclib bench' if ref.local else 'by us'}: {ref.file}, {ref.date}, {where}, "
           f"{commit}" + ("" if ref.local else " (the engine has changed since; a measurement of your own, "
                                               "`synclib bench`, prices from today's)"),
           f"  - weights: {ref.weights or 'not recorded'}"
           + ("" if ref.local else "; the paper's checkpoints have the shapes priced, not its replies"),
           f"  - tasks: {ref.tasks_from} ({ref.tasks} x {ref.seeds} seed(s)); priced for "
           f"{'the tasks of scenarios ' + str(cfg['scenarios']) if cfg['scenarios'] != 'embedded' else 'the embedded tasks'}",
           f"  - replies: {ref.replies or 'not recorded'}; priced at the measured time per utterance (longer replies "
           f"take longer: up to simulate.max_new_tokens {sim['max_new_tokens']} tokens each)",
           f"  - precision: measured in {ref.dtype}, priced in {dtype}"
           + (" (scaled: see above)" if dtype != ref.dtype else ""),
           f"  - rows: the configured rows where they fit {'the card' if ref.gpu_gib else 'memory'}, halved as the "
           f"engine halves a batch that runs out of memory (weights + rows x (prompt + max_new_tokens) tokens of "
           f"keys/values within {CARD_SHARE:.0%} of the card); the measured loop held {ref.rows_per_step or '?'} rows "
           f"a decoding step ({ref.batch or '?'} units per part), and fewer rows are priced with proportionally more "
           "steps",
           "  - utterances: every dialog to simulate.max_utterances (an upper bound: dialogs that end early cost less)",
           f"  - scheduling: measured {ref.mode}, priced {sim['scheduling']}"
           + (" (scaled: see above)" if ref.mode != sim["scheduling"] else "")]
    if not ref.local:
        out.append("  - your own card: `synclib bench --config FILE` plays one part of one ordered run (a few minutes) "
                   "and the dry run then prices from it")
    return out


# --------------------------------------------------------------------------- analysis, judge
def analysis_grids(cfg: dict) -> int:
    """Ridge grids one analysis job fits, as :func:`synclib.analysis.core.analyze` counts them: directions x split
    seeds x (conditions + each control's contrast, both sides, a lag's also size-matched + paper alpha +
    persona-disjoint + sample sizes)."""
    ana, sim = cfg["analysis"], cfg["simulate"]
    passive = (["passive"] + (["passive_own"] if sim["passive_own"] else [])) if sim["passive"] else []
    conds = ["genuine", "shuffled"] + passive + (["pseudo"] if ana["pseudo_dyads"] else []) \
        + [f"lag{int(k)}" for k in ana["lags"]]
    alpha = ana["alpha"]
    paper_alpha = alpha == "cv" or not (isinstance(alpha, (int, float)) and math.isclose(alpha, 0.1))
    per = (len(conds) + 2 * (len(conds) - 1) + len(ana["lags"]) + int(paper_alpha)
           + int(bool(ana["persona_disjoint"])) + len(ana["sample_sizes"] or ()))
    return 2 * len(ana["split_seeds"]) * per


def ridge_reference(card: str, bench: Path | None = None) -> dict | None:
    """The ridge grid at paper scale measured on ``card`` (else on any GPU)."""
    cands = []
    for f in sorted(Path(bench or paths.BENCH_RESULTS).glob("ridge_paper_cuda*.json")):
        d = json.loads(f.read_text())
        d["_file"] = f.name
        cands.append(d)
    same = [d for d in cands if card_name(d.get("env", {}).get("gpu", "")) == card]
    pick = (same or cands)
    return max(pick, key=lambda d: str(d.get("date", ""))) if pick else None


def price_analysis(cfg: dict, specs: tuple, work: dict, card: str, bench: Path | None = None) -> dict:
    """GPU seconds of the ridge grids, host and GPU memory of one analysis job."""
    shapes = [model_shape(s) for s in specs]
    ana = cfg["analysis"]
    out = {"seconds": None, "note": "", "host_bytes": None, "gpu_gib": None, "variable_bytes": None}
    if not all(shapes):
        out["note"] = "model shapes unknown before they load: no estimate"
        return out
    rounds = math.ceil(cfg["simulate"]["max_utterances"] / 2)
    n = ana["n_samples"] or work["dialogs"] * rounds
    var = [work["dialogs"] * rounds * s.layers * s.width * DTYPE_BYTES[cfg["simulate"]["store_dtype"]]
           for s in shapes]
    fit = n * sum(s.layers * s.width for s in shapes) * 4
    resident = ana["max_resident_gib"] * GiB
    out["variable_bytes"] = max(var)
    out["host_bytes"] = fit + sum(v for v in var if v <= resident)
    grids = analysis_grids(cfg)
    ref = ridge_reference(card, bench)
    if ref is None:
        out["note"] = f"{grids} ridge grids; no ridge benchmark on a GPU: no estimate"
        return out
    prec = ana.get("precision", "float32")
    key = f"ours_{prec}_3_seeds_s"
    per_grid = ref[key] / len(ref["split_seeds"])
    # the source side (a Gram matrix and its Cholesky factor per source layer) dominates: layers x width^2
    scale = sum(s.layers * s.width ** 2 for s in shapes) / (2 * ref["layers"] * ref["width"] ** 2)
    out["seconds"] = grids * per_grid * scale
    out["gpu_gib"] = ref.get(f"ours_{prec}_peak_gpu_mem_GiB")
    out["note"] = (f"{grids} ridge grids x {per_grid:.2f} s ({ref['_file']}, {prec}, {ref['n_samples']} samples, "
                   f"{ref['layers']}x{ref['layers']} layers of {ref['width']}, {ref['env'].get('gpu')})"
                   + (f" x{scale:.2f} for these shapes" if abs(scale - 1) > 1e-3 else ""))
    return out


#: characters per token the judge's price assumes (English in gpt-oss's and Llama's BPE tokenizers)
CHARS_PER_TOKEN = 4
#: output tokens per JSON-mode answer: 14 reasonings of about 60 words and their scores (thinking not counted)
ANSWER_TOKENS = 14 * 90


def judge_prompt_tokens(cfg: dict) -> tuple[int, int, str]:
    """Input tokens of one JSON-mode request: ``(fixed, transcript, where)``: instructions + first task's intro
    (at :data:`CHARS_PER_TOKEN`), the transcript's bound (``max_utterances`` x ``max_new_tokens``), text counted."""
    sim = cfg["simulate"]
    episodes = sim["episodes"]
    first = episodes[0] if isinstance(episodes, list) else 0
    fixed, where = _judge_fixed_tokens(str(cfg["scenarios"]), int(first))
    return fixed, sim["max_utterances"] * sim["max_new_tokens"], where


@functools.lru_cache(maxsize=8)
def _judge_fixed_tokens(scenarios: str, first: int) -> tuple[int, str]:
    # lazy: loads pandas and xarray
    from synclib.judge.prompt import load_instructions

    where = "its first task"
    if scenarios in TASK_SETS and not is_cached(TASK_SETS[scenarios]):
        scenarios, first = "embedded", 0
        where = "the embedded first task and instructions standing in for the tasks not fetched yet"
    task = load_tasks(scenarios).tasks[first]
    instructions, _ = load_instructions(scenarios)
    return (len(judge_intro(task)) + len(instructions)) // CHARS_PER_TOKEN, where


def price_judge(cfg: dict, work: dict) -> dict:
    """Requests one judge job sends (JSON mode: one per dialog) and their tokens at most."""
    jd = cfg["judge"]
    dialogs = min(int(jd["sample"] or work["dialogs"]), work["dialogs"])
    mode = jd["mode"] or ("json" if jd["url"] else "constrained")
    requests = dialogs if mode == "json" else dialogs * 2 * 7
    what = "one per dialog, both agents' 7 scores" if mode == "json" else "one per agent and dimension"
    out = {"requests": requests, "dialogs": dialogs, "what": what, "url": jd["url"], "concurrency": jd["concurrency"]}
    if mode == "json":
        fixed, transcript, where = judge_prompt_tokens(cfg)
        out.update(input_tokens=requests * (fixed + transcript), output_tokens=requests * ANSWER_TOKENS,
                   tokens_note=(f"per request at most {fixed + transcript:,} input tokens ({fixed:,} of instructions and "
                                f"intro, {where}, at {CHARS_PER_TOKEN} characters a token; {transcript:,} of transcript: "
                                f"{cfg['simulate']['max_utterances']} utterances x {cfg['simulate']['max_new_tokens']} "
                                f"tokens, an upper bound) and about {ANSWER_TOKENS:,} output tokens (14 reasonings and "
                                "scores; a reasoning model's thinking comes on top)"))
    return out


# --------------------------------------------------------------------------- logins, cluster
def logins(cfg: dict) -> list[str]:
    """Lines for gated models (``hf auth login``) and the judge's API key (whether set, never its value)."""
    out = []
    specs = sorted({m["spec"] for m in cfg["models"].values()} | ({cfg["judge"]["model"]} if not cfg["judge"]["url"]
                                                                  else set()))
    gated = [s for s in specs if str(s).startswith(GATED) and not Path(str(s)).expanduser().exists()]
    if gated:
        tok = "HF_TOKEN is set" if os.environ.get("HF_TOKEN") else "HF_TOKEN is not set; a token saved by it also works"
        out.append(f"login: Llama models are gated: accept each licence on the hub and run `hf auth login` ({tok}): "
                   + ", ".join(gated))
    if cfg["judge"]["url"]:
        var = cfg["judge"]["api_key_env"]
        out.append(f"login: the judge at {cfg['judge']['url']} reads its API key from ${var}: "
                   + ("set" if os.environ.get(var) else "not set (requests go without a key; a local vLLM needs none)"))
    return out


def check_scheduler(address: str, timeout: float = 5.0) -> dict:
    """Whether the dask scheduler at ``address`` answers within ``timeout`` s, its workers and GPU workers."""
    try:
        from distributed import Client
    except ImportError:
        return {"ok": False, "error": "dask.distributed is not installed"}
    try:
        client = Client(address, timeout=timeout, set_as_default=False)
    except Exception as exc:  # noqa: BLE001 - any failure to connect is "does not answer"
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    try:
        workers = client.scheduler_info(n_workers=-1).get("workers", {})
    except TypeError:
        workers = client.scheduler_info().get("workers", {})
    finally:
        client.close()
    gpus = [w for w in workers.values() if float((w.get("resources") or {}).get("GPU", 0)) >= 1]
    return {"ok": True, "workers": len(workers), "gpu_workers": len(gpus),
            "threads": sum(int(w.get("nthreads", 0)) for w in workers.values())}
