"""kernelbay-llama's tests: its architectures against transformers, on the tiny checkpoints of tests/models."""

from __future__ import annotations

import pytest

from tests.models.conftest import _one_thread, loaded, loaded_moe, tiny_checkpoints  # noqa: F401  (fixtures)


@pytest.fixture
def dense_only_moe_kernels(monkeypatch):
    """Both CPU MoE kernels declare dense expert weights only (so a stored format must be dequantized at load);
    the selection cache is cleared on the way in and once the declarations are restored."""
    from kernelbay.attention import clear_selection_cache
    from kernelbay_torch.moe import TorchGroupedMoEBackend, TorchMoEBackend

    for cls in (TorchMoEBackend, TorchGroupedMoEBackend):
        monkeypatch.setattr(cls, "expert_formats", frozenset({"dense"}))
    clear_selection_cache()
    yield
    monkeypatch.undo()
    clear_selection_cache()
