"""A model's shape, read without loading it: layers, width, heads, parameters.

:func:`model_shape` gives the dry run (:mod:`synclib.run.price`) and the run's sizing (:mod:`synclib.analysis.sizing`)
a model's size before it loads, from :data:`KNOWN_SHAPES`, a local ``config.json``, a ``.gguf`` file's metadata or
the local hub cache; nothing is downloaded and nothing here imports torch or transformers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Shape", "KNOWN_SHAPES", "DTYPE_BYTES", "model_shape"]

#: bytes per value of the dtypes a run computes or stores in
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shape:
    """A decoder's size: what the price needs of its ``config.json``."""

    layers: int
    width: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False
    params: int | None = None   # stated where the formula below does not hold (extra norms)
    source: str = ""

    @property
    def n_params(self) -> int:
        """Parameters: embeddings (+ output head unless tied) + per layer the attention
        projections, a gated MLP (3 matrices) and two norms, + the final norm (Llama/Mistral)."""
        if self.params:
            return int(self.params)
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        layer = self.width * q + 2 * self.width * kv + q * self.width + 3 * self.width * self.ffn + 2 * self.width
        return self.vocab * self.width * (1 if self.tied else 2) + self.layers * layer + self.width

    def kv_bytes_per_token(self, bpp: int) -> int:
        """Key/value cache bytes per token: layers x (key + value) x kv heads x head dim x bytes."""
        return self.layers * 2 * self.kv_heads * self.head_dim * bpp


_HUB = "the model's config.json on the hub"
#: the paper's six models (from their hub ``config.json``) and the embedded models; parameters from
#: :attr:`Shape.n_params` (tests hold the formula to the counts published for them)
KNOWN_SHAPES = {
    "mistralai/Mistral-7B-Instruct-v0.1": Shape(32, 4096, 14336, 32, 8, 128, 32000, source=_HUB),
    "mistralai/Mistral-7B-Instruct-v0.2": Shape(32, 4096, 14336, 32, 8, 128, 32000, source=_HUB),
    "mistralai/Mistral-7B-Instruct-v0.3": Shape(32, 4096, 14336, 32, 8, 128, 32768, source=_HUB),
    "meta-llama/Llama-2-7b-chat-hf": Shape(32, 4096, 11008, 32, 32, 128, 32000, source=_HUB),
    "meta-llama/Meta-Llama-3-8B-Instruct": Shape(32, 4096, 14336, 32, 8, 128, 128256, source=_HUB),
    "meta-llama/Llama-3.2-3B-Instruct": Shape(28, 3072, 8192, 24, 8, 128, 128256, tied=True, source=_HUB),
    "smollm2-135m": Shape(30, 576, 1536, 9, 3, 64, 49152, tied=True, source="the embedded model's config"),
    "gemma3-270m": Shape(18, 640, 2048, 4, 1, 256, 262144, tied=True, params=268_098_176,
                         source="the embedded model's config"),
}
def _shape_from_config(d: dict, source: str) -> Shape | None:
    d = d.get("text_config") or d
    try:
        layers, width = int(d["num_hidden_layers"]), int(d["hidden_size"])
        heads = int(d.get("num_attention_heads") or 1)
        return Shape(layers, width, int(d.get("intermediate_size") or 4 * width), heads,
                     int(d.get("num_key_value_heads") or heads), int(d.get("head_dim") or width // heads),
                     int(d.get("vocab_size") or 0), bool(d.get("tie_word_embeddings", False)), source=source)
    except (KeyError, TypeError, ValueError):
        return None


def model_shape(spec: str) -> Shape | None:
    """:class:`Shape` of a model spec without loading it, None when unknown: :data:`KNOWN_SHAPES` first, then a local
    directory's ``config.json``, a ``.gguf`` file's metadata, then the local hub cache's ``config.json``."""
    if spec in KNOWN_SHAPES:
        return KNOWN_SHAPES[spec]
    p = Path(str(spec)).expanduser()
    if p.suffix == ".gguf" and p.is_file():
        return _gguf_shape(p)
    if (p / "config.json").is_file():
        try:
            return _shape_from_config(json.loads((p / "config.json").read_text()), f"{p / 'config.json'}")
        except (OSError, ValueError):
            return None
    if "/" in str(spec) and not p.exists():
        try:
            from huggingface_hub import try_to_load_from_cache

            f = try_to_load_from_cache(str(spec), "config.json")
            if isinstance(f, str):
                return _shape_from_config(json.loads(Path(f).read_text()), "the hub cache's config.json")
        except Exception:  # noqa: BLE001 - unknown, not an error: the plan says so
            return None
    return None


def _gguf_shape(path: Path) -> Shape | None:
    """The shape a GGUF file's metadata states (``{arch}.block_count``, ``.embedding_length``, ...)."""
    # gguf's reader memory-maps the file; only a .gguf spec needs it
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def field(key: str):
        f = reader.fields.get(key)
        return None if f is None else f.parts[f.data[0]]

    arch = field("general.architecture")
    if arch is None:
        return None
    arch = bytes(arch).decode()
    get = {k: (None if (v := field(f"{arch}.{k}")) is None else int(v[0]))
           for k in ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                     "attention.head_count_kv", "attention.key_length")}
    if get["block_count"] is None or get["embedding_length"] is None:
        return None
    width, heads = get["embedding_length"], get["attention.head_count"] or 1
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return Shape(get["block_count"], width, get["feed_forward_length"] or 4 * width, heads,
                 get["attention.head_count_kv"] or heads, get["attention.key_length"] or width // heads,
                 len(tokens.data) if tokens is not None else 0, source=f"{path.name}'s metadata")
