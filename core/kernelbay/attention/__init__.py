"""The attention contract: the `AttentionBackend` protocol and its records (geometry, requirements, metadata,
forward args, the paged `KVCacheSpec`; `cache_ops` reads and writes that cache), construction
(`create_attention`, `build_backend`) and the one selector.
docs/guides/attention-backend-plugin.md is the vendor's reference."""

from ._backend import AttentionBackend, AttentionContractError, AttentionForwardArgs, build_backend, create_attention
from ._capabilities import ANY, AttentionRequirements
from ._geometry import (
    SPARSE_BLOCKSPARSE,
    SPARSE_DSA,
    SPARSE_NONE,
    AttentionGeometry,
    AttentionType,
    IndexerSpec,
    KVLayout,
    LayerKind,
    MLASpec,
)
from ._kv_spec import KVCacheSpec, zeroed
from ._metadata import AttentionMetadata, StepRequest, build_metadata, padded_slots, table_slots
from ._selector import (
    BackendNotCapable,
    LayerGroupSelection,
    NoCapableBackend,
    SelectionResult,
    clear_selection_cache,
    load_backend,
    select_attention_backend,
    select_for_layer_groups,
)

__all__ = [
    "ANY",
    "AttentionBackend",
    "AttentionContractError",
    "AttentionForwardArgs",
    "AttentionGeometry",
    "AttentionMetadata",
    "AttentionRequirements",
    "AttentionType",
    "BackendNotCapable",
    "IndexerSpec",
    "KVCacheSpec",
    "KVLayout",
    "LayerKind",
    "LayerGroupSelection",
    "MLASpec",
    "NoCapableBackend",
    "SPARSE_BLOCKSPARSE",
    "SPARSE_DSA",
    "SPARSE_NONE",
    "SelectionResult",
    "StepRequest",
    "build_backend",
    "build_metadata",
    "clear_selection_cache",
    "load_backend",
    "create_attention",
    "select_attention_backend",
    "padded_slots",
    "select_for_layer_groups",
    "table_slots",
    "zeroed",
]
