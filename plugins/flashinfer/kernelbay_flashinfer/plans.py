"""FlashInfer wrappers, planned at most once per step and plan key.

A wrapper's `plan()` fixes everything but the tensors (batch shape, heads, window, soft-cap, dtypes);
all layers with the same key in one step share one plan, as FlashInfer intends. Wrappers persist
across steps (their int workspaces are costly to allocate); the float workspace is shared per device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from .metadata import FlashInferMetadata

WORKSPACE_BYTES = 128 * 1024 * 1024
# FlashInfer's CUDA-core decode kernels are compiled for these query-per-KV group sizes; other GQA
# ratios go through the tensor-core (prefill-kernel) decode path.
CUDA_CORE_DECODE_GROUPS = frozenset({1, 2, 4, 8})
KINDS = ("prefill", "decode", "mla")
MLA_ROPE_DIM = 64


@dataclass(frozen=True, slots=True)
class PlanKey:
    """Everything a FlashInfer plan depends on besides the page table."""

    kind: str
    """"prefill" (any query lengths), "decode" (one query token per request) or "mla" (latent attention)."""
    device: str
    layout: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    window_left: int
    """-1: no window; else keys at most window_left positions behind the query are visible."""
    logit_softcap: float | None
    causal: bool
    q_dtype: torch.dtype
    kv_dtype: torch.dtype

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"PlanKey.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def use_tensor_cores(self) -> bool:
        return self.num_heads // self.num_kv_heads not in CUDA_CORE_DECODE_GROUPS


_lock = threading.Lock()
_workspaces: dict[str, torch.Tensor] = {}
_wrappers: dict[PlanKey, list] = {}  # key -> [wrapper, step_id it is planned for]


def workspace(device: str) -> torch.Tensor:
    if device not in _workspaces:
        _workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _workspaces[device]


def _new_wrapper(key: PlanKey):
    import flashinfer

    if key.kind == "decode":
        return flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace(key.device), key.layout, use_tensor_cores=key.use_tensor_cores
        )
    if key.kind == "mla":
        return flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace(key.device))
    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(key.device), key.layout)


def _plan(wrapper, key: PlanKey, metadata: FlashInferMetadata) -> None:
    table = metadata.page_table
    indices = table.paged_kv_indices.to(key.device)
    if key.kind == "mla":  # head_dim is the latent width; the MLA wrapper takes kv lengths, not last_page_len
        wrapper.plan(
            table.qo_indptr.to(key.device),
            table.paged_kv_indptr.to(key.device),
            indices,
            table.kv_lens.to(key.device),
            key.num_heads,
            key.head_dim,
            MLA_ROPE_DIM,
            table.page_size,
            key.causal,
            key.scale,
            key.q_dtype,
            key.kv_dtype,
        )
        return
    common = dict(
        window_left=key.window_left,
        logits_soft_cap=key.logit_softcap,
        sm_scale=key.scale,
        q_data_type=key.q_dtype,
        kv_data_type=key.kv_dtype,
    )
    if key.kind == "decode":
        wrapper.plan(
            table.paged_kv_indptr,
            indices,
            table.paged_kv_last_page_len,
            key.num_heads,
            key.num_kv_heads,
            key.head_dim,
            table.page_size,
            **common,
        )
        return
    wrapper.plan(
        table.qo_indptr,
        table.paged_kv_indptr,
        indices,
        table.paged_kv_last_page_len,
        key.num_heads,
        key.num_kv_heads,
        key.head_dim,
        table.page_size,
        causal=key.causal,
        **common,
    )


def planned_wrapper(key: PlanKey, metadata: FlashInferMetadata):
    """The wrapper for `key`, planned for this step (planning only if the step changed)."""
    with _lock:
        entry = _wrappers.get(key)
        if entry is None:
            entry = _wrappers[key] = [_new_wrapper(key), None]
        if entry[1] != metadata.step_id:
            _plan(entry[0], key, metadata)
            entry[1] = metadata.step_id
        return entry[0]


def forget_wrappers() -> None:
    """Drop every wrapper and workspace (tests, or to free GPU memory)."""
    with _lock:
        _wrappers.clear()
        _workspaces.clear()
