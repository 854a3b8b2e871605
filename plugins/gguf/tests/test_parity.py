"""kernelbay on a GGUF file against transformers on the same file: logits within 1e-4, same greedy tokens."""

from __future__ import annotations

import pytest
import transformers
from gguf import GGMLQuantizationType as Q

from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.config import ModelConfig
from plugins.gguf.tests._tiny import TINY_GGUF
from plugins.gguf.tests._write import K_QUANTS, transformers_from_gguf, write_gguf, write_random_k_quants
from tests.models._parity import BACKENDS, compare_generation, runner
from tests.models._tiny import COMMON, Tiny
from tests.models.conftest import build_reference


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("name", sorted(TINY_GGUF))
def test_gguf_logits_and_greedy_tokens_match_transformers(tiny_gguf, name, qtype, backend):
    """Four prompts of different lengths in one prefill, then 8 decode steps (Llama's Q/K rows un-permuted, Phi-3's
    fused projections, MoE experts read as per-expert slices of the stacked tensors)."""
    path = tiny_gguf(name, qtype)
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
    compare_generation(transformers_from_gguf(path), runner(model, backend), f"{name} {qtype.name} {backend}")


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q4_0, Q.Q4_1, Q.Q5_0], ids=lambda q: q.name)
def test_other_quant_types_dequantize_as_transformers_does(tiny_gguf, qtype):
    """Each further type on the Llama model, SDPA: the same bar after dequantization."""
    path = tiny_gguf("llama", qtype)
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
    compare_generation(transformers_from_gguf(path), runner(model, "SDPA"), f"llama {qtype.name}", steps=2)


def test_head_dim_comes_from_key_length(tmp_path):
    """Qwen3 with head_dim 24 != hidden / heads: transformers' GGUF reader drops attention.key_length, so the
    reference is the source model itself (F32 storage: the file holds its exact weights)."""
    tiny = Tiny("qwen3 head_dim 24", lambda: transformers.Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=True))
    source = build_reference("qwen3", tiny=tiny)
    path = write_gguf(tmp_path / "model.gguf", source, "qwen3")
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
    assert model.config.head_dim == 24
    compare_generation(source, runner(model, "SDPA"), "qwen3 head_dim 24")


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked experts", "one tensor per expert"])
def test_mixtral_file_is_llama_with_experts(tmp_path, stacked):
    """llama.cpp writes Mixtral as general.architecture llama plus llama.expert_count: kernelbay builds Mixtral.
    transformers loads such a file as a dense Llama with its MLPs newly initialised (the experts dropped), so the
    reference is the source model itself (F32 storage: the file holds its exact weights). Files converted before
    llama.cpp stacked the experts hold `blk.N.ffn_gate.E.weight` per expert: read the same."""
    config = transformers.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2)
    source = build_reference("mixtral", tiny=Tiny("mixtral-8x7b", lambda: config))
    path = write_gguf(tmp_path / "model.gguf", source, "llama", per_expert_tensors=not stacked)
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
    assert type(model).__name__ == "MixtralForCausalLM"
    compare_generation(source, runner(model, "SDPA"), "mixtral (llama + experts)")


LINEAR_ROPE = {
    # transformers' GGUF reader drops rope.scaling.*: the source model is the reference (F32: its exact weights)
    "gemma3": Tiny(
        "gemma-3-4b-it (linear x8 on the global layers)",
        lambda: transformers.Gemma3TextConfig(
            **{**COMMON, "num_hidden_layers": 6},
            head_dim=16,
            sliding_window=5,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
        ),
    ),
    "llama": Tiny(
        "a linear-scaled Llama",
        lambda: transformers.LlamaConfig(**COMMON, rope_scaling={"rope_type": "linear", "factor": 4.0}),
    ),
}


@pytest.mark.parametrize("name", sorted(LINEAR_ROPE))
def test_linear_rope_scaling_is_mapped(tmp_path, name):
    """rope.scaling.type linear + rope.scaling.factor -> rope_scaling (Gemma 3 4B-27B files carry it)."""
    source = build_reference(name, tiny=LINEAR_ROPE[name])
    path = write_gguf(tmp_path / "model.gguf", source, name)
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
    assert model.config.rope == ModelConfig.from_hf_config(source.config).rope
    compare_generation(source, runner(model, "SDPA"), f"{name} linear rope")


def test_mmap_maps_the_float_tensors_and_matches(tiny_gguf):
    """mmap=True: F32 tensors that need no un-permuting are views of the file; the model still matches."""
    path = tiny_gguf("qwen2")
    model = AutoModelForCausalLM.from_pretrained(path, progress=False, mmap=True)
    norm = dict(model.named_parameters())["model.norm.weight"]
    assert not norm.untyped_storage().resizable(), "the final norm should be mapped from the file, not copied"
    compare_generation(transformers_from_gguf(path), runner(model, "SDPA"), "qwen2 F32 mmap", steps=2)


@pytest.mark.parametrize("qtype", sorted(K_QUANTS), ids=lambda q: q.name)
def test_k_quants_dequantize_as_transformers_does(tmp_path, qtype):
    """K-quant blocks span 256 weights: a Llama with 256-wide rows, every 2-D weight in `qtype`, SDPA."""
    path = write_random_k_quants(tmp_path / "model.gguf", lambda name: qtype)
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
    compare_generation(transformers_from_gguf(path), runner(model, "SDPA"), f"llama {qtype.name}", steps=2)
