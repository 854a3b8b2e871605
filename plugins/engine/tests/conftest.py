"""A tiny random Llama checkpoint (transformers-built, safetensors) with a locally trained tokenizer."""

from __future__ import annotations

import gc
import weakref
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
        key = repr(sorted(options.items()))  # options may hold dicts (attention_backend_options)
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


_LIVE_LLMS: weakref.WeakSet = weakref.WeakSet()


@pytest.fixture(scope="session", autouse=True)
def _track_llms():
    """Remember every LLM built in the session, so that each test's end can check its block ledger."""
    from kernelbay_engine.llm import LLM

    build = LLM.__init__

    def init_and_track(self, *args, **kwargs):
        build(self, *args, **kwargs)
        _LIVE_LLMS.add(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LLM, "__init__", init_and_track)
        yield


@pytest.fixture(autouse=True)
def _no_leaked_blocks(_track_llms):
    """After every test, no LLM's request still holds a KV block (reference counts back to zero; cached blocks
    may stay) and its ledger agrees with itself. A stream dropped without closing is collected first."""
    yield
    engines = [llm for llm in list(_LIVE_LLMS) if hasattr(llm, "_core")]
    if any(llm._core.scheduler.blocks.num_used_blocks for llm in engines):
        gc.collect()  # a suspended stream aborts its requests when it is collected
    for llm in engines:
        blocks = llm._core.scheduler.blocks
        held = {rid: blocks.block_table(rid) for rid in blocks.request_ids()}
        assert not held and blocks.num_used_blocks == 0, f"KV blocks still held after the test: {held}"
        assert blocks.audit() == []
