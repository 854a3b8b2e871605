"""Whether FlashInfer can run in this process, and exactly why not: the answer `is_available()` gives."""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

MIN_CAPABILITY = (8, 0)
"""Ampere or newer: the bf16 kernels kernelbay-flashinfer uses need sm80."""
INSTALL_HINT = "pip install flashinfer-python (https://docs.flashinfer.ai/installation.html)"


@dataclass(frozen=True, slots=True)
class CudaEnvironment:
    """What availability depends on, probed once per process (or built by hand in tests)."""

    flashinfer_installed: bool
    cuda_devices: int = 0
    capability: tuple[int, int] | None = None
    """Compute capability of device 0, e.g. (9, 0) for an H100."""
    device_name: str | None = None
    torch_version: str = ""
    import_error: str | None = None
    """Set when flashinfer is installed but `import flashinfer` fails (ABI, CUDA mismatch, ...)."""

    def __post_init__(self):
        if self.cuda_devices < 0:
            raise ValueError(f"cuda_devices must be >= 0, got {self.cuda_devices}")
        if self.cuda_devices and self.capability is None:
            raise ValueError("a CUDA environment with devices needs the compute capability of device 0")


def availability(env: CudaEnvironment) -> tuple[bool, str]:
    """(True, what runs) or (False, the first thing missing), checked in the order a user fixes them."""
    if not env.flashinfer_installed:
        return False, f"flashinfer is not installed: {INSTALL_HINT}"
    if env.cuda_devices == 0:
        return False, f"no CUDA device: torch {env.torch_version} sees no GPU (FlashInfer runs on NVIDIA GPUs only)"
    if env.capability < MIN_CAPABILITY:
        have, need = ".".join(map(str, env.capability)), ".".join(map(str, MIN_CAPABILITY))
        return False, (
            f"compute capability {have} of {env.device_name} is below {need}: "
            f"kernelbay-flashinfer needs an Ampere or newer GPU"
        )
    if env.import_error is not None:
        return False, f"flashinfer is installed but failed to import: {env.import_error}"
    sm = f"sm{env.capability[0]}{env.capability[1]}"
    return True, f"flashinfer on {env.cuda_devices} CUDA device(s), {env.device_name} ({sm})"


def _import_error() -> str | None:
    try:
        import flashinfer  # noqa: F401 - the import itself is the check
    except Exception as exc:  # noqa: BLE001 - any failure is the reason FlashInfer is unavailable
        return f"{type(exc).__name__}: {exc}"
    return None


@functools.lru_cache(maxsize=1)
def probe() -> CudaEnvironment:
    """This process's environment; flashinfer is imported only when a capable GPU is present."""
    import torch

    installed = importlib.util.find_spec("flashinfer") is not None
    if not torch.cuda.is_available():
        return CudaEnvironment(installed, torch_version=torch.__version__)
    capability = tuple(torch.cuda.get_device_capability(0))
    env = CudaEnvironment(
        installed, torch.cuda.device_count(), capability, torch.cuda.get_device_name(0), torch.__version__
    )
    if installed and capability >= MIN_CAPABILITY:
        return CudaEnvironment(**{**_fields(env), "import_error": _import_error()})
    return env


def current_availability() -> tuple[bool, str]:
    """What the backends' `is_available()` answers in this process."""
    return availability(probe())


def _fields(env: CudaEnvironment) -> dict:
    return {name: getattr(env, name) for name in CudaEnvironment.__dataclass_fields__}
