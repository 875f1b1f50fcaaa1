"""synclib.models: loading from a local directory, GGUF (embedded), errors, chat formatting."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from synclib.models import (EMBEDDED, LoadedModel, ModelNotFoundError, cache_dir,
                            find_decoder_layers, load_model)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir) -> LoadedModel:
    return load_model(tiny_model_dir)


def test_tiny_dir_loads_through_the_hub_code_path(tiny, tiny_model_dir):
    assert tiny.source == f"dir:{tiny_model_dir}"
    assert (tiny.n_layers, tiny.d_model) == (4, 64)
    assert tiny.device.type == "cpu" and tiny.dtype == torch.float32
    assert next(tiny.model.parameters()).dtype == torch.float32
    assert tiny.decoder_layers == list(tiny.model.model.layers)
    assert not tiny.model.training
    im_end = tiny.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in tiny.stop_token_ids


def test_chat_prompt_uses_the_template_and_bos_once(tiny):
    text = tiny.chat_prompt("Hello there", system="Be brief.")
    assert text.endswith("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text
    ids = tiny.encode(text)
    bos = tiny.tokenizer.bos_token_id
    assert ids.count(bos) == text.count(tiny.tokenizer.bos_token)  # no extra BOS added
    assert tiny.tokenizer.decode(ids) == text


def test_fallback_formats_without_a_template(tiny):
    tok = copy.deepcopy(tiny.tokenizer)
    tok.chat_template = None
    gemma = dataclasses.replace(tiny, tokenizer=tok, model_type="gemma3_text")
    assert not gemma.has_chat_template
    bos = tok.bos_token
    assert gemma.chat_prompt("Hi", system="Sys") == (
        f"{bos}<start_of_turn>user\nSys\n\nHi<end_of_turn>\n<start_of_turn>model\n")
    other = dataclasses.replace(tiny, tokenizer=tok, model_type="gpt2")
    assert other.chat_prompt("Hi") == "Hi\n"


def test_dtype_argument(tiny_model_dir):
    lm = load_model(tiny_model_dir, dtype="bfloat16")
    assert lm.dtype == torch.bfloat16 and next(lm.model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype 'float33'"):
        load_model(tiny_model_dir, dtype="float33")


def test_decoder_layers_of_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=64))
    assert find_decoder_layers(gpt2) == list(gpt2.transformer.h)

    class Wrapped(torch.nn.Module):  # unknown layout: found by num_hidden_layers
        def __init__(self):
            super().__init__()
            self.config = gpt2.config
            self.config.num_hidden_layers = 3
            self.stack = torch.nn.ModuleDict({"blocks": torch.nn.ModuleList(gpt2.transformer.h)})

    assert find_decoder_layers(Wrapped()) == list(gpt2.transformer.h)


def test_unknown_model_error_says_what_was_tried(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as err:
        load_model("no-such-org/no-such-model-synclib")
    msg = str(err.value)
    assert "embedded names" in msg and "smollm2-135m" in msg
    assert "local path" in msg and "HF_HUB_OFFLINE" in msg and "no-such-org/no-such-model-synclib" in msg

    with pytest.raises(ModelNotFoundError, match="missing.gguf"):
        load_model(str(tmp_path / "missing.gguf"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(str(empty))
    with pytest.raises(ModelNotFoundError, match="non-empty"):
        load_model("")


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SYNCLIB_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("SYNCLIB_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "synclib"


@pytest.mark.slow
def test_embedded_smollm2_loads_caches_and_chats(monkeypatch, tmp_path):
    """First load de-quantises the GGUF into a fresh cache; the second reads the cache."""
    monkeypatch.setenv("SYNCLIB_CACHE", str(tmp_path))
    lm = load_model("smollm2-135m")
    assert "smollm2-135m" in EMBEDDED and lm.source.startswith("gguf-cache:")
    entries = list((tmp_path / "gguf").iterdir())
    assert len(entries) == 1 and (entries[0] / "synclib-complete").exists()  # no temp dir left
    assert (lm.n_layers, lm.d_model, lm.model_type) == (30, 576, "llama")
    text = lm.chat_prompt("What is the capital of France?")
    assert text.endswith("<|im_start|>assistant\n") and "What is the capital of France?" in text
    again = load_model("smollm2-135m")
    assert again.source == lm.source
    for (n1, p1), (n2, p2) in zip(lm.model.state_dict().items(), again.model.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    ids = torch.tensor([lm.encode(text)])
    with torch.no_grad():
        out = lm.model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in lm.decode(out[0, ids.shape[1]:])
