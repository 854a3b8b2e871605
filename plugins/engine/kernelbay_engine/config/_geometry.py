"""Sizes, heads, MLA and attention scale: every spelling and legacy default, resolved once."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from kernelbay.attention import MLASpec
from kernelbay.dtypes import MODEL_DTYPES, canonical, normalize_dtype
from kernelbay.errors import ConfigError

from ._fields import MAX_LAYERS, Fields, check_size

if TYPE_CHECKING:
    from ._rules import FamilyRules

HIDDEN = ("hidden_size", "n_embd", "d_model")
LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
HEADS = ("num_attention_heads", "n_head", "num_heads")
VOCAB = ("vocab_size",)
MAX_POSITIONS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
FFN = ("intermediate_size", "ffn_dim", "ff_intermediate_size", "ffn_hidden_size", "n_inner")
NORM_EPS = ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_epsilon", "norm_eps")
DEFAULT_LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which OPT relies on


def core_sizes(f: Fields, encoder: bool = False) -> tuple[int, int, int, int]:
    """hidden_size, num_hidden_layers, num_attention_heads, vocab_size (0 for a vision encoder): each must be
    written down. The layer count is bounded before anything is built per layer, the heads before hidden / heads;
    the record (ModelConfig) bounds every other size."""
    spellings = (HIDDEN, LAYERS, HEADS) if encoder else (HIDDEN, LAYERS, HEADS, VOCAB)
    missing = [" / ".join(names) for names in spellings if f.as_written(*names) is None]
    if missing:
        raise ConfigError(f"{f.source}: required fields are missing or null; add them to config.json", missing)
    hidden, layers, heads, *vocab = (f.required_int(*names) for names in spellings)
    check_size(f.source, LAYERS[0], layers, limit=MAX_LAYERS)
    check_size(f.source, HEADS[0], heads)
    return hidden, layers, heads, vocab[0] if vocab else 0


def resolve_mla(f: Fields, rules: FamilyRules) -> MLASpec | None:
    """DeepSeek-style latent attention when `kv_lora_rank` is set; None for ordinary attention. A `q_lora_rank`
    config.json leaves out is the family's `mla` rule's to give (kernelbay-deepseek reads the weights): copies of
    configs drop null keys, and transformers' default (1536) would silently build the wrong query projection for
    a checkpoint without query compression (DeepSeek-V2-Lite)."""
    kv_lora_rank = f.get_int("kv_lora_rank")
    if kv_lora_rank is None:
        return None
    widths = [name for name in MLASpec.REQUIRED if name != "kv_lora_rank"]
    missing = [name for name in widths if f.as_written(name) is None]
    if missing:
        raise ConfigError(f"{f.source}: MLA config (kv_lora_rank={kv_lora_rank}) lacks required fields", missing)
    sizes = {name: f.required_int(name) for name in widths}
    for name, value in {"kv_lora_rank": kv_lora_rank, "q_lora_rank": f.get_int("q_lora_rank"), **sizes}.items():
        if value is not None and value > 0:  # below 1: the record's own words
            check_size(f.source, name, value)
    try:
        mla = MLASpec(kv_lora_rank=kv_lora_rank, q_lora_rank=f.get_int("q_lora_rank"), **sizes)
    except ValueError as err:  # the contract record's words, as a config error
        raise ConfigError(f"{f.source}: {err}") from None
    answer = rules.ask("mla")
    if f.raw and not f.written("q_lora_rank") and "q_lora_rank" not in (answer or {}):
        raise ConfigError(
            f"{f.source}: 'q_lora_rank' is missing and the folder has no weights to tell (the family's plugin reads "
            f"them: kernelbay-deepseek). It decides whether queries are compressed (transformers would assume "
            f"{f.parsed.get('q_lora_rank')!r}, as in DeepSeek-V2/V3) or projected directly (null, as in "
            'DeepSeek-V2-Lite); add "q_lora_rank": null or the published rank.'
        )
    return rules.apply("mla", mla, answer)


def resolve_head_dim(f: Fields, hidden: int, heads: int, mla: MLASpec | None) -> int:
    """Query/key head width: MLA's nope+rope, an explicit head_dim (Qwen3, Gemma), else hidden / heads."""
    if mla is not None:
        return mla.qk_head_dim
    explicit = f.get_int("head_dim")
    if explicit is not None:
        return explicit
    if hidden % heads:
        raise ConfigError(
            f"{f.source}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; "
            "add an explicit head_dim."
        )
    return hidden // heads


def resolve_intermediate_size(f: Fields) -> int:
    """Dense FFN width as written (a class default is no evidence: a copy may have dropped the key)."""
    width = f.get_int(*FFN) if (f.written(*FFN) or not f.raw) else None
    if width:
        return width
    raise f.missing(FFN)


def resolve_max_positions(f: Fields, encoder: bool) -> int:
    """The context length; a vision encoder's is one position per image patch unless written."""
    if encoder and f.get("max_position_embeddings") is None:
        image, patch = f.get_int("image_size"), f.get_int("patch_size")
        if image and patch:
            return (image // patch) ** 2
    value = f.get_int(*MAX_POSITIONS)
    if value is None:
        raise f.missing(MAX_POSITIONS)
    return value


def resolve_norm_eps(f: Fields) -> float:
    eps = f.get_float(*NORM_EPS)
    if eps is None:
        f.notes.append(f"no norm epsilon in config.json: using torch.nn.LayerNorm's default {DEFAULT_LAYER_NORM_EPS}")
        return DEFAULT_LAYER_NORM_EPS
    return eps


def resolve_attention_scale(f: Fields, head_dim: int) -> float:
    """The softmax scale q·k is multiplied by: 1/sqrt(head_dim) unless a generic field says otherwise."""
    scalar = f.get_float("query_pre_attn_scalar")
    if scalar is not None:  # Gemma 2/3
        return f.as_float("query_pre_attn_scalar", scalar, positive=True) ** -0.5
    multiplier = f.get_float("attention_multiplier")
    if multiplier is not None:  # Granite gives the scale itself
        return f.as_float("attention_multiplier", multiplier, positive=True)
    return head_dim**-0.5


def resolve_dtype(f: Fields) -> str:
    """ "float32" | "bfloat16" | "float16" from torch_dtype / dtype, else the floating dtype most stored tensors
    have, else float32 (HF's convention for configs that omit it)."""
    value = f.get("torch_dtype", "dtype")
    if value is None and f.tensors:
        stored = Counter(canonical(d) for d, _ in f.tensors.values() if canonical(d) in MODEL_DTYPES)
        if stored:
            value = stored.most_common(1)[0][0]
            f.notes.append(f"no torch_dtype/dtype in config.json: {value}, read from the stored weights' headers")
    if value is None:
        f.notes.append("no torch_dtype/dtype in config.json: float32 assumed (transformers' convention)")
        return "float32"
    try:
        return normalize_dtype(value)
    except ValueError as err:  # kernelbay.dtypes' words: the spelling and the choices
        raise ConfigError(f"{f.source}: torch_dtype: {err}.") from None
