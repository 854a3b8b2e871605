"""A tiny random Llama checkpoint (transformers-built, safetensors) with a locally trained tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .checkpoints import build_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """Folder of a tiny random Llama: config.json, model.safetensors, tokenizer files."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def hf_tiny_llama(tiny_llama):
    """The same checkpoint loaded by transformers (the reference)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32).eval()


_LLMS: dict = {}


@pytest.fixture(scope="session")
def make_llm(tiny_llama):
    """LLM(tiny_llama, **options), built once per distinct option set in the session."""
    from kernelbay_engine import LLM

    def make(**options):
        key = tuple(sorted(options.items()))
        if key not in _LLMS:
            _LLMS[key] = LLM(tiny_llama, progress=False, **options)
        return _LLMS[key]

    return make


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tiny matmuls on a shared 2-core machine run faster (and steadier) on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
