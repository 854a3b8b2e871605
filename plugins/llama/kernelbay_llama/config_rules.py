"""What Llama-like configs leave implicit, as kernelbay-llama's `register_model_type_rules` hook.

Each rule reads a `kernelbay_engine.config.ConfigView` and returns its answer, or None to leave the point to the
core's generic fields. Light to import (no torch, no transformers): hook modules load at the first config.
"""

from __future__ import annotations

from collections.abc import Mapping

from kernelbay.attention import LayerKind
from kernelbay.errors import ConfigError
from kernelbay.hooks import hookimpl
from kernelbay_engine.config import BlockSparseGeometry, LayerPlan

NO_ROPE_INTERVAL = 4  # Llama 4's default: every 4th layer is NoPE + full attention
NAS_FFN_MULTIPLE = 256  # Nemotron-NAS FFN width: ffn_mult x 2/3 x hidden, rounded up to a multiple of this


@hookimpl
def register_model_type_rules(register):
    register("gemma2", layers=gemma2_layers)
    register(("gemma3", "gemma3_text"), rope=gemma3_local_rope)
    register(("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"), layers=qwen2_layers)
    register(("llama4", "llama4_text"), layers=llama4_layers)
    register("nemotron-nas", layers=nas_layers, intermediate_size=nas_ffn_width, not_built=_nas_not_built)
    register("phi3small", layers=phi3small_layers, attention_scale=phi3small_mup_scale, not_built=_phi3small_not_built)
    register("gemma3", not_built=_gemma3_not_built)
    register("gpt_oss", moe=gpt_oss_moe, attention_sinks=gpt_oss_sinks)


# Architectures whose configs this plugin reads but builds no model for, and why (said when none serves them).
NOT_BUILT = {
    "nas": "Nemotron-NAS (DeciLM) is not built: transformers has no implementation to check a kernelbay model "
    "against (the checkpoint ships its own modeling code), so kernelbay-llama reads its config (per-layer "
    "attention and FFN from block_configs) but provides no model for it.",
    "phi3small": "Phi-3-small is not built: transformers has no implementation to check a kernelbay model against "
    "(the checkpoint ships its own modeling code, whose block-sparse attention needs triton), so kernelbay-llama "
    "reads its config (dense/block-sparse layers, muP scale) but provides no model for it.",
    "gemma3": "The multimodal Gemma 3 is not built (kernelbay has no vision encoder for it, and text prompts alone "
    "would take image tokens as words); kernelbay-llama builds the text-only Gemma3ForCausalLM (model_type "
    "gemma3_text, as gemma-3-1b-it).",
}


def _nas_not_built(_config) -> str:
    return NOT_BUILT["nas"]


def _phi3small_not_built(_config) -> str:
    return NOT_BUILT["phi3small"]


def _gemma3_not_built(config) -> str | None:
    return NOT_BUILT["gemma3"] if "Gemma3ForConditionalGeneration" in config.get("architectures", ()) else None


def gpt_oss_moe(config) -> dict:
    """GPT-OSS's experts (gate_up and down) and its router have biases; config.json never says so."""
    return {"bias": True, "router_bias": True}


def gpt_oss_sinks(config) -> bool:
    """Every GPT-OSS attention layer has a learned sink logit per head (`self_attn.sinks`)."""
    return True


def gemma2_layers(config) -> LayerPlan | None:
    """Gemma 2 alternates without saying so in config.json: even layers slide, odd layers attend globally."""
    if config.written("layer_types", "sliding_window_pattern"):
        return None
    n = config.num_hidden_layers
    if not config.get_int("sliding_window"):
        return LayerPlan((LayerKind.FULL,) * n)
    return LayerPlan(tuple(LayerKind.SLIDING if i % 2 == 0 else LayerKind.FULL for i in range(n)))


def gemma3_local_rope(config) -> dict | None:
    """Gemma 3's sliding layers rotate with their own base (`rope_local_base_freq`, which transformers 5 moves to
    rope_parameters.sliding_attention), never scaled: the scaling is the full layers'."""
    nested = (config.rope_parameters, config.parsed.get("rope_parameters"))  # as written, else as parsed
    sliding, full = LayerKind.SLIDING, LayerKind.FULL
    local = next((p[sliding] for p in nested if isinstance(p, Mapping) and isinstance(p.get(sliding), Mapping)), {})
    kind = local.get("rope_type") or local.get("type") or "default"
    if kind != "default":
        raise ConfigError(
            f"{config.source}: rope_parameters.{sliding} has rope_type {kind!r}; kernelbay scales RoPE "
            f"on {full} layers only (as Gemma 3 does): move the scaling to rope_parameters.{full}."
        )
    theta = config.get_float("rope_local_base_freq") or local.get("rope_theta")
    return None if theta is None else {"local_theta": config.as_float("rope_local_base_freq", theta, positive=True)}


def qwen2_layers(config) -> LayerPlan | None:
    """Qwen2/Qwen3: no window unless use_sliding_window; then the layers from max_window_layers on slide."""
    if config.written("layer_types"):
        return None
    n = config.num_hidden_layers
    if not (config.get_bool("use_sliding_window") and config.get_int("sliding_window")):  # Qwen2-MoE: 0 is off
        return LayerPlan((LayerKind.FULL,) * n)
    first = config.get_int("max_window_layers", default=0)
    return LayerPlan(tuple(LayerKind.SLIDING if i >= first else LayerKind.FULL for i in range(n)))


def llama4_layers(config) -> LayerPlan | None:
    """Llama 4: layers that use RoPE attend within chunks; NoPE layers attend to everything."""
    if config.written("layer_types") or not config.get_int("attention_chunk_size"):
        return None
    n = config.num_hidden_layers
    uses_rope = config.get("no_rope_layers")
    if not uses_rope:
        interval = config.get_int("no_rope_layer_interval", default=NO_ROPE_INTERVAL)
        uses_rope = [(i + 1) % interval != 0 for i in range(n)]
    if len(uses_rope) != n:
        raise ConfigError(f"no_rope_layers has {len(uses_rope)} entries for {n} layers.")
    return LayerPlan(tuple(LayerKind.CHUNKED if rope else LayerKind.FULL for rope in uses_rope))


def nas_layers(config) -> LayerPlan | None:
    """Nemotron-NAS: each layer's attention is its own: grouped heads, a window, or none at all."""
    blocks = config.get("block_configs")
    if blocks is None:
        return None
    n, heads = config.num_hidden_layers, config.num_attention_heads
    if not isinstance(blocks, tuple) or len(blocks) != n:
        raise ConfigError(f"block_configs must list one block per layer ({n}).")
    layers = [_nas_attention(i, block, heads) for i, block in enumerate(blocks)]
    windows = {window for _, _, window in layers if window is not None}
    if len(windows) > 1:
        raise ConfigError(
            f"block_configs use several attention windows {sorted(windows)}; kernelbay supports one window per model."
        )
    kinds = tuple(kind for kind, _, _ in layers)
    return LayerPlan(kinds, next(iter(windows), None), kv_heads=tuple(kv for _, kv, _ in layers))


def _nas_attention(index: int, block, heads: int) -> tuple[str, int, int | None]:
    attention = block.get("attention") if hasattr(block, "get") else None
    if not hasattr(attention, "get"):
        raise ConfigError(f"block_configs[{index}] has no 'attention' object.")
    if attention.get("no_op") or attention.get("replace_with_linear"):
        return LayerKind.NO_ATTENTION, 0, None
    group = attention.get("n_heads_in_group")
    if not isinstance(group, int) or group <= 0 or heads % group:
        raise ConfigError(
            f"block_configs[{index}].attention.n_heads_in_group={group!r} must divide num_attention_heads={heads}."
        )
    window = attention.get("window_length")
    return (LayerKind.SLIDING if window else LayerKind.FULL), heads // group, window


def nas_ffn_width(config) -> int | None:
    """The widest per-layer FFN of block_configs (no-op and linear blocks have none)."""
    blocks = config.get("block_configs")
    if blocks is None:
        return None
    widths = [_nas_ffn_width(i, block, config.hidden_size) for i, block in enumerate(blocks)]
    return max(widths) if any(widths) else None


def _nas_ffn_width(index: int, block, hidden: int) -> int:
    ffn = block.get("ffn") or {}
    if ffn.get("no_op") or ffn.get("replace_with_linear"):
        return 0
    mult = ffn.get("ffn_mult")
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or mult <= 0:
        raise ConfigError(f"block_configs[{index}].ffn.ffn_mult={mult!r} must be a positive number.")
    width = int(2 * mult * hidden / 3)
    return -(-width // NAS_FFN_MULTIPLE) * NAS_FFN_MULTIPLE


def phi3small_layers(config) -> LayerPlan | None:
    """Phi-3-small (Microsoft's reference): layer i is dense when (i + 1) % dense_attention_every_n_layers == 0,
    block-sparse otherwise."""
    every = config.get_int("dense_attention_every_n_layers")
    if not every:
        return None
    kinds = tuple(
        LayerKind.FULL if (i + 1) % every == 0 else LayerKind.BLOCKSPARSE for i in range(config.num_hidden_layers)
    )
    if LayerKind.BLOCKSPARSE not in kinds:
        return LayerPlan(kinds)
    return LayerPlan(
        kinds,
        blocksparse=BlockSparseGeometry(
            block_size=config.required_int("blocksparse_block_size"),
            num_local_blocks=config.required_int("blocksparse_num_local_blocks"),
            vert_stride=config.required_int("blocksparse_vert_stride"),
            homo_head_pattern=config.get_bool("blocksparse_homo_head_pattern"),
        ),
    )


def phi3small_mup_scale(config) -> float | None:
    """Phi-3-small's muP scales q·k by mup_attn_multiplier / head_dim, not 1/sqrt(head_dim)."""
    if not config.get_bool("mup_use_scaling"):
        return None
    head_dim = config.get_int("head_dim") or config.hidden_size // config.num_attention_heads
    return config.get_float("mup_attn_multiplier", default=1.0) / head_dim
