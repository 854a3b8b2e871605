"""GPT-OSS (gpt-oss-20b / -120b): Llama's decoder with attention sinks, and the engine's shared MoE layer.

What differs from Llama: biases on q/k/v/o and a learned sink logit per head (`self_attn.sinks`) in every attention
layer; sliding and full layers alternating (`layer_types`); YaRN RoPE (all three from the config and `Features`);
every FFN an MoE whose router has a bias (`mlp.router`) and whose experts have biases and the clamped SwiGLU
`swigluoai` (config rules: kernelbay_llama.config_rules).

Expert tensors, by transformers' names: `mlp.experts.gate_up_proj` [E, H, 2I] with gate and up INTERLEAVED on the
last dim (gate = [..., ::2]), `gate_up_proj_bias` [E, 2I] interleaved the same way, `down_proj` [E, I, H],
`down_proj_bias` [E, H]. MXFP4 checkpoints (quant_method mxfp4) store `gate_up_proj_blocks` [E, 2I, H/32, 16] and
`gate_up_proj_scales` [E, 2I, H/32] (rows interleaved) and `down_proj_blocks` [E, H, I/32, 16] / `down_proj_scales`
[E, H, I/32], already in `kernelbay.moe.ExpertWeights`' mxfp4 layout. `GptOssExperts` loads them as stored and
rearranges them once into ExpertWeights' layout (gate rows first) when the MoE kernel is bound, right after load;
MXFP4 stays packed for a kernel that declares the format, else `bind_moe_backends` dequantizes it
(kernelbay.moe.dequantize_mxfp4).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from kernelbay import register_model
from kernelbay.errors import ConfigError
from kernelbay.moe import ExpertWeights, MoEGeometry
from kernelbay_engine.layers.moe import Routing, SparseMoE
from kernelbay_engine.loading import NameRules
from kernelbay_engine.selection import stored_expert_format

from .family import LlamaFamilyForCausalLM, _hf
from .layers import Features

MXFP4_BLOCK = 32  # values per e8m0 scale (16 bytes of e2m1 pairs)


def _param(*shape: int, dtype: torch.dtype | None = None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


def _deinterleaved(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Gate entries (even indices of `dim`) first, then up entries (odd): ExpertWeights' order."""
    before = (slice(None),) * dim
    return torch.cat([x[(*before, slice(0, None, 2))], x[(*before, slice(1, None, 2))]], dim=dim)


class GptOssExperts(nn.Module):
    """The experts' tensors as the checkpoint stores them (dense or MXFP4-packed), plus their biases."""

    def __init__(self, geometry: MoEGeometry, *, mxfp4: bool):
        super().__init__()
        e, h, i = geometry.num_experts, geometry.hidden_size, geometry.intermediate_size
        self.mxfp4 = mxfp4
        if mxfp4:
            if h % MXFP4_BLOCK or i % MXFP4_BLOCK:
                raise ConfigError(
                    f"MXFP4 experts need hidden_size ({h}) and intermediate_size ({i}) to be multiples of "
                    f"{MXFP4_BLOCK} (one e8m0 scale per {MXFP4_BLOCK} values)"
                )
            self.gate_up_proj_blocks = _param(e, 2 * i, h // MXFP4_BLOCK, 16, dtype=torch.uint8)
            self.gate_up_proj_scales = _param(e, 2 * i, h // MXFP4_BLOCK, dtype=torch.uint8)
            self.down_proj_blocks = _param(e, h, i // MXFP4_BLOCK, 16, dtype=torch.uint8)
            self.down_proj_scales = _param(e, h, i // MXFP4_BLOCK, dtype=torch.uint8)
        else:
            self.gate_up_proj = _param(e, h, 2 * i)
            self.down_proj = _param(e, i, h)
        self.gate_up_proj_bias = _param(e, 2 * i)
        self.down_proj_bias = _param(e, h)
        self.rearranged = False
        self.released_by: str | None = None

    def for_experts(self, geometry: MoEGeometry) -> GptOssExperts:
        """The same storage (format and dtypes) for `geometry.num_experts` experts, on meta: one rank's share under
        expert parallelism (kernelbay_engine.distributed), each expert's tensors whole (no MXFP4 block is cut)."""
        with torch.device("meta"):
            local = GptOssExperts(geometry, mxfp4=self.mxfp4)
            for name, param in list(local.named_parameters()):
                setattr(local, name, _param(*param.shape, dtype=getattr(self, name).dtype))
        return local

    def _weight_names(self) -> tuple[str, ...]:
        if self.mxfp4:
            return ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales")
        return ("gate_up_proj", "down_proj")

    def release(self, backend: str) -> None:
        """Drop the loaded weights (not the biases) once a kernel holds its own copy (dequantized, repacked)."""
        for name in self._weight_names():
            delattr(self, name)
        self.released_by = backend

    def stored_format(self) -> tuple[str, None]:
        return ("mxfp4", None) if self.mxfp4 else ("dense", None)

    def expert_weights(self) -> ExpertWeights:
        """The weights in ExpertWeights' layout; the first call rearranges the loaded tensors in place (held once)."""
        if self.released_by is not None:
            raise ConfigError(
                f"the expert weights were taken over by the MoE backend {self.released_by} and their loaded copy "
                "released (weights are held once); load the model again with moe_backend=NAME to use another kernel"
            )
        if not self.rearranged:
            with torch.no_grad():
                self._rearrange()
            self.rearranged = True
        if self.mxfp4:
            return ExpertWeights(
                self.gate_up_proj_blocks,
                self.down_proj_blocks,
                self.gate_up_proj_bias,
                self.down_proj_bias,
                self.gate_up_proj_scales,
                self.down_proj_scales,
            )
        return ExpertWeights(self.gate_up_proj, self.down_proj, self.gate_up_proj_bias, self.down_proj_bias)

    def _rearrange(self) -> None:
        """Checkpoint layout -> ExpertWeights: gate rows before up rows; dense weights [out, in] per expert."""
        self._replace("gate_up_proj_bias", _deinterleaved(self.gate_up_proj_bias, 1))
        if self.mxfp4:  # packed rows are whole output rows: only their order changes
            self._replace("gate_up_proj_blocks", _deinterleaved(self.gate_up_proj_blocks, 1))
            self._replace("gate_up_proj_scales", _deinterleaved(self.gate_up_proj_scales, 1))
            return
        self._replace("gate_up_proj", _deinterleaved(self.gate_up_proj, 2).transpose(1, 2))  # [E, 2I, H]
        self._replace("down_proj", self.down_proj.transpose(1, 2))  # [E, H, I]

    def _replace(self, name: str, value: torch.Tensor) -> None:
        setattr(self, name, nn.Parameter(value.contiguous(), requires_grad=False))


class GptOssMoE(SparseMoE):
    """The shared MoE layer (router with a bias, the bound kernel) over GPT-OSS's expert storage."""

    def __init__(self, geometry: MoEGeometry, routing: Routing, *, mxfp4: bool):
        super().__init__(geometry, routing, router_bias=True)
        self.experts = GptOssExperts(geometry, mxfp4=mxfp4)

    @classmethod
    def from_config(cls, config, layer_idx: int, **_) -> GptOssMoE:
        moe = config.moe
        if moe is None or not moe.layers[layer_idx] or not moe.router_bias:
            raise ConfigError(
                f"{config.architecture}: every layer is an MoE layer with a router bias, but config.moe says "
                f"{moe}; is kernelbay-llama's gpt_oss config rule installed?"
            )
        fmt, _ = stored_expert_format(config)
        return cls(moe.geometry(config.hidden_size), Routing.from_moe_config(moe), mxfp4=fmt == "mxfp4")


@register_model("GptOssForCausalLM")
class GptOssForCausalLM(LlamaFamilyForCausalLM):
    """gpt-oss-20b / gpt-oss-120b (bf16 or MXFP4 experts)."""

    name_rules = NameRules(
        renames=((r"\.mlp\.router\.", ".mlp.gate."),), ignore=LlamaFamilyForCausalLM.name_rules.ignore
    )

    @classmethod
    def features(cls, config) -> Features:
        bias = bool(_hf(config, "attention_bias", True))
        return Features(qkv_bias=bias, o_bias=bias, sinks=config.attention_sinks)

    @classmethod
    def ffn_factory(cls, config):
        if config.moe is None:
            raise ConfigError(
                f"{config.architecture} needs its experts in config.json (num_local_experts and num_experts_per_tok)"
            )
        return partial(GptOssMoE.from_config, config)
