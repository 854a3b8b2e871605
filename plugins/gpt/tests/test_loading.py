"""Checkpoint names: transformers' and the original publishers' spellings load; a missing, unexpected or
mis-shaped tensor is an error that names it; variants this plugin does not build are refused by name."""

from __future__ import annotations

import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from kernelbay.errors import ConfigError
from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.config import ModelConfig
from kernelbay_engine.loading import CheckpointError
from plugins.gpt.tests._tiny_gpt import TINY_GPT
from tests.models._parity import compare_generation, runner


def _rewritten(tiny_checkpoints, tmp_path, name: str, edit):
    """A copy of the tiny `name` checkpoint whose tensors `edit(state)` changed; returns (folder, hf_model)."""
    folder, hf_model = tiny_checkpoints.get(name, TINY_GPT[name])
    copy = tmp_path / name
    shutil.copytree(folder, copy)
    state = load_file(copy / "model.safetensors")
    edit(state)
    save_file(state, copy / "model.safetensors", metadata={"format": "pt"})
    return copy, hf_model


def _load(folder):
    return AutoModelForCausalLM.from_pretrained(folder, progress=False)


def test_gpt2_as_openai_published_it_loads(tiny_checkpoints, tmp_path):
    """No `transformer.` prefix and the old causal-mask buffers (attn.bias): same logits and tokens."""

    def openai_names(state):
        for key in list(state):
            if key.startswith("transformer."):
                state[key.removeprefix("transformer.")] = state.pop(key)
        state["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 8, 8))
        state.pop("lm_head.weight", None)  # tied: OpenAI's file has none

    folder, hf_model = _rewritten(tiny_checkpoints, tmp_path, "gpt2", openai_names)
    compare_generation(hf_model, runner(_load(folder), "SDPA"), "gpt2 openai names", steps=2)


def test_opt_as_facebook_published_it_loads(tiny_checkpoints, tmp_path):
    """facebook/opt-* files name tensors `decoder.*`, without transformers' `model.` prefix."""

    def fairseq_names(state):
        for key in [k for k in state if k.startswith("model.")]:
            state[key.removeprefix("model.")] = state.pop(key)

    folder, hf_model = _rewritten(tiny_checkpoints, tmp_path, "opt-350m", fairseq_names)
    compare_generation(hf_model, runner(_load(folder), "SDPA"), "opt-350m facebook names", steps=2)


def test_a_tied_neox_checkpoint_storing_embed_out_loads(tiny_checkpoints, tmp_path):
    """Tied NeoX: an `embed_out.weight` saved beside the embeddings duplicates them and is skipped."""

    def store_head(state):
        state["embed_out.weight"] = state["gpt_neox.embed_in.weight"].clone()

    folder, hf_model = _rewritten(tiny_checkpoints, tmp_path, "neox-parallel", store_head)
    model = _load(folder)
    assert model.embed_out.weight is model.gpt_neox.embed_in.weight
    compare_generation(hf_model, runner(model, "SDPA"), "neox tied embed_out", steps=2)


@pytest.mark.parametrize(
    ("name", "tensor"),
    [
        ("gpt2", "transformer.h.1.attn.c_attn.weight"),
        ("opt-350m", "model.decoder.project_in.weight"),
        ("neox-parallel", "gpt_neox.layers.2.attention.query_key_value.bias"),
        ("falcon-40b", "transformer.h.0.ln_mlp.weight"),
    ],
)
def test_a_missing_tensor_is_named(tiny_checkpoints, tmp_path, name, tensor):
    """Drop one tensor: the error lists it under missing, by its checkpoint name."""
    folder, _ = _rewritten(tiny_checkpoints, tmp_path, name, lambda state: state.pop(tensor))
    with pytest.raises(CheckpointError, match=r"missing tensors \(1\): " + tensor.replace(".", r"\.")):
        _load(folder)


def test_opt_q_proj_missing_is_named_by_its_checkpoint_name(tiny_checkpoints, tmp_path):
    """q/k/v are fused here; a missing q_proj is still named as the checkpoint names it."""
    tensor = "model.decoder.layers.1.self_attn.q_proj.weight"
    folder, _ = _rewritten(tiny_checkpoints, tmp_path, "opt-125m", lambda state: state.pop(tensor))
    with pytest.raises(CheckpointError, match=tensor.replace(".", r"\.")):
        _load(folder)


def test_an_unexpected_tensor_is_named(tiny_checkpoints, tmp_path):
    """A tensor with no place in a Falcon-7B-style model (a new-architecture norm) is listed as unexpected."""
    extra = "transformer.h.0.ln_attn.weight"

    def add(state):
        state[extra] = torch.ones(64)

    folder, _ = _rewritten(tiny_checkpoints, tmp_path, "falcon-7b", add)
    with pytest.raises(CheckpointError, match=r"unexpected tensors \(1\): " + extra.replace(".", r"\.")):
        _load(folder)


def test_a_conv1d_weight_stored_untransposed_is_a_shape_error(tiny_checkpoints, tmp_path):
    """GPT-2's c_fc holds [in, out]; one saved as [out, in] names the tensor and both shapes."""

    def transpose(state):
        key = "transformer.h.0.mlp.c_fc.weight"
        state[key] = state[key].t().contiguous()

    folder, _ = _rewritten(tiny_checkpoints, tmp_path, "gpt2", transpose)
    with pytest.raises(CheckpointError, match=r"transformer\.h\.0\.mlp\.c_fc\.weight.*\[256, 64\].*\[64, 256\]"):
        _load(folder)


def _build(config: transformers.PretrainedConfig):
    return AutoModelForCausalLM.from_config(ModelConfig.from_hf_config(config))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (TINY_GPT["falcon-7b"].build().to_dict() | {"alibi": True}, "alibi=true"),
        (
            TINY_GPT["falcon-40b"].build().to_dict() | {"parallel_attn": False},
            "new_decoder_architecture=true with parallel_attn=false",
        ),
        (TINY_GPT["falcon-sequential"].build().to_dict() | {"num_kv_heads": 2}, "multi_query=false"),
        (TINY_GPT["opt-125m"].build().to_dict() | {"layer_norm_elementwise_affine": False}, "elementwise_affine"),
        (TINY_GPT["gpt2"].build().to_dict() | {"add_cross_attention": True}, "add_cross_attention=true"),
    ],
)
def test_variants_not_built_are_refused_by_name(config, message):
    """No silent approximation: the config error names the field and what to change."""
    hf_config = transformers.AutoConfig.for_model(**config)
    hf_config.architectures = [
        {"falcon": "FalconForCausalLM", "opt": "OPTForCausalLM", "gpt2": "GPT2LMHeadModel"}[hf_config.model_type]
    ]
    with pytest.raises(ConfigError, match=message):
        _build(hf_config)
