"""Write a transformers model as a GGUF file the way llama.cpp's converter lays it out (tests only).

Tensor names come from gguf's own HF -> GGUF table (`get_tensor_name_map`, what convert_hf_to_gguf.py
uses); transformers' stacked experts are split into the converter's `ffn_{gate,up,down}_exps`, the Llama
Q/K rows permuted, Gemma's norms stored as 1 + w and the metadata keys written as the converter does,
so that transformers' own GGUF reader (the reference) and kernelbay's read the same bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType as Q

from plugins.gguf.tests._kquants import quantize_q4_k, quantize_q6_k

QUANTIZERS = {Q.Q4_K: quantize_q4_k, Q.Q6_K: quantize_q6_k}  # K-quants gguf-py cannot make
GEMMA = ("gemma2", "gemma3")
MOE = ("qwen2moe", "qwen3moe")


def gguf_name(hf: str, arch: str = "llama", blocks: int = 64) -> str:
    """The converter's name for an HF tensor (`blocks`: at least the model's layer count)."""
    stem, _, kind = hf.rpartition(".")
    enum = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}[arch]
    name = gguf.get_tensor_name_map(enum, blocks).get_name(stem)
    if name is None:
        raise KeyError(f"gguf has no {arch} name for {hf}")
    return f"{name}.{kind}"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF's half-split rotary rows -> interleaved pairs, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope(config) -> dict:
    """The rope parameters of the full-attention layers (Gemma 3 keeps a second set for its sliding ones)."""
    rope = config.rope_parameters
    return rope["full_attention"] if "full_attention" in rope else rope


def add_metadata(writer: gguf.GGUFWriter, config, arch: str, skip: tuple[str, ...] = ()) -> None:
    keys = {
        "block_count": (writer.add_block_count, config.num_hidden_layers),
        "context_length": (writer.add_context_length, config.max_position_embeddings),
        "embedding_length": (writer.add_embedding_length, config.hidden_size),
        "feed_forward_length": (writer.add_feed_forward_length, config.intermediate_size),
        "head_count": (writer.add_head_count, config.num_attention_heads),
        "head_count_kv": (writer.add_head_count_kv, config.num_key_value_heads),
        "rms_eps": (writer.add_layer_norm_rms_eps, config.rms_norm_eps),
        "rope_freq_base": (writer.add_rope_freq_base, _rope(config)["rope_theta"]),
        "vocab_size": (writer.add_vocab_size, config.vocab_size),
        "bos": (writer.add_bos_token_id, config.bos_token_id),
        "eos": (writer.add_eos_token_id, config.eos_token_id),
    }
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim != config.hidden_size // config.num_attention_heads or arch in GEMMA:
        keys["key_length"] = (writer.add_key_length, head_dim)
        keys["value_length"] = (writer.add_value_length, head_dim)
    if arch in GEMMA:
        keys["sliding_window"] = (writer.add_sliding_window, config.sliding_window)
    if arch == "gemma2":  # what convert_hf_to_gguf's Gemma2Model writes besides
        for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
            keys[cap] = (functools.partial(writer.add_float32, f"{arch}.{cap}"), getattr(config, cap))
    if _rope(config).get("rope_type") == "linear":  # what the converter writes for linear rope scaling
        keys["rope_scaling"] = (writer.add_rope_scaling_type, gguf.RopeScalingType.LINEAR)
        keys["rope_factor"] = (writer.add_rope_scaling_factor, _rope(config)["factor"])
    if arch == "phi3":
        keys["rope_dimension_count"] = (writer.add_rope_dimension_count, head_dim)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if experts:
        keys["expert_count"] = (writer.add_expert_count, experts)
        keys["expert_used_count"] = (writer.add_expert_used_count, config.num_experts_per_tok)
    if arch in MOE:
        keys["expert_width"] = (writer.add_expert_feed_forward_length, config.moe_intermediate_size)
    if arch == "qwen2moe":
        keys["shared_width"] = (writer.add_expert_shared_feed_forward_length, config.shared_expert_intermediate_size)
    for name, (add, value) in keys.items():
        if name not in skip:
            add(value)


def converted(hf: str, data: np.ndarray, arch: str, config, per_expert: bool = False) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, array) for one HF tensor, changed as the converter changes it (`per_expert`: experts as
    one tensor each, `blk.N.ffn_gate.E.weight`, as llama.cpp wrote Mixtral before it stacked them)."""
    if hf.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
        prefix = f"blk.{hf.split('.')[2]}"  # model.layers.N.mlp.experts...
        if hf.endswith("gate_up_proj"):  # [E, 2I, H], gate rows first
            parts = dict(zip(("gate", "up"), np.split(data, 2, axis=1), strict=True))
        else:
            parts = {"down": data}
        if per_expert:
            return [(f"{prefix}.ffn_{p}.{e}.weight", w[e]) for p, w in parts.items() for e in range(len(w))]
        return [(f"{prefix}.ffn_{p}_exps.weight", w) for p, w in parts.items()]
    name = gguf_name(hf, arch)
    if arch in GEMMA and name.endswith("norm.weight"):
        data = data + 1  # Gemma's converter stores the (1 + w) its RMSNorm multiplies by
    if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
        data = permute(data, config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads)
    if name.endswith("ffn_gate_inp_shexp.weight"):
        data = data[0]  # llama.cpp holds the shared expert's gate as a vector
    return [(name, data)]


def write_gguf(
    path: Path,
    hf_model,
    arch: str,
    *,
    qtype: Q = Q.F32,
    skip_keys: tuple[str, ...] = (),
    architecture: str | None = None,
    qtype_of: Callable[[str], Q] | None = None,
    per_expert_tensors: bool = False,
) -> Path:
    """`hf_model` as `path`: 2-D and expert weights stored as `qtype` (F32/F16/Q8_0/.../Q4_K/Q6_K), or as
    `qtype_of(gguf name)` says; norms, biases and the MoE router F32."""
    config = hf_model.config
    writer = gguf.GGUFWriter(path, architecture or arch)
    add_metadata(writer, config, architecture or arch, skip_keys)
    for hf, tensor in hf_model.state_dict().items():
        if hf == "lm_head.weight" and config.tie_word_embeddings:
            continue
        values = tensor.detach().to(torch.float32).numpy()
        for name, data in converted(hf, values, arch, config, per_expert_tensors):
            kind = (qtype_of or (lambda _: qtype))(name)
            kind = kind if data.ndim >= 2 and not name.endswith("ffn_gate_inp.weight") else Q.F32
            stored = data.astype(np.float16) if kind == Q.F16 else data
            if kind not in (Q.F32, Q.F16):
                stored = QUANTIZERS[kind](data) if kind in QUANTIZERS else gguf.quants.quantize(data, kind)
            writer.add_tensor(name, stored, raw_dtype=kind if kind not in (Q.F32, Q.F16) else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# K-quant blocks: (bytes per 256 weights, byte offsets of their float16 super-block scales)
K_QUANTS = {Q.Q4_K: (144, (0, 2)), Q.Q5_K: (176, (0, 2)), Q.Q6_K: (210, (208,))}


def random_k_quant(rows: int, cols: int, qtype: Q, rng: np.random.Generator, scale: float = 0.0005) -> np.ndarray:
    """Random blocks with small finite scales (gguf cannot quantize K-quants): any such bytes are a weight."""
    size, scales = K_QUANTS[qtype]
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    for at in scales:
        blocks[..., at : at + 2] = np.full((rows, cols // 256, 1), scale, np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def write_random_k_quants(path: Path, qtype_of, seed: int = 0, scale: float = 0.0005) -> Path:
    """A Llama with 256-wide rows (K-quant blocks span 256 weights) whose 2-D weights are random blocks of
    `qtype_of(gguf name)` (super-block scales `scale`); norms F32."""
    from tests.models._tiny import COMMON, Tiny
    from tests.models.conftest import build_reference

    config = transformers.LlamaConfig(**{**COMMON, "hidden_size": 256, "intermediate_size": 256})
    source = build_reference("llama", tiny=Tiny("llama 256 wide", lambda: config))
    writer = gguf.GGUFWriter(path, "llama")
    add_metadata(writer, config, "llama")
    rng = np.random.default_rng(seed)
    for hf, tensor in source.state_dict().items():
        name = gguf_name(hf)
        if tensor.dim() == 2:
            qtype = qtype_of(name)
            writer.add_tensor(name, random_k_quant(*tensor.shape, qtype, rng, scale), raw_dtype=qtype)
        else:
            writer.add_tensor(name, tensor.numpy())
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


SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def add_byte_level_tokenizer(
    writer: gguf.GGUFWriter,
    *,
    pre: str = "gpt-2",
    add_bos: bool = False,
    extra_tokens: tuple[tuple[str, gguf.TokenType], ...] = (),
    chat_template: str | None = None,
) -> None:
    """A small GPT-2 style vocabulary as llama.cpp's converter writes one (`tokenizer.ggml.model` "gpt2"): the
    256 byte symbols, a few merges, three control tokens, `extra_tokens` after them and a chat template (ChatML
    unless `chat_template` is given)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # the package's attribute is a function

    symbols = list(bytes_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ w"]
    tokens = [*symbols, *(m.replace(" ", "") for m in merges), *SPECIAL_TOKENS, *(t for t, _ in extra_tokens)]
    types = [gguf.TokenType.NORMAL] * (len(symbols) + len(merges)) + [gguf.TokenType.CONTROL] * 3
    types += [kind for _, kind in extra_tokens]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE if chat_template is None else chat_template)
