"""The named batch specs: one step of packed requests over one layer's geometry, and what each needs of a backend."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..attention import (
    SPARSE_DSA,
    SPARSE_NONE,
    AttentionGeometry,
    AttentionRequirements,
    AttentionType,
    IndexerSpec,
    KVLayout,
    MLASpec,
)


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """One step's batch over one attention layer; each request's context is cached before the step."""

    name: str
    requests: tuple[tuple[int, int], ...]
    """Per request (query_len, context_len): query_len new tokens after context_len cached ones."""
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    """Query/key head size (MLA: qk_nope_head_dim + qk_rope_head_dim)."""
    dtype: str = "float32"
    """Model dtype of queries, keys and values."""
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    layout: str = "NHD"
    attn_type: str = AttentionType.FULL
    sliding_window: int | None = None
    chunk_size: int | None = None
    logit_softcap: float | None = None
    sinks: bool = False
    """Per-head attention sink logits (random, passed as AttentionForwardArgs.sinks)."""
    scale: float | None = None
    """Softmax scale; None: head_dim ** -0.5."""
    mla: MLASpec | None = None
    indexer: IndexerSpec | None = None
    """DSA (MLA only): each query attends to index_topk keys picked at random (AttentionForwardArgs.topk_indices);
    the indexer keys are written to the cache too and must read back unchanged."""
    contiguous_blocks: bool = False
    """True: each request's blocks are one run of consecutive ids (zero-copy paths); False: scattered."""

    def but(self, **changes) -> BatchSpec:
        return dataclasses.replace(self, **changes)

    @property
    def num_tokens(self) -> int:
        """T, the packed new tokens of the step."""
        return sum(q for q, _ in self.requests)

    def requirements(self) -> AttentionRequirements:
        """What a backend must declare to claim this spec (platform left open)."""
        return AttentionRequirements(
            head_size=self.head_dim,
            dtype=self.dtype,
            kv_cache_dtype=self.kv_cache_dtype,
            attn_type=AttentionType.parse(self.attn_type),
            logit_softcap=self.logit_softcap is not None,
            sinks=self.sinks,
            use_mla=self.mla is not None,
            sparse_mode=SPARSE_DSA if self.indexer is not None else SPARSE_NONE,
            block_size=self.block_size,
            kv_layout=KVLayout.parse(self.layout),
        )

    def geometry(self) -> AttentionGeometry:
        return AttentionGeometry(
            0,
            self.num_heads,
            self.head_dim,
            self.num_kv_heads,
            self.scale or self.head_dim**-0.5,
            AttentionType.parse(self.attn_type),
            self.sliding_window,
            self.chunk_size,
            self.logit_softcap,
            self.mla,
            self.indexer,
            sinks=self.sinks,
        )


MIXED = ((1, 20), (6, 0), (1, 33), (4, 10))
"""Decodes, a fresh prefill and a chunk of prefill after a context, in one step."""
SPECS = {
    "small_prefill": BatchSpec("small_prefill", ((9, 0), (5, 0))),
    "small_decode": BatchSpec("small_decode", ((1, 12), (1, 30), (1, 7))),
    "mixed_prefill_decode": BatchSpec("mixed_prefill_decode", MIXED),
    "long_decode": BatchSpec("long_decode", ((1, 300), (1, 517))),
    "uniform_decode": BatchSpec("uniform_decode", ((1, 40), (1, 40), (1, 40))),
    "gqa": BatchSpec("gqa", MIXED, num_heads=8, num_kv_heads=2),
    "mqa": BatchSpec("mqa", MIXED, num_heads=4, num_kv_heads=1),
    "head_80": BatchSpec("head_80", MIXED, head_dim=80),
    "head_128": BatchSpec("head_128", MIXED, head_dim=128),
    "head_256": BatchSpec("head_256", MIXED, head_dim=256),
    "sliding_window": BatchSpec("sliding_window", (*MIXED, (1, 70)), attn_type=AttentionType.SLIDING, sliding_window=8),
    "chunked": BatchSpec("chunked", (*MIXED, (3, 40)), attn_type=AttentionType.CHUNKED, chunk_size=16),
    "softcap": BatchSpec("softcap", MIXED, logit_softcap=5.0),
    "sinks": BatchSpec("sinks", (*MIXED, (1, 70)), num_heads=8, num_kv_heads=2, sinks=True),
    "sinks_decode": BatchSpec("sinks_decode", ((1, 12), (1, 30), (1, 7)), sinks=True),
    "sinks_sliding": BatchSpec(
        "sinks_sliding", (*MIXED, (1, 70)), attn_type=AttentionType.SLIDING, sliding_window=8, sinks=True
    ),
    "fp8_kv": BatchSpec("fp8_kv", MIXED, kv_cache_dtype="fp8_e4m3"),
    "block_32": BatchSpec("block_32", (*MIXED, (1, 70)), block_size=32),
    "block_64": BatchSpec("block_64", (*MIXED, (1, 70)), block_size=64),
    "hnd": BatchSpec("hnd", MIXED, layout="HND"),
    "hnd_decode": BatchSpec("hnd_decode", ((1, 12), (1, 30)), layout="HND"),
    "runs_decode": BatchSpec("runs_decode", ((1, 600), (1, 530)), contiguous_blocks=True),
    "runs_uniform_decode": BatchSpec("runs_uniform_decode", ((1, 520), (1, 520)), contiguous_blocks=True),
    "runs_sliding_decode": BatchSpec(
        "runs_sliding_decode",
        ((1, 600), (1, 530)),
        contiguous_blocks=True,
        attn_type=AttentionType.SLIDING,
        sliding_window=64,
    ),
    "runs_chunked_decode": BatchSpec(
        "runs_chunked_decode",
        ((1, 600), (1, 530)),
        contiguous_blocks=True,
        attn_type=AttentionType.CHUNKED,
        chunk_size=256,
    ),
    "runs_mixed": BatchSpec("runs_mixed", MIXED, contiguous_blocks=True),
    "encoder": BatchSpec("encoder", ((5, 0), (7, 0)), attn_type=AttentionType.ENCODER),
    "bf16": BatchSpec("bf16", MIXED, dtype="bfloat16"),
    "fp16": BatchSpec("fp16", MIXED, dtype="float16"),
}
_MLA = MLASpec(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24)
MLA_SPECS = {
    "mla": BatchSpec("mla", MIXED, num_heads=4, num_kv_heads=4, head_dim=48, mla=_MLA),
    "mla_fp8_hnd": BatchSpec(
        "mla_fp8_hnd",
        MIXED,
        num_heads=4,
        num_kv_heads=4,
        head_dim=48,
        mla=_MLA,
        kv_cache_dtype="fp8_e4m3",
        layout="HND",
    ),
    "mla_no_rope": BatchSpec(
        "mla_no_rope",
        ((1, 9), (3, 0)),
        num_heads=2,
        num_kv_heads=2,
        head_dim=16,
        mla=MLASpec(kv_lora_rank=8, qk_nope_head_dim=16, qk_rope_head_dim=0, v_head_dim=8),
    ),
    "mla_dsa": BatchSpec(
        "mla_dsa",
        MIXED,
        num_heads=4,
        num_kv_heads=4,
        head_dim=48,
        mla=_MLA,
        indexer=IndexerSpec(index_n_heads=2, index_head_dim=16, index_topk=8),
    ),
}
ALL_SPECS = {**SPECS, **MLA_SPECS, "custom_scale": BatchSpec("custom_scale", MIXED, scale=0.3)}
"""Every spec the kit runs by default. custom_scale (a softmax scale other than head_dim ** -0.5) stays out of
SPECS while kernelbay-torch's own dense loop (plugins/torch/tests/test_vanilla_reference.py) assumes the default
scale."""

TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2, "float16": 5e-3}
"""Max abs error per model dtype, relative to max(1, max |reference|)."""
INTEGER_KV_TOLERANCE = 0.06
"""For a backend whose cache tensor holds integers (int8 plus scales of its own, e.g. ACME_INT8): the reference
cannot reproduce that quantisation (~0.4% of a block's range per entry, before softmax)."""


def tolerance(spec: BatchSpec, cache_dtype=None) -> float:
    """Allowed max abs error (before scaling by the reference's magnitude); `cache_dtype`: the torch dtype of
    the cache tensor the backend allocated, when known."""
    tol = TOLERANCE[spec.dtype] * (20 if spec.kv_cache_dtype == "fp8_e4m3" and spec.dtype != "float32" else 1)
    if cache_dtype is not None and not cache_dtype.is_floating_point:
        tol = max(tol, INTEGER_KV_TOLERANCE)
    return tol


def select_specs(chosen=None) -> list[BatchSpec]:
    """Specs by name (or BatchSpec records); None: ALL_SPECS. An unknown name lists the known ones."""
    if chosen is None:
        return list(ALL_SPECS.values())
    from ..errors import UnknownNameError, unknown_name_message

    picked = []
    for item in chosen:
        if isinstance(item, BatchSpec):
            picked.append(item)
        elif item in ALL_SPECS:
            picked.append(ALL_SPECS[item])
        else:
            raise UnknownNameError(unknown_name_message("batch spec", item, ALL_SPECS))
    return picked
