"""The llama-family decoder, one code path for every member; what differs is a `Features` record.

Member differences handled here (each a field of `Features`):
- Llama / Mistral: the base shape (optional `attention_bias` / `mlp_bias`);
- Qwen2: q/k/v bias without an o_proj bias;
- Qwen3: per-head RMSNorm on q and k before RoPE, head_dim independent of hidden/heads;
- Phi-3: checkpoints store fused `qkv_proj` / `gate_up_proj` (loaded directly: our layers are fused anyway),
  partial rotary and longrope come from the config;
- the attention scale is always `config.attention_scale` (Gemma-2's `query_pre_attn_scalar` included);
- Gemma-2: (1 + w) norms, a norm after attention and around the MLP, embeddings scaled by sqrt(hidden),
  attention and final logit soft-capping,
  alternating sliding-window layers (from `config.layer_types`);
- Gemma 3: Gemma-2's layout plus (1 + w) q/k norms; sliding layers rotate with their own base
  (`config.rope.local_theta`) and without the RoPE scaling of the global layers;
- GPT-OSS: a learned sink logit per head (`self_attn.sinks`) in every attention softmax.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from kernelbay.attention import AttentionForwardArgs, AttentionMetadata, LayerKind
from kernelbay_engine.attention import Attention
from kernelbay_engine.layers import GatedMLP, Linear, MergedLinear, RMSNorm, RotaryEmbedding
from kernelbay_engine.layers.fused import NativeDecoderBlock, native_block
from kernelbay_engine.models.base import VocabEmbedding, rope_params


@dataclass(frozen=True, slots=True)
class Features:
    """How one family member departs from Llama. Derived from the config by each architecture class."""

    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm over head_dim on q and k
    gemma: bool = False  # Gemma-2/3: (1 + w) norms, sandwich norms, scaled embeddings
    sinks: bool = False  # GPT-OSS: per-head attention sink logits
    activation: str = "silu"


class LlamaAttention(nn.Module):
    """Fused q/k/v projection, optional q/k norm, RoPE, paged attention, output projection."""

    def __init__(self, config, features: Features, layer_idx: int, rotary: RotaryEmbedding):
        super().__init__()
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.shape = (heads, kv_heads, head_dim)
        self.qkv_proj = MergedLinear(
            config.hidden_size,
            {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim},
            bias=features.qkv_bias,
        )
        self.o_proj = Linear(heads * head_dim, config.hidden_size, bias=features.o_bias)
        if features.qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps, unit_offset=features.gemma)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps, unit_offset=features.gemma)
        self.qk_norm = features.qk_norm
        # [heads] sink logits, handed to the backend each call (AttentionForwardArgs.sinks)
        self.sinks = nn.Parameter(torch.empty(heads), requires_grad=False) if features.sinks else None
        self.rotary = rotary  # shared with every layer; holds no parameters
        self.attn = Attention(config.layer_geometry(layer_idx), prefix=f"model.layers.{layer_idx}.self_attn.attn")

    @property
    def input_dtype(self) -> torch.dtype | None:
        """The dtype the block computes in from its input on: a bias-free qkv projection on a bf16 kernel takes x
        in bf16 (a norm before it may hand x over in it) and leaves q, k, v to split_rotate; None: x's own."""
        proj = self.qkv_proj
        return proj.compute_dtype if not self.qk_norm and not proj.has_bias else None

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention block's output for x [T, hidden], plus `residual` when given."""
        heads, kv_heads, head_dim = self.shape
        if self.qk_norm:
            qkv = self.qkv_proj(x).view(-1, heads + 2 * kv_heads, head_dim)  # x: [T, hidden]; split by heads
            q, k, v = qkv.split_with_sizes((heads, kv_heads, kv_heads), dim=1)
            q, k = self.rotary.apply(self.q_norm(q), self.k_norm(k), *cos_sin)
        else:  # a bf16 kernel's output is left in bf16 (no bias to add in float32): split_rotate widens it
            qkv = self.qkv_proj.forward_native(x) if self.input_dtype is not None else self.qkv_proj(x)
            q, k, v = self.rotary.split_rotate(qkv, heads, kv_heads, *cos_sin)
        args = AttentionForwardArgs(sinks=self.sinks) if self.sinks is not None else None
        out = self.attn(q, k, v, metadata, args)  # [T, heads, head_dim]
        return self.o_proj(out.reshape(out.shape[0], heads * head_dim), residual)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residuals; Gemma-2 adds a norm after each block.

    `ffn`: the family's FFN for this layer (an MoE layer) instead of the dense `GatedMLP`; None keeps the dense one."""

    def __init__(
        self, config, features: Features, layer_idx: int, rotary: RotaryEmbedding, ffn: nn.Module | None = None
    ):
        super().__init__()
        norm = _norm_factory(config, features)
        self.self_attn = LlamaAttention(config, features, layer_idx, rotary)
        if ffn is None:
            ffn = GatedMLP(config.hidden_size, config.intermediate_size, features.activation, bias=features.mlp_bias)
        self.mlp = ffn
        self.mlp_adds_residual = isinstance(ffn, GatedMLP)  # the down projection adds it (no separate add)
        self.input_layernorm = norm()
        self.post_attention_layernorm = norm()  # Gemma-2: after attention; others: before the MLP
        self.sandwich = features.gemma
        if self.sandwich:
            self.pre_feedforward_layernorm = norm()
            self.post_feedforward_layernorm = norm()
        fusable = not (self.sandwich or features.qk_norm or features.sinks) and self.mlp_adds_residual
        # the native path (layers/fused.py): True until the first step builds it (the kernels are known by then)
        self.native: NativeDecoderBlock | bool | None = True if fusable else None

    def _native_block(self) -> NativeDecoderBlock | None:
        """The layer's native path (layers/fused.py), built once its kernels are known, or None where it cannot run."""
        attn, mlp = self.self_attn, self.mlp
        heads, kv_heads, head_dim = attn.shape
        block = native_block(
            attn.qkv_proj,
            attn.o_proj,
            mlp,  # type: ignore[arg-type]  (fusable: a GatedMLP)
            self.input_layernorm,
            self.post_attention_layernorm,
            attn.rotary,
            heads,
            kv_heads,
            head_dim,
        )
        self.native = block
        return block

    def forward(self, x: torch.Tensor, cos_sin, metadata: AttentionMetadata) -> torch.Tensor:
        block = self._native_block() if self.native is True else self.native
        if block and block.runs(x, cos_sin[0]):  # norm, qkv, RoPE; o_proj, norm, MLP: two native calls
            q, k, v = block.attention_in(x, *cos_sin)
            out = self.self_attn.attn(q, k, v, metadata, None)
            return block.attention_out_mlp(out.reshape(out.shape[0], -1), x)
        if self.sandwich:
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos_sin, metadata))
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        # each norm hands its output over in the dtype its block's first kernel computes in (one cast, fused)
        x = self.self_attn(self.input_layernorm(x, self.self_attn.input_dtype), cos_sin, metadata, residual=x)
        if self.mlp_adds_residual:
            return self.mlp(self.post_attention_layernorm(x, self.mlp.input_dtype), residual=x)
        return x + self.mlp(self.post_attention_layernorm(x))


def _norm_factory(config, features: Features):
    return lambda: RMSNorm(config.hidden_size, config.rms_norm_eps, unit_offset=features.gemma)


class LlamaModel(nn.Module):
    """Embeddings, decoder layers and the final norm (the checkpoint's `model.` prefix).

    `ffn(layer_idx)`: a layer's FFN when it is not the dense MLP (MoE families), else None."""

    def __init__(self, config, features: Features, ffn=None):
        super().__init__()
        scale = config.hidden_size**0.5 if features.gemma else None
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, scale=scale)
        self.rotary_emb = RotaryEmbedding(rope_params(config))
        self.local_rotary_emb = _local_rotary(config)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, features, i, self._rotary_of(config.layer_types[i]), ffn(i) if ffn else None)
            for i in range(config.num_hidden_layers)
        )
        self.norm = _norm_factory(config, features)()

    def _rotary_of(self, kind: str) -> RotaryEmbedding:
        return (
            self.local_rotary_emb
            if kind == LayerKind.SLIDING and self.local_rotary_emb is not None
            else self.rotary_emb
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # [T, hidden]
        cos_sin = self.rotary_emb.cos_sin(positions, x.dtype)  # tables once per step, shared by the layers
        local = self.local_rotary_emb.cos_sin(positions, x.dtype) if self.local_rotary_emb is not None else None
        for layer in self.layers:
            x = layer(x, local if layer.self_attn.rotary is self.local_rotary_emb else cos_sin, metadata)
        return self.norm(x)


def _local_rotary(config) -> RotaryEmbedding | None:
    """Gemma 3's sliding layers: their own base, no scaling (transformers applies rope_scaling to global layers)."""
    if config.rope.local_theta is None:
        return None
    main = rope_params(config)
    return RotaryEmbedding(replace(main, theta=config.rope.local_theta, rope_type="default", scaling={}))
