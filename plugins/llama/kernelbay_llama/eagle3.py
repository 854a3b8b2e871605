"""The EAGLE-3 draft head (SpecForge's checkpoint format, which vLLM and SGLang read), registered in the
`draft_model` slot `EAGLE3LlamaForCausalLM`: one Llama decoder layer over [token embedding, fused target hidden
states], its own final norm and an LM head over a draft vocabulary mapped to the target's by `d2t`.

The engine's proposer (`kernelbay_engine.speculative.eagle`) drives it row by row and keeps each request's keys
and values itself: `fuse` the target's aux hidden states, `attention_inputs` -> its attention over the request's
cache -> `layer_output`, then `draft_logits` and `to_target`. The hidden input of a row is `fuse(aux)` for a
position the target computed, or the previous row's `layer_output` for the draft's own guesses.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from kernelbay import register_draft_model
from kernelbay_engine.layers import GatedMLP, Linear, MergedLinear, RMSNorm, RotaryEmbedding
from kernelbay_engine.loading import NameRules
from kernelbay_engine.models.base import VocabEmbedding, rope_params
from kernelbay_engine.speculative.eagle import aux_layer_ids, target_hidden_size


class Eagle3Attention(nn.Module):
    """The projections only: the proposer attends over each request's own keys and values."""

    def __init__(self, config):
        super().__init__()
        hidden, heads, kv_heads, head_dim = (
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        self.qkv_proj = MergedLinear(
            2 * hidden, {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim}
        )
        self.o_proj = Linear(heads * head_dim, hidden)


class Eagle3Layer(nn.Module):
    """The decoder layer: attention over cat([input_layernorm(embeds), hidden_norm(hidden)]) (2 x hidden wide),
    the hidden input as residual, then the gated MLP; checkpoint prefix `midlayer.`."""

    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.self_attn = Eagle3Attention(config)
        self.mlp = GatedMLP(hidden, config.intermediate_size, getattr(config.hf_config, "hidden_act", "silu"))


@register_draft_model("EAGLE3LlamaForCausalLM")
class EAGLE3LlamaForCausalLM(nn.Module):
    """An EAGLE-3 head for any target whose vocabulary and hidden size it was trained on (the checks are the
    engine's, `kernelbay_engine.speculative.eagle.check_draft`)."""

    # SpecForge saves the layer as `midlayer.*`; vLLM also reads `model.layers.0.*` and `model.`-prefixed names.
    name_rules = NameRules(renames=((r"^model\.layers\.0\.", "midlayer."), (r"^model\.", "")), ignore=("t2d",))

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.shape = (config.num_attention_heads, config.num_key_value_heads, config.head_dim)
        self.attention_scale = float(config.attention_scale)
        self.fc = Linear(3 * target_hidden_size(config), config.hidden_size)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, config.draft_vocab_size, quantizable=False)
        self.d2t = nn.Parameter(torch.empty(config.draft_vocab_size, dtype=torch.int64), requires_grad=False)
        """draft id -> target id offset: target = draft + d2t[draft]."""
        self.embed_tokens: nn.Module | None = VocabEmbedding(config.vocab_size, config.hidden_size)
        self._target_embedding: tuple[nn.Module, ...] = ()  # not a submodule: the target owns its weights
        self.rotary = RotaryEmbedding(rope_params(config))
        # speculators' drafts may take the residual after hidden_norm (vLLM reads the same flag)
        self.norm_before_residual = bool(getattr(config.hf_config, "norm_before_residual", False))

    def checkpoint_rules(self) -> NameRules:
        return self.name_rules

    def use_target_embedding(self, embedding: nn.Module) -> None:
        """The folder holds no `embed_tokens.weight`: look tokens up in the target's table instead."""
        self.embed_tokens = None
        self._target_embedding = (embedding,)

    def aux_layer_ids(self, target_num_layers: int) -> tuple[int, ...]:
        return aux_layer_ids(self.config, target_num_layers)

    # -- the row computation, in the order the proposer calls it ------------------------------------------
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[N] token ids -> [N, hidden] float32 embeddings (the target's table when the draft has none)."""
        table = self.embed_tokens if self.embed_tokens is not None else self._target_embedding[0]
        return cast(torch.Tensor, table(token_ids)).float()

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[N, 3 * target_hidden] (the aux layers' inputs, concatenated) -> [N, hidden]."""
        return self.fc(aux.float())

    def attention_inputs(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [N, heads, D], k and v [N, kv_heads, D] (q and k rotated at `positions` [N])."""
        layer = self.midlayer
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        heads, kv_heads, _ = self.shape
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        return self.rotary.split_rotate(layer.self_attn.qkv_proj(x), heads, kv_heads, cos, sin)

    def layer_output(self, hidden: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """The layer's output (before the final norm: the next draft row's hidden input) from its hidden input and
        the attention's [N, heads * D]."""
        layer = self.midlayer
        residual = layer.hidden_norm(hidden) if self.norm_before_residual else hidden
        x = layer.self_attn.o_proj(attention, residual)
        return layer.mlp(layer.post_attention_layernorm(x), residual=x)

    def draft_logits(self, output: torch.Tensor) -> torch.Tensor:
        """[N, hidden] layer outputs -> [N, draft_vocab_size]."""
        return self.lm_head(self.norm(output))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
