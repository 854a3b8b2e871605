"""What every kernelbay causal LM provides, and the helpers model families share.

A family subclasses `CausalLM`, builds `self.model` (embeddings, layers, final norm) and
`self.lm_head` in `__init__`, and implements `forward`. Weights are not created in `__init__`:
`Linear` layers get theirs from `quant.create_weights` once the per-layer format is known.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar, cast

import torch
from torch import nn

from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.layers.rotary import RopeParams
from kernelbay_engine.loading import NameRules

if TYPE_CHECKING:
    from kernelbay.attention import AttentionMetadata
    from kernelbay_engine.attention import Attention, AttentionLayerRegistry
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.quant.embedding import QuantizedEmbedding


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'bfloat16' / torch.bfloat16 -> torch.bfloat16; anything else is an error naming the choices."""
    from kernelbay.dtypes import normalize_dtype
    from kernelbay.dtypes import torch_dtype as to_torch

    try:
        return to_torch(normalize_dtype(dtype))
    except ValueError as err:
        raise ValueError(f"model dtype: {err}") from None


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Tensors created without an explicit dtype (norm weights, embeddings) get the model dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def rope_params(
    config: ModelConfig, *, rotary_dim: int | None = None, interleaved: bool = False, theta: float | None = None
) -> RopeParams:
    """The config's resolved RoPE as the rotary layer's parameters."""
    rope = config.rope
    assert rope is not None, "rope_params needs a config whose position_embedding is 'rope'"
    scaling = dict(rope.scaling or {})
    if rope.factor is not None:
        scaling["factor"] = rope.factor
    if rope.original_max_position_embeddings is not None:
        scaling["original_max_position_embeddings"] = rope.original_max_position_embeddings
    return RopeParams(
        theta=float(theta or rope.theta),
        rotary_dim=int(rotary_dim or rope.rotary_dim),
        rope_type=rope.rope_type,
        max_position_embeddings=config.max_position_embeddings,
        scaling=scaling,
        interleaved=interleaved,
    )


class VocabEmbedding(nn.Module):
    """Token embedding table, weight: [vocab_size, hidden_size]; `scale` multiplies the output (Gemma).

    `method`: a table held quantized instead (`kernelbay_engine.quant.set_quantized_embedding`: rows dequantized
    as they are looked up, `weight` deleted); None for the plain table."""

    def __init__(self, vocab_size: int, hidden_size: int, *, scale: float | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.scale = scale
        self.method: QuantizedEmbedding | None = None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.method is not None:
            x = self.method.lookup(input_ids)
        else:
            x = nn.functional.embedding(input_ids, self.weight)
        if self.scale is not None:
            x = x * torch.tensor(self.scale).to(x.dtype)  # rounded like transformers
        return x


def activation_dtype_device(model: nn.Module) -> tuple[torch.dtype, torch.device]:
    """What a model's activations run in: the dtype and device of the rows its token embedding returns (the
    table's, or a quantized table's, which holds no `weight`)."""
    table = cast("CausalLM", model).input_embeddings()  # any model with input_embeddings(), held as an nn.Module
    held = getattr(table, "method", None)
    if held is not None:
        return held.dtype, held.device
    weight = cast(torch.Tensor, table.weight)
    return weight.dtype, weight.device


class CausalLM(nn.Module):
    """Base class of decoder-only LMs. Subclasses set `self.model` (with `embed_tokens`) and `self.lm_head`.

    forward(input_ids [T], positions [T], metadata) -> hidden states [T, hidden_size] (packed tokens);
    compute_logits(hidden [N, hidden_size]) -> logits [N, vocab_size].
    """

    name_rules: ClassVar[NameRules] = NameRules()
    final_logit_softcap: float | None = None
    model: nn.Module  # set by the family (with `embed_tokens`, unless it overrides input_embeddings)
    lm_head: Linear

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.requested_attention_backend: str | None = None
        # set by AutoModelForCausalLM: the layers built with this model
        self.attention_registry: AttentionLayerRegistry | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement forward(input_ids, positions, metadata)")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def make_lm_head(self) -> Linear:
        """The output projection; never quantized (checkpoints keep it in the model dtype)."""
        return Linear(self.config.hidden_size, self.config.vocab_size, quantizable=False)

    @property
    def tied(self) -> bool:
        return bool(self.config.tie_word_embeddings)

    def input_embeddings(self) -> nn.Module:
        """The token embedding table (its weight's dtype and device are the model's); a family whose
        checkpoint names it otherwise (GPT-2's `transformer.wte`) overrides this."""
        return cast(nn.Module, self.model.embed_tokens)

    def tie_weights(self) -> None:
        """Share the embedding table with the LM head when the config ties them."""
        held = getattr(self.lm_head.method, "holds_weight", False)  # a head quantized (or dequantized) on meta
        if self.tied and "weight" in self.lm_head._parameters and not held:  # holds its own weight instead
            self.lm_head.weight = cast(torch.Tensor, self.input_embeddings().weight)

    def checkpoint_rules(self) -> NameRules:
        """The family's naming rules, plus `lm_head.weight` skipped when tied (some checkpoints store it)."""
        rules = self.name_rules
        if not self.tied:
            return rules
        return NameRules(rules.renames, rules.ignore, (*rules.tied, "lm_head.weight"))

    def attention_layers(self) -> dict[str, Attention]:
        """Every attention layer, keyed by layer index (`_0`, `_1` suffixes when two share an index).

        Read from the weak-reference registry the layers joined while this model was built; a model
        constructed outside `AutoModelForCausalLM` is walked instead.
        """
        from kernelbay_engine.attention import attention_layers

        if self.attention_registry is not None:
            return self.attention_registry.layers()
        return attention_layers(self)
