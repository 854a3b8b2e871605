"""The attention protocol, the paged KV cache and the backend selector.

- protocol: `AttentionBackend` (declarations; `ANY`), `AttentionMetadata` (`build_metadata`, `StepRequest`),
  `AttentionForwardArgs`, `AttentionType`, `KVLayout`, `AttentionGeometry`, `MLASpec`, `IndexerSpec` (DSA),
  `NoOptions`;
- construction: `create_attention` (a backend instance for one layer, geometry validated), `build_backend`
  (the same from an `AttentionGeometry` record a layer already holds);
- KV cache: `KVCacheSpec` (what a backend stores per block; the engine allocates and pages it);
- selection: `AttentionRequirements`, `select_attention_backend`, `SelectionResult`, `CandidateReport`,
  `select_for_layer_groups`, `select_for_model`, `LayerGroupSelection`, `BackendNotCapable`,
  `NoCapableBackend`, `clear_selection_cache`;
- validation: `AttentionOptions`, `validate_options`.
"""

from __future__ import annotations

from ._backend import AttentionBackend, AttentionContractError, build_backend, create_attention
from ._capabilities import ANY
from ._forward_args import AttentionForwardArgs
from ._geometry import AttentionGeometry, IndexerSpec, MLASpec
from ._kv_spec import KVCacheSpec, zeroed
from ._metadata import AttentionMetadata, StepRequest, build_metadata
from ._options import NoOptions
from ._requirements import AttentionRequirements
from ._selector import (
    BACKEND_ENV,
    BackendNotCapable,
    CandidateReport,
    LayerGroupSelection,
    NoCapableBackend,
    SelectionResult,
    clear_selection_cache,
    select_attention_backend,
    select_for_layer_groups,
    select_for_model,
)
from ._types import SPARSE_DSA, SPARSE_NONE, AttentionType, KVLayout
from ._validation import AttentionOptions, validate_options

__all__ = [
    "ANY",
    "BACKEND_ENV",
    "SPARSE_DSA",
    "SPARSE_NONE",
    "AttentionBackend",
    "AttentionContractError",
    "AttentionForwardArgs",
    "AttentionGeometry",
    "AttentionMetadata",
    "AttentionOptions",
    "AttentionRequirements",
    "AttentionType",
    "BackendNotCapable",
    "CandidateReport",
    "IndexerSpec",
    "KVCacheSpec",
    "KVLayout",
    "LayerGroupSelection",
    "MLASpec",
    "NoCapableBackend",
    "NoOptions",
    "SelectionResult",
    "StepRequest",
    "build_backend",
    "build_metadata",
    "clear_selection_cache",
    "create_attention",
    "select_attention_backend",
    "select_for_layer_groups",
    "select_for_model",
    "validate_options",
    "zeroed",
]
