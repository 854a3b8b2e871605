"""The CPU platform: always present."""

from __future__ import annotations

from . import Platform


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    # Decided by benchmarks/attention.py (benchmarks/RESULTS-attention.md); SDPA serves what CPU_PAGED refuses.
    default_priority = ("CPU_PAGED", "SDPA", "VANILLA", "FLEX")
    # benchmarks/moe.py: the grouped kernel beats the per-expert loop at every token count measured.
    moe_priority = ("TORCH_GROUPED_MOE", "TORCH_MOE")

    def is_current(self) -> tuple[bool, str]:
        return True, "a CPU is always present (used when no accelerator platform is current)"
