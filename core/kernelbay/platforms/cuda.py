"""The CUDA platform: current when torch sees a CUDA device."""

from __future__ import annotations

from . import Platform


class CudaPlatform(Platform):
    name = "cuda"
    device_type = "cuda"
    # FLASHINFER_MLA before VANILLA: the only CUDA backend besides the reference that runs MLA layers
    default_priority = ("FLASHINFER", "FLASHINFER_MLA", "SDPA", "FLEX", "VANILLA")

    def is_current(self) -> tuple[bool, str]:
        try:
            import torch
        except ImportError as exc:
            return False, f"torch is not importable: {exc}"
        if not torch.cuda.is_available():
            return False, f"torch {torch.__version__} sees no CUDA device"
        return True, f"{torch.cuda.device_count()} CUDA device(s): {torch.cuda.get_device_name(0)}"
