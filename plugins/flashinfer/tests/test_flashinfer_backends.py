"""FLASHINFER and FLASHINFER_MLA driven through their real code on CPU, with FlashInfer's wrappers replaced
by the documented-API stand-in in fake_flashinfer.py: each path against VANILLA, and one plan per step."""

from __future__ import annotations

import pytest
import torch

from kernelbay.attention import MLASpec, create_attention
from tests.attention._harness import MIXED, SPECS, BatchSpec, assert_close, run_backend

from . import fake_flashinfer

# The specs FlashInfer claims, in the dtypes it computes in (it has no float32 kernels).
FLASHINFER_SPECS = {
    name: SPECS[name].but(dtype=dtype)
    for name, dtype in (
        ("small_prefill", "bfloat16"),
        ("small_decode", "float16"),
        ("mixed_prefill_decode", "bfloat16"),
        ("long_decode", "bfloat16"),
        ("gqa", "float16"),
        ("mqa", "bfloat16"),
        ("head_128", "bfloat16"),
        ("head_256", "float16"),
        ("sliding_window", "bfloat16"),
        ("softcap", "float16"),
        ("fp8_kv", "bfloat16"),
        ("block_32", "float16"),
        ("hnd", "bfloat16"),
        ("hnd_decode", "float16"),
    )
}
MLA_SPEC = BatchSpec(
    "mla_512_64",
    MIXED,
    num_heads=2,
    num_kv_heads=2,
    head_dim=96,
    dtype="bfloat16",
    mla=MLASpec(kv_lora_rank=512, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32),
)


@pytest.fixture
def fake(monkeypatch, make_registry):
    make_registry()
    fake_flashinfer.install(monkeypatch)
    from kernelbay_flashinfer.plans import forget_wrappers

    forget_wrappers()
    yield fake_flashinfer
    forget_wrappers()


@pytest.mark.parametrize("spec_name", list(FLASHINFER_SPECS))
def test_flashinfer_matches_vanilla(fake, spec_name):
    """[FLASHINFER] equals VANILLA on every batch spec it claims (prefill, decode and mixed paths)."""
    spec = FLASHINFER_SPECS[spec_name]
    assert_close("FLASHINFER", spec, run_backend("FLASHINFER", spec), run_backend("VANILLA", spec))


def test_decode_only_steps_use_the_decode_wrapper(fake):
    """A step where every request adds one token plans the decode wrapper; any longer query, the prefill one."""
    run_backend("FLASHINFER", FLASHINFER_SPECS["small_decode"])
    run_backend("FLASHINFER", FLASHINFER_SPECS["mixed_prefill_decode"])
    assert [kind for kind, _ in fake.PLAN_CALLS] == ["decode", "prefill"]


def test_flashinfer_mla_matches_vanilla(fake):
    """[FLASHINFER_MLA] (absorbed weights, latent cache) equals VANILLA's naive MLA."""
    assert_close("FLASHINFER_MLA", MLA_SPEC, run_backend("FLASHINFER_MLA", MLA_SPEC), run_backend("VANILLA", MLA_SPEC))


def _layer(idx, cls, **geometry):
    layer = create_attention(idx, 4, 64, 2, backend=cls, **geometry)
    layer.attach_kv_cache(layer.kv_cache_spec("bfloat16", 16).allocate(8))
    return layer


def test_one_plan_per_step_and_geometry(fake):
    """Layers sharing a geometry share one plan per step; a sliding-window layer gets its own plan."""
    from kernelbay_flashinfer.backend import FlashInferBackend

    layers = [
        _layer(0, FlashInferBackend),
        _layer(1, FlashInferBackend),
        _layer(2, FlashInferBackend, attn_type="sliding_attention", sliding_window=4),
    ]
    for step in range(2):
        md = FlashInferBackend.prepare([(3, step * 3, [0, 1]), (2, step * 2, [2])], 16)
        q, kv = torch.randn(5, 4, 64, dtype=torch.bfloat16), torch.randn(5, 2, 64, dtype=torch.bfloat16)
        for layer in layers:
            layer.forward(q, kv, kv, md)
    windows = [args["window_left"] for _, args in fake.PLAN_CALLS]
    assert windows == [-1, 3, -1, 3]


def test_mla_refuses_dimensions_the_kernel_lacks(sites):
    """FLASHINFER_MLA builds only for kv_lora_rank 512 / rope 64, and says so at construction."""
    from kernelbay_flashinfer.mla import FlashInferMLABackend

    small = MLASpec(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24)
    with pytest.raises(ValueError, match=r"compiled for kv_lora_rank=512 and qk_rope_head_dim=64.*kv_lora_rank=32"):
        create_attention(0, 4, 48, 4, backend=FlashInferMLABackend, mla=small, kv_b_proj=torch.nn.Identity())
