"""Write a transformers model as a GGUF file the way llama.cpp's converter lays it out (tests only).

Names, the Llama Q/K row permutation and the metadata keys follow convert_hf_to_gguf.py, so that
transformers' own GGUF reader (the reference) and kernelbay's read the same bytes.
"""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType as Q

BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


GEMMA2_BLOCK = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def gguf_name(hf: str, arch: str = "llama") -> str:
    stem, _, kind = hf.rpartition(".")
    if stem.startswith("model.layers."):
        index, _, part = stem[len("model.layers.") :].partition(".")
        names = {**BLOCK, **GEMMA2_BLOCK} if arch == "gemma2" else BLOCK
        return f"blk.{index}.{names[part]}.{kind}"
    return f"{GLOBAL[stem]}.{kind}"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF's half-split rotary rows -> interleaved pairs, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_metadata(writer: gguf.GGUFWriter, config, arch: str, skip: tuple[str, ...] = ()) -> None:
    keys = {
        "block_count": (writer.add_block_count, config.num_hidden_layers),
        "context_length": (writer.add_context_length, config.max_position_embeddings),
        "embedding_length": (writer.add_embedding_length, config.hidden_size),
        "feed_forward_length": (writer.add_feed_forward_length, config.intermediate_size),
        "head_count": (writer.add_head_count, config.num_attention_heads),
        "head_count_kv": (writer.add_head_count_kv, config.num_key_value_heads),
        "rms_eps": (writer.add_layer_norm_rms_eps, config.rms_norm_eps),
        "rope_freq_base": (writer.add_rope_freq_base, config.rope_parameters["rope_theta"]),
        "vocab_size": (writer.add_vocab_size, config.vocab_size),
        "bos": (writer.add_bos_token_id, config.bos_token_id),
        "eos": (writer.add_eos_token_id, config.eos_token_id),
    }
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim != config.hidden_size // config.num_attention_heads or arch == "gemma2":
        keys["key_length"] = (writer.add_key_length, head_dim)
        keys["value_length"] = (writer.add_value_length, head_dim)
    if arch == "gemma2":  # what convert_hf_to_gguf's Gemma2Model writes besides
        keys["sliding_window"] = (writer.add_sliding_window, config.sliding_window)
        for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
            keys[cap] = (functools.partial(writer.add_float32, f"{arch}.{cap}"), getattr(config, cap))
    for name, (add, value) in keys.items():
        if name not in skip:
            add(value)


def write_gguf(
    path: Path,
    hf_model,
    arch: str,
    *,
    qtype: Q = Q.F32,
    skip_keys: tuple[str, ...] = (),
    architecture: str | None = None,
) -> Path:
    """`hf_model` as `path`: 2-D weights stored as `qtype` (F32/F16/Q8_0/...), norms and biases as F32."""
    config = hf_model.config
    writer = gguf.GGUFWriter(path, architecture or arch)
    add_metadata(writer, config, architecture or arch, skip_keys)
    for hf, tensor in hf_model.state_dict().items():
        if hf == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.detach().to(torch.float32).numpy()
        name = gguf_name(hf, arch)
        if arch == "gemma2" and name.endswith("norm.weight"):
            data = data + 1  # Gemma's converter stores the (1 + w) its RMSNorm multiplies by
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            data = permute(data, heads)
        kind = qtype if data.ndim == 2 else Q.F32
        stored = data.astype(np.float16) if kind == Q.F16 else data
        if kind not in (Q.F32, Q.F16):
            stored = gguf.quants.quantize(data, kind)
        writer.add_tensor(name, stored, raw_dtype=kind if kind not in (Q.F32, Q.F16) else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformers_from_gguf(path: Path):
    """The reference: transformers' own GGUF reader and dequantizer on the same file."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()
