"""The aten ops a call dispatches, by name ("aten.mul.Tensor"): what tests of a fused or folded path assert on."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class DispatchedOps(TorchDispatchMode):
    """`with DispatchedOps() as ops: ...` records every op dispatched inside in `ops.names`."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def dispatched(fn, *args) -> list[str]:
    """The ops `fn(*args)` dispatches."""
    with DispatchedOps() as ops:
        fn(*args)
    return ops.names
