"""EAGLE-3 draft folders written in SpecForge's format (config.json + model.safetensors), from tensors given here:
random ones, and one derived from a target so that its guesses are the target's own next tokens."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def draft_config(target: dict, **overrides) -> dict:
    """A one-layer draft's config.json for the target whose config.json is `target` (its vocabulary and width)."""
    hidden = target["hidden_size"]
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": target["max_position_embeddings"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "vocab_size": target["vocab_size"],
        "draft_vocab_size": target["vocab_size"] // 2,
        "torch_dtype": "float32",
    }
    config.update(overrides)
    return config


def random_tensors(config: dict, *, seed: int = 0, scale: float = 0.3, embedding: bool = False) -> dict:
    """Random weights of every tensor the format has (t2d / d2t: the draft vocabulary is every other target token)."""
    generator = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    target_hidden = config.get("target_hidden_size") or hidden
    vocab, draft_vocab = config["vocab_size"], config["draft_vocab_size"]

    def rand(*shape):
        return torch.randn(*shape, generator=generator) * scale

    tensors = {
        "fc.weight": rand(hidden, 3 * target_hidden),
        "midlayer.input_layernorm.weight": 1 + rand(hidden) * 0.1,
        "midlayer.hidden_norm.weight": 1 + rand(hidden) * 0.1,
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "midlayer.post_attention_layernorm.weight": 1 + rand(hidden) * 0.1,
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden),
        "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inter),
        "norm.weight": 1 + rand(hidden) * 0.1,
        "lm_head.weight": rand(draft_vocab, hidden),
    }
    tensors.update(vocabulary_maps(torch.arange(draft_vocab) * (vocab // draft_vocab), vocab))
    if embedding:
        tensors["embed_tokens.weight"] = rand(vocab, hidden)
    return tensors


def vocabulary_maps(target_ids: torch.Tensor, vocab: int) -> dict:
    """d2t (target id - draft id, per draft id) and t2d (which target ids the draft vocabulary holds)."""
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[target_ids] = True
    return {"d2t": (target_ids - torch.arange(len(target_ids))).to(torch.int64), "t2d": t2d}


def write_draft(folder: Path, config: dict, tensors: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def target_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())
