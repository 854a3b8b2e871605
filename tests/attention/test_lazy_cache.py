"""KVCacheSpec.allocate: a zeroed cache whose untouched pages are not resident (a large cache costs as it fills)."""

from __future__ import annotations

import torch

from kernelbay.attention import KVCacheSpec


def _rss_mib() -> int:
    """This process's resident memory (psutil may not be installed)."""
    with open("/proc/self/status") as status:
        return int(next(row for row in status if row.startswith("VmRSS:")).split()[1]) // 1024


def test_a_256mib_cache_is_zero_and_not_resident_until_written():
    """256 MiB allocated costs well under 32 MiB resident; every slot reads 0, writes land, stride order holds."""
    spec = KVCacheSpec(num_kv_heads=8, head_dim=128, dtype="bfloat16", stride_order=(0, 3, 1, 2, 4))
    before = _rss_mib()
    cache = spec.allocate(2048)
    assert _rss_mib() - before < 32
    assert cache.shape == spec.cache_shape(2048) and cache.dtype == torch.bfloat16
    assert cache.permute(0, 3, 1, 2, 4).is_contiguous()  # heads outermost after the plane, as stride_order says
    assert cache[:, ::97].abs().sum().item() == 0  # reads of untouched (padding) slots are zeros, not garbage
    cache[1, 2047, 15, 7] = 3.0
    assert cache[1, 2047, 15, 7, 0].item() == 3.0 and cache[1, 2047, 15, 6].abs().sum().item() == 0


def test_small_and_fp8_caches_are_zeroed():
    """Small caches (plain torch.zeros) and fp8 storage read zero too."""
    for spec, blocks in ((KVCacheSpec(2, 16, "float32"), 4), (KVCacheSpec(8, 128, "fp8_e4m3"), 1024)):
        cache = spec.allocate(blocks)
        assert cache.shape == spec.cache_shape(blocks) and cache.float().abs().sum().item() == 0
