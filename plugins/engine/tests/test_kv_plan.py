"""The engine sizes its cache from the specs its backends allocate, and keeps one block ledger for it."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pytest

from kernelbay.attention import KVCacheSpec, clear_selection_cache
from kernelbay.registry import default_registry, register_attention_backend, reset_registry
from kernelbay_engine.sampling import SamplingParams
from kernelbay_torch.vanilla import VanillaBackend

BUDGET = 3 * 2**20
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@dataclass(frozen=True)
class ScaledSpec(KVCacheSpec):
    """VANILLA's cache plus one float32 scale per (plane, block, kv head), as acme's int8 cache keeps beside it."""

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size + self.planes * self.num_kv_heads * 4


class ScaledVanilla(VanillaBackend):
    """VANILLA's kernel over a cache whose blocks cost more than the model config's bytes per token imply."""

    name = "SCALED_VANILLA"

    @classmethod
    def get_kv_cache_spec(cls, *args, **kwargs) -> ScaledSpec:
        spec = super().get_kv_cache_spec(*args, **kwargs)
        return ScaledSpec(**{f.name: getattr(spec, f.name) for f in fields(spec)})


@pytest.fixture
def scaled_backend():
    """SCALED_VANILLA registered at runtime in a fresh registry; the previous registry is put back."""
    previous = default_registry()
    clear_selection_cache()
    reset_registry()
    register_attention_backend("SCALED_VANILLA", target=ScaledVanilla)
    yield "SCALED_VANILLA"
    reset_registry(previous)
    clear_selection_cache()


def _layer_blocks(llm) -> set[int]:
    """Blocks in each layer's allocated cache tensor."""
    return {layer.backend.kv_cache.shape[1] for layer in llm.model.attention_layers().values()}


def test_blocks_are_planned_from_the_allocated_specs(tiny_llama, make_llm, scaled_backend):
    """A backend whose spec is larger per block gets the blocks its own spec implies for kv_cache_memory, not
    the config's bytes per token; the scheduler's ledger and every cache tensor hold exactly that many."""
    from kernelbay_engine import LLM

    vanilla = make_llm(attention_backend="VANILLA", kv_cache_memory=BUDGET)
    scaled = LLM(tiny_llama, progress=False, attention_backend=scaled_backend, kv_cache_memory=BUDGET)
    layers = scaled.model.attention_layers()
    page = sum(
        ScaledVanilla.get_kv_cache_spec(layer.geometry, "float32", "auto", 16).page_size_bytes
        for layer in layers.values()
    )
    config_page = 16 * scaled.config.kv_bytes_per_token("float32")  # what the config alone would price a block at
    assert page == scaled.runner.bytes_per_block > config_page == vanilla.runner.bytes_per_block
    blocks = scaled._core.scheduler.blocks.num_blocks
    assert blocks == BUDGET // page < vanilla._core.scheduler.blocks.num_blocks
    assert scaled._core.scheduler.config.num_blocks == scaled.runner.num_blocks == blocks
    assert _layer_blocks(scaled) == {blocks} and _layer_blocks(vanilla) == {vanilla._core.scheduler.blocks.num_blocks}
    assert (
        scaled.generate("the quick brown fox", GREEDY)[0].token_ids
        == vanilla.generate("the quick brown fox", GREEDY)[0].token_ids
    )


def test_default_cache_holds_max_num_seqs_full_contexts(make_llm):
    """Without kv_cache_memory the ledger gets max_num_seqs full-context requests' blocks, and so does each layer."""
    llm = make_llm(max_num_seqs=3, block_size=16)
    blocks = llm._core.scheduler.blocks
    assert blocks.num_blocks == 3 * -(-llm.max_model_len // 16) == llm.runner.num_blocks
    assert _layer_blocks(llm) == {blocks.num_blocks}


def test_the_scheduler_is_the_only_block_ledger(make_llm):
    """During generation the runner keeps no accounting; afterwards every block is back in the scheduler's."""
    llm = make_llm()
    llm.generate(["the quick brown fox", "a fortune"], GREEDY)
    blocks = llm._core.scheduler.blocks
    assert blocks.num_free_blocks == blocks.num_blocks and not blocks.request_ids()
    assert llm.runner.num_cached_tokens(0) == 0 and llm.runner._own_blocks is None


@pytest.mark.parametrize("budget", [100_000, 777_777, BUDGET])
def test_explain_promises_what_the_engine_holds(tiny_llama, make_llm, scaled_backend, budget):
    """explain's tokens_that_fit for a budget is exactly the engine's blocks x block_size for that budget, also
    for a backend whose spec prices a block above the config's bytes per token (scales, as acme's int8 cache)."""
    from kernelbay_engine import LLM
    from kernelbay_engine.explain import explain_model

    for backend in ("VANILLA", scaled_backend):
        llm = LLM(tiny_llama, progress=False, attention_backend=backend, kv_cache_memory=budget)
        doc = explain_model(tiny_llama, backend=backend, memory=budget)
        held = llm._core.scheduler.config.num_blocks * llm._core.scheduler.config.block_size
        assert doc["sections"]["kv_memory"]["tokens_that_fit"] == held, (backend, budget)
