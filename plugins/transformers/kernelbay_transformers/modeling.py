"""`TransformersForCausalLM`: any causal LM transformers implements, as a kernelbay `CausalLM`.

Registered for "*" (any architecture) by a distribution the registry ranks "fallback": it serves an
architecture only when no installed plugin claims it (or when `model_impl="transformers"` asks for it).
The transformers model is built with its parameters on the meta device (buffers such as RoPE tables
are computed for real), its weights come through kernelbay's loader under transformers' own names, and
each of its attention modules gets a kernelbay `Attention` that the runner binds to the backend the
selector chose for that layer; `attention.paged_attention` routes transformers' attention calls to it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn

from kernelbay import register_model
from kernelbay.attention import LayerKind
from kernelbay.errors import UnsupportedArchitecture
from kernelbay_engine.attention import Attention
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.models.base import CausalLM

from . import attention as paged
from . import support

SUPPORTED_KINDS = (LayerKind.FULL, LayerKind.SLIDING, LayerKind.CHUNKED)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Parameters registered inside go to the meta device (their storage comes from the checkpoint);
    buffers stay real: transformers computes RoPE tables and the like in `__init__`."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=False)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_transformers_model(config, cls: type, dtype: torch.dtype) -> nn.Module:
    """`cls` built from the checkpoint's transformers config, attention routed to "kernelbay", weights on meta."""
    from kernelbay_engine.config import typed_hf_config

    paged.register()
    hf_config = copy.deepcopy(typed_hf_config(config.hf_config))  # transformers records the attention choice on it
    with parameters_on_meta():
        model = cls._from_config(hf_config, attn_implementation=paged.IMPLEMENTATION, dtype=dtype)
    return model.eval()


def adopt_linears(model: nn.Module, head: str = "lm_head") -> int:
    """Replace every plain `nn.Linear` by kernelbay's `Linear` of the same shape and parameter names, so the
    engine's weight formats, prepacking and quantization apply as in a native family (the head stays plain)."""
    plain = [(path, m) for path, m in model.named_modules() if type(m) is nn.Linear]
    for path, old in plain:
        parent, _, name = path.rpartition(".")
        new = Linear(old.in_features, old.out_features, bias=old.bias is not None, quantizable=path != head)
        setattr(model.get_submodule(parent) if parent else model, name, new)
    return len(plain)


def _layer_for(module: nn.Module, path: str, config) -> Attention:
    """The kernelbay Attention for one transformers attention module: geometry from the config and the module."""
    idx = getattr(module, "layer_idx", None)
    if not isinstance(idx, int) or not 0 <= idx < config.num_hidden_layers:
        raise UnsupportedArchitecture(
            f"{path}: the attention module has no layer_idx in 0..{config.num_hidden_layers - 1}"
        )
    if not getattr(module, "is_causal", True):
        raise UnsupportedArchitecture(f"{path}: non-causal attention; the fallback serves causal LMs only")
    if "sinks" in module._parameters:  # gpt-oss: a learned per-head sink joins the softmax
        raise UnsupportedArchitecture(f"{path}: attention sinks, which kernelbay's attention layers do not implement")
    head_dim = int(getattr(module, "head_dim", config.head_dim))
    scale = float(getattr(module, "scaling", config.head_dim**-0.5))
    return Attention(config.layer_geometry(idx, head_dim=head_dim, scale=scale), prefix=path)


def attach_attention_layers(model: nn.Module, config, attention_cls: type) -> int:
    """Give every transformers attention module its kernelbay Attention; returns how many there are."""
    count = 0
    for path, module in model.named_modules():
        if isinstance(module, attention_cls):
            setattr(module, paged.LAYER_ATTRIBUTE, _layer_for(module, path, config))
            setattr(module, paged.CONTEXT_ATTRIBUTE, config.max_position_embeddings)
            count += 1
    return count


@register_model("*")
class TransformersForCausalLM(CausalLM):
    """transformers' modeling code for `config.architecture`, on kernelbay's paged attention and loader."""

    builds_on_meta = True  # parameters are on meta after __init__ (AutoModelForCausalLM skips MetaInitMode)

    @classmethod
    def refusal(cls, hf_config) -> str | None:
        """Why this provider cannot serve a checkpoint, from its transformers config alone (asked before its
        ModelConfig is even resolved, so an encoder-decoder's config is refused for what it is); None: it can."""
        return support.refusal(hf_config)

    def __init__(self, config):
        super().__init__(config)
        unsupported = sorted(set(config.layer_types) - set(SUPPORTED_KINDS))
        reason = self.refusal(config.hf_config) or (
            f"layers of kind {', '.join(unsupported)} have no transformers attention to route" if unsupported else None
        )
        if reason:
            raise UnsupportedArchitecture(f"the transformers fallback cannot serve {config.architecture}: {reason}")
        hf_cls = support.model_class(config.hf_config)
        if hf_cls.base_model_prefix != "model":
            raise UnsupportedArchitecture(
                f"the transformers fallback cannot serve {config.architecture}: its base model is "
                f"'{hf_cls.base_model_prefix}', and kernelbay's runner reads the embeddings at model.embed_tokens"
            )
        hf = build_transformers_model(config, hf_cls, torch.get_default_dtype())
        adopt_linears(hf)  # their weights are created by AutoModelForCausalLM with the other kernelbay layers
        for name, child in hf.named_children():  # transformers' names are the checkpoint's names
            self.add_module(name, child)
        self._base = (hf.base_model,)  # a tuple: the base model is already a child, under its own name
        if attach_attention_layers(hf, config, support.attention_class(hf_cls)) == 0:
            raise UnsupportedArchitecture(f"{config.architecture}: no attention module of the transformers model found")
        self.final_logit_softcap = config.final_logit_softcapping
        self.logit_multiplier, self.logit_divisor = _logit_scaling(config.hf_config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata) -> torch.Tensor:
        """input_ids / positions [T] (packed requests) -> hidden states [T, hidden_size]."""
        out = self._base[0](
            input_ids=input_ids[None],
            position_ids=positions[None],
            use_cache=False,
            **{paged.METADATA_KWARG: metadata},
        )
        return out.last_hidden_state[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head, then the scaling transformers' head applies (Cohere multiplies, Granite divides),
        then the final soft-cap, in transformers' order."""
        logits = self.lm_head(hidden)
        if self.logit_multiplier is not None:
            logits = logits * self.logit_multiplier
        if self.logit_divisor is not None:
            logits = logits / self.logit_divisor
        cap = self.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


def _logit_scaling(hf_config) -> tuple[float | None, float | None]:
    """(multiplier, divisor) of the logits: `logit_scale` (Cohere) and `logits_scaling` (Granite), if set."""
    multiplier = getattr(hf_config, "logit_scale", None)
    divisor = getattr(hf_config, "logits_scaling", None)
    return (
        None if multiplier in (None, 1, 1.0) else float(multiplier),
        None if divisor in (None, 1, 1.0) else float(divisor),
    )
