"""Per-layer attention kind: a family rule's plan, else the generic fields every config may use."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernelbay.attention import IndexerSpec, LayerKind
from kernelbay.errors import ConfigError

from ._fields import Fields
from ._records import BlockSparseGeometry

if TYPE_CHECKING:
    from ._rules import FamilyRules

LAYER_KINDS = tuple(LayerKind)
CACHELESS_KINDS = frozenset(kind for kind in LayerKind if not kind.has_kv_cache)

LEGACY_KINDS = {"attention": LayerKind.FULL}


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """Which attention each layer runs: what a family's `layers` rule returns.

    A window or chunk size left None is read from the config's `sliding_window` / `attention_chunk_size`.
    """

    kinds: tuple[LayerKind, ...]  # (num_hidden_layers,) one kind per layer (names are taken and made kinds)
    sliding_window: int | None = None  # tokens a LayerKind.SLIDING layer sees
    attention_chunk_size: int | None = None  # chunk of a LayerKind.CHUNKED layer
    kv_heads: tuple[int, ...] | None = None  # (num_hidden_layers,) when layers differ (Nemotron-NAS)
    blocksparse: BlockSparseGeometry | None = None  # geometry of the LayerKind.BLOCKSPARSE layers
    indexer: IndexerSpec | None = None  # the lightning indexer of the LayerKind.INDEXED (DSA) layers

    def __post_init__(self) -> None:
        if not isinstance(self.kinds, tuple):
            raise ConfigError(f"layer kinds must be a tuple of {', '.join(LAYER_KINDS)}; got {self.kinds!r}.")
        unknown = sorted(set(self.kinds) - set(LAYER_KINDS))
        if unknown:
            raise ConfigError(
                f"layer kinds kernelbay does not know: {', '.join(unknown)}; known: {', '.join(LAYER_KINDS)}."
            )
        object.__setattr__(self, "kinds", tuple(map(LayerKind, self.kinds)))
        if self.kv_heads is not None and len(self.kv_heads) != len(self.kinds):
            raise ConfigError(f"kv_heads has {len(self.kv_heads)} entries for {len(self.kinds)} layers.")
        if (LayerKind.BLOCKSPARSE in self.kinds) != (self.blocksparse is not None):
            raise ConfigError(
                f"{LayerKind.BLOCKSPARSE} layers need their geometry (blocksparse=BlockSparseGeometry(...), "
                "which a family rule gives), and only they take one."
            )
        if (LayerKind.INDEXED in self.kinds) != (self.indexer is not None):
            raise ConfigError(
                f"{LayerKind.INDEXED} layers need their indexer geometry (indexer=IndexerSpec(...), which a family "
                "rule gives: install the family's plugin, e.g. kernelbay-deepseek), and only they take one."
            )


@dataclass(frozen=True, slots=True)
class ConfigSignature:
    """A transformers config class as the generic plan reads it: its name and the parameters its __init__ takes."""

    name: str
    parameters: frozenset[str]


Signature = Callable[[], "ConfigSignature | None"]  # asked only where it decides (a weight file's: no import)


def config_signature(config_class: type) -> ConfigSignature | None:
    """transformers' config class's signature; None for a plugin's or the folder's class (taken at its word), or one
    whose signature cannot be read."""
    if not config_class.__module__.startswith("transformers."):
        return None
    try:
        return ConfigSignature(config_class.__name__, frozenset(inspect.signature(config_class).parameters))
    except (TypeError, ValueError):
        return None


def resolve_layers(f: Fields, rules: FamilyRules, n_layers: int, max_positions: int, signature: Signature) -> LayerPlan:
    """Which attention each layer runs, the window and chunk sizes, and per-layer KV heads if they vary
    (`signature()`: the config class's, asked only where a window or chunk size is given)."""
    plan = rules.ask("layers") or _generic_plan(f, n_layers, signature)
    return _drop_window_beyond_context(f, _with_sizes(f, plan), max_positions)


def _generic_plan(f: Fields, n_layers: int, signature: Signature) -> LayerPlan:
    listed = f.get("layer_types")  # as written, else as the config class computed them
    if listed is not None:  # an older spelling of a kind means today's (as transformers remaps it)
        return LayerPlan(tuple(LEGACY_KINDS.get(kind, kind) for kind in listed))
    chunk = _size_or_none(f, "attention_chunk_size", f.get_int("attention_chunk_size"))
    if chunk and _applies(f, signature, "attention_chunk_size", chunk, "chunked attention"):  # Llama4TextConfig
        return LayerPlan((LayerKind.CHUNKED,) * n_layers)
    return _sliding_plan(f, n_layers, signature)


def _with_sizes(f: Fields, plan: LayerPlan) -> LayerPlan:
    """Fill the window and chunk a plan leaves to the generic fields."""
    window = (plan.sliding_window or _sliding_window(f)) if LayerKind.SLIDING in plan.kinds else None
    chunk = (
        (plan.attention_chunk_size or f.get_int("attention_chunk_size")) if LayerKind.CHUNKED in plan.kinds else None
    )
    return dataclasses.replace(plan, sliding_window=window, attention_chunk_size=chunk)


def _sliding_plan(f: Fields, n_layers: int, signature: Signature) -> LayerPlan:
    window = _sliding_window(f)
    if window is None:
        return LayerPlan((LayerKind.FULL,) * n_layers)
    pattern = f.get_int("sliding_window_pattern")
    if pattern:  # Gemma 3, Cohere 2: every pattern-th layer is global
        kinds = tuple(LayerKind.FULL if (i + 1) % pattern == 0 else LayerKind.SLIDING for i in range(n_layers))
    elif _applies(f, signature, "sliding_window", window, "sliding-window attention"):  # Mistral, Phi-3, ...
        kinds = (LayerKind.SLIDING,) * n_layers  # every layer slides
    else:
        kinds = (LayerKind.FULL,) * n_layers
    return LayerPlan(kinds, window if LayerKind.SLIDING in kinds else None)


def _applies(f: Fields, signature: Signature, parameter: str, value: int, what: str) -> bool:
    """A transformers config class applies `sliding_window` / `attention_chunk_size` only if it takes it as a
    parameter (MistralConfig does, LlamaConfig does not), as the model built from it would; a plugin's or the
    folder's class (no signature) is taken at its word. Ignored with a note otherwise."""
    taken = signature()
    if taken is None:
        return True
    takes = parameter in taken.parameters
    if not takes:
        f.notes.append(f"{parameter}={value} ignored: {taken.name} has no {what}")
    return takes


def _size_or_none(f: Fields, name: str, value: int | None) -> int | None:
    """A window or chunk size: positive, or 0 / null for none (Qwen2-MoE parses "off" as 0)."""
    if value is not None and value < 0:
        raise ConfigError(f"{f.source}: {name} must be a positive integer (0 or null: none), got {value}.")
    return value or None


def _sliding_window(f: Fields) -> int | None:
    """`sliding_window`, or `sliding_window_size` as some converted copies spell it (they must agree)."""
    written = f.raw.get("sliding_window")
    renamed = f.raw.get("sliding_window_size")
    if written is not None and renamed is not None and written != renamed:
        raise ConfigError(f"{f.source}: sliding_window={written} and sliding_window_size={renamed} disagree; keep one.")
    if written is None and renamed is not None and not f.written("sliding_window"):
        f.notes.append(f"sliding_window_size={renamed} read as sliding_window (a converted copy's spelling)")
        return f.as_int("sliding_window_size", renamed)
    if not f.written("sliding_window") and f.parsed.get("sliding_window") and f.raw:
        f.notes.append(
            f"sliding_window not in config.json: the config class default {f.parsed['sliding_window']} applies"
        )
    return _size_or_none(f, "sliding_window", f.get_int("sliding_window"))


def _drop_window_beyond_context(f: Fields, plan: LayerPlan, max_positions: int) -> LayerPlan:
    """A window at least as long as the longest sequence is full attention (Phi-3.5's 262144)."""
    if plan.sliding_window is None or plan.sliding_window < max_positions:
        return plan
    f.notes.append(f"sliding_window={plan.sliding_window} >= max_position_embeddings={max_positions}: full attention")
    kinds = tuple(LayerKind.FULL if kind == LayerKind.SLIDING else kind for kind in plan.kinds)
    return dataclasses.replace(plan, kinds=kinds, sliding_window=None)
