"""Keys config.json leaves out, answered from the stored tensors' headers (the folder's weight format reads them)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from kernelbay.errors import ConfigError
from kernelbay_engine.config import ModelConfig


def add_weights(folder, tensors: dict, shards: int = 1) -> None:
    """Tiny tensors with real names, in one file or sharded with an index."""
    names = sorted(tensors)
    if shards == 1:
        save_file({n: tensors[n] for n in names}, str(folder / "model.safetensors"))
        return
    weight_map = {}
    for i in range(shards):
        part = {n: tensors[n] for n in names[i::shards]}
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(folder / file))
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_v2_lite_without_q_lora_rank_reads_q_proj(shared_copy):
    """DeepSeek-V2-Lite's copy lacks q_lora_rank; its q_proj weights say: no query compression."""
    folder = shared_copy("deepseek-v2-lite-chat")
    add_weights(
        folder,
        {
            "model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4, dtype=torch.bfloat16),
            "model.layers.0.self_attn.kv_a_proj_with_mqa.weight": torch.zeros(4, 4, dtype=torch.bfloat16),
        },
    )
    cfg = ModelConfig.from_pretrained(folder)
    assert cfg.mla.q_lora_rank is None and any("projects queries directly" in n for n in cfg.notes)


def test_missing_q_lora_rank_read_from_q_a_proj_rows(shared_copy):
    """With a sharded index and q_a_proj weights, the rank is the rows of q_a_proj."""
    folder = shared_copy("deepseek-v3", drop=("q_lora_rank",))
    add_weights(
        folder,
        {
            "model.layers.0.self_attn.q_a_proj.weight": torch.zeros(24, 8, dtype=torch.bfloat16),
            "model.embed_tokens.weight": torch.zeros(2, 8, dtype=torch.bfloat16),
        },
        shards=2,
    )
    assert ModelConfig.from_pretrained(folder).mla.q_lora_rank == 24


def test_missing_q_lora_rank_with_unrelated_weights_is_still_an_error(shared_copy):
    """Weights that say nothing about the query projection do not decide it."""
    folder = shared_copy("deepseek-v2-lite-chat")
    add_weights(folder, {"lm_head.weight": torch.zeros(2, 2)})
    with pytest.raises(ConfigError, match="'q_lora_rank' is missing"):
        ModelConfig.from_pretrained(folder)


def test_missing_dtype_read_from_weights(shared_copy):
    """gpt-oss publishes no torch_dtype: the dominant floating dtype of its tensors is used (U8 blocks ignored)."""
    folder = shared_copy("gpt-oss-20b")
    add_weights(
        folder,
        {
            "a": torch.zeros(2, dtype=torch.bfloat16),
            "b": torch.zeros(2, dtype=torch.bfloat16),
            "blocks": torch.zeros(2, dtype=torch.uint8),
            "c": torch.zeros(2, dtype=torch.float32),
        },
    )
    cfg = ModelConfig.from_pretrained(folder)
    assert cfg.dtype == "bfloat16" and cfg.kv_bytes_per_token() == 24 * 2 * 8 * 64 * 2


def test_corrupt_safetensors_header(shared_copy):
    """A safetensors file whose header cannot be read is named, not a crash."""
    folder = shared_copy("gpt-oss-20b")
    (folder / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ConfigError, match=r"model.safetensors is not a valid safetensors file"):
        ModelConfig.from_pretrained(folder)


@pytest.mark.parametrize(
    ("weight_map", "says"),
    [
        (["model.safetensors"], "has no 'weight_map' naming the shard of each tensor"),
        ({"a.weight": 3}, r"weight_map\['a.weight'\] is 3; it must be the file name of a shard"),
        ("model.safetensors", "has no 'weight_map' naming the shard of each tensor"),
    ],
)
def test_malformed_index_weight_map_is_a_clear_error(shared_copy, weight_map, says):
    """An index whose weight_map is not an object of file names is a ConfigError naming the file, not a crash."""
    folder = shared_copy("gpt-oss-20b")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ConfigError, match=f"model.safetensors.index.json.*{says}"):
        ModelConfig.from_pretrained(folder)


def test_weights_are_read_only_for_keys_config_json_leaves_out(shared_copy):
    """A folder whose config.json says its dtype never has its headers read (a corrupt file goes unnoticed)."""
    folder = shared_copy("gpt-oss-20b", torch_dtype="bfloat16")
    (folder / "model.safetensors").write_bytes(b"\xff" * 16)
    assert ModelConfig.from_pretrained(folder).dtype == "bfloat16"
