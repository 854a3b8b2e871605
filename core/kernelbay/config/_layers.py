"""Per-layer attention kind, from every field variant real configs use."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from ..errors import ConfigError
from ._fields import Fields

FULL = "full_attention"
SLIDING = "sliding_attention"
CHUNKED = "chunked_attention"
NO_ATTENTION = "no_attention"  # no attention, no KV cache (Nemotron-NAS no-op / linear blocks)
BLOCKSPARSE = "blocksparse_attention"  # Phi-3-small: local + strided blocks, full KV cache
INDEXED = "indexed_attention"  # DeepSeek V3.2: MLA over the top-k tokens a lightning indexer picks
ENCODER = "encoder_attention"  # bidirectional, no KV cache (vision encoders)
LAYER_KINDS = (FULL, SLIDING, CHUNKED, NO_ATTENTION, BLOCKSPARSE, INDEXED, ENCODER)
CACHELESS_KINDS = frozenset({NO_ATTENTION, ENCODER})

# Older spellings of layer kinds in written layer_types (transformers remaps them the same way).
LEGACY_KINDS = {"attention": FULL, "deepseek_sparse_attention": INDEXED}

# Families that alternate sliding and full layers without saying so in config.json:
# layer i slides unless (i + 1) % pattern == 0 (Gemma 2: even layers slide).
IMPLICIT_SLIDING_PATTERN = {"gemma2": 2}
DEFAULT_NO_ROPE_INTERVAL = 4  # Llama 4: every 4th layer is NoPE + full attention


@dataclass(frozen=True, slots=True)
class LayerPlan:
    kinds: tuple[str, ...]
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    kv_heads: tuple[int, ...] | None = None  # per layer when layers differ (Nemotron-NAS)


def resolve_layers(f: Fields, model_type: str, n_layers: int, heads: int, max_positions: int,
                   config_class: type | None) -> LayerPlan:
    """Which attention each layer runs, the window and chunk sizes, and per-layer KV heads if they vary."""
    if f.get("block_configs") is not None:
        plan = _block_configs_plan(f, n_layers, heads)
    elif f.raw.get("layer_types") is not None:
        plan = _explicit_plan(f, n_layers)
    elif f.get("dense_attention_every_n_layers"):
        plan = LayerPlan(_blocksparse_kinds(f.get_int("dense_attention_every_n_layers"), n_layers))
    elif f.get("index_topk") is not None and f.get("kv_lora_rank") is not None:
        plan = LayerPlan((INDEXED,) * n_layers)
    elif f.get_int("attention_chunk_size"):
        plan = _chunked_plan(f, n_layers)
    else:
        plan = _sliding_plan(f, model_type, n_layers, config_class)
    _check_plan(f, plan, n_layers)
    return _drop_window_beyond_context(f, plan, max_positions)


def _explicit_plan(f: Fields, n_layers: int) -> LayerPlan:
    kinds = tuple(LEGACY_KINDS.get(kind, kind) for kind in f.raw["layer_types"])
    unknown = sorted({k for k in kinds if k not in LAYER_KINDS})
    if unknown:
        raise ConfigError(f"{f.source}: layer_types holds kinds kernelbay does not know: {', '.join(unknown)}; "
                          f"known: {', '.join(LAYER_KINDS)}.")
    window = _sliding_window(f) if SLIDING in kinds else None
    chunk = f.get_int("attention_chunk_size") if CHUNKED in kinds else None
    return LayerPlan(kinds, window, chunk)


def _blocksparse_kinds(every_n: int, n_layers: int) -> tuple[str, ...]:
    # Microsoft's reference: layer i is dense when (i + 1) % every_n == 0, block-sparse otherwise.
    return tuple(FULL if (i + 1) % every_n == 0 else BLOCKSPARSE for i in range(n_layers))


def _chunked_plan(f: Fields, n_layers: int) -> LayerPlan:
    """Llama 4: layers that use RoPE attend within chunks; NoPE layers attend to everything."""
    uses_rope = f.get("no_rope_layers")
    if not uses_rope:
        interval = f.get_int("no_rope_layer_interval", default=DEFAULT_NO_ROPE_INTERVAL)
        uses_rope = [(i + 1) % interval != 0 for i in range(n_layers)]
    if len(uses_rope) != n_layers:
        raise ConfigError(f"{f.source}: no_rope_layers has {len(uses_rope)} entries for {n_layers} layers.")
    kinds = tuple(CHUNKED if rope else FULL for rope in uses_rope)
    return LayerPlan(kinds, attention_chunk_size=f.get_int("attention_chunk_size"))


def _sliding_plan(f: Fields, model_type: str, n_layers: int, config_class: type | None) -> LayerPlan:
    window = _sliding_window(f)
    if window is None:
        return LayerPlan((FULL,) * n_layers)
    pattern = f.get_int("sliding_window_pattern") or IMPLICIT_SLIDING_PATTERN.get(model_type)
    if pattern:  # Gemma 2/3, Cohere 2: every pattern-th layer is global
        kinds = tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n_layers))
    elif f.written("use_sliding_window") or f.get("use_sliding_window") is not None:
        kinds = _qwen2_kinds(f, n_layers)
    elif _class_uses_sliding_window(config_class):  # Mistral, Phi-3, ...: every layer slides
        kinds = (SLIDING,) * n_layers
    else:
        f.notes.append(f"sliding_window={window} ignored: {getattr(config_class, '__name__', 'this config')} "
                       "has no sliding-window attention")
        kinds = (FULL,) * n_layers
    return LayerPlan(kinds, window if SLIDING in kinds else None)


def _qwen2_kinds(f: Fields, n_layers: int) -> tuple[str, ...]:
    """Qwen2/Qwen3: off unless use_sliding_window; then layers from max_window_layers on slide."""
    if not f.get_bool("use_sliding_window"):
        return (FULL,) * n_layers
    first = f.get_int("max_window_layers", default=0)
    return tuple(SLIDING if i >= first else FULL for i in range(n_layers))


def _class_uses_sliding_window(config_class: type | None) -> bool:
    """A transformers config class applies `sliding_window` only if it takes it as a parameter
    (MistralConfig does, LlamaConfig does not); a plugin's or the folder's class is taken at its word."""
    if config_class is None or not config_class.__module__.startswith("transformers."):
        return True
    try:
        return "sliding_window" in inspect.signature(config_class.__init__).parameters
    except (TypeError, ValueError):
        return True


def _sliding_window(f: Fields) -> int | None:
    """`sliding_window`, or `sliding_window_size` as some converted copies spell it (they must agree)."""
    written = f.raw.get("sliding_window")
    renamed = f.raw.get("sliding_window_size")
    if written is not None and renamed is not None and written != renamed:
        raise ConfigError(f"{f.source}: sliding_window={written} and sliding_window_size={renamed} disagree; "
                          "keep one.")
    if written is None and renamed is not None and not f.written("sliding_window"):
        f.notes.append(f"sliding_window_size={renamed} read as sliding_window (a converted copy's spelling)")
        return f.as_int("sliding_window_size", renamed)
    if not f.written("sliding_window") and f.parsed.get("sliding_window") and f.raw:
        f.notes.append(f"sliding_window not in config.json: the config class default "
                       f"{f.parsed['sliding_window']} applies")
    window = f.get_int("sliding_window")
    return window if window and window > 0 else None  # Qwen2-MoE parses "off" as 0


def _block_configs_plan(f: Fields, n_layers: int, heads: int) -> LayerPlan:
    """Nemotron-NAS: each layer's attention is its own: grouped heads, a window, or none at all."""
    blocks = f.get("block_configs")
    if not isinstance(blocks, (list, tuple)) or len(blocks) != n_layers:
        raise ConfigError(f"{f.source}: block_configs must list one block per layer ({n_layers}).")
    layers = [_nas_attention(f, i, block, heads) for i, block in enumerate(blocks)]
    windows = {window for _, _, window in layers if window is not None}
    if len(windows) > 1:
        raise ConfigError(f"{f.source}: block_configs use several attention windows {sorted(windows)}; "
                          "kernelbay supports one window per model.")
    kinds = tuple(kind for kind, _, _ in layers)
    return LayerPlan(kinds, next(iter(windows), None), kv_heads=tuple(kv for _, kv, _ in layers))


def _nas_attention(f: Fields, index: int, block: dict, heads: int) -> tuple[str, int, int | None]:
    attention = block.get("attention") if isinstance(block, dict) else None
    if not isinstance(attention, dict):
        raise ConfigError(f"{f.source}: block_configs[{index}] has no 'attention' object.")
    if attention.get("no_op") or attention.get("replace_with_linear"):
        return NO_ATTENTION, 0, None
    group = attention.get("n_heads_in_group")
    if not isinstance(group, int) or group <= 0 or heads % group:
        raise ConfigError(f"{f.source}: block_configs[{index}].attention.n_heads_in_group={group!r} must divide "
                          f"num_attention_heads={heads}.")
    window = attention.get("window_length")
    return (SLIDING if window else FULL), heads // group, window


def _check_plan(f: Fields, plan: LayerPlan, n_layers: int) -> None:
    if len(plan.kinds) != n_layers:
        raise ConfigError(f"{f.source}: {len(plan.kinds)} layer kinds for num_hidden_layers={n_layers}.")
    if SLIDING in plan.kinds and not plan.sliding_window:
        raise ConfigError(f"{f.source}: some layers use sliding-window attention but sliding_window is not set.")
    if CHUNKED in plan.kinds and not plan.attention_chunk_size:
        raise ConfigError(f"{f.source}: some layers use chunked attention but attention_chunk_size is not set.")


def _drop_window_beyond_context(f: Fields, plan: LayerPlan, max_positions: int) -> LayerPlan:
    """A window at least as long as the longest sequence is full attention (Phi-3.5's 262144)."""
    if plan.sliding_window is None or plan.sliding_window < max_positions:
        return plan
    f.notes.append(f"sliding_window={plan.sliding_window} >= max_position_embeddings={max_positions}: "
                   "full attention")
    kinds = tuple(FULL if kind == SLIDING else kind for kind in plan.kinds)
    return LayerPlan(kinds, None, plan.attention_chunk_size, plan.kv_heads)
