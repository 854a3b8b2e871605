"""Build a module tree without allocating weights: a `TorchDispatchMode` that puts new tensors on `meta`.

Inside `MetaInitMode`:
- factory ops (`torch.empty`, `zeros`, `ones`, `randn`, `arange`, ...) create `meta` tensors;
- in-place random/constant init ops (`normal_`, `uniform_`, `zero_`, `fill_`, ...) and view/metadata
  ops on meta tensors are allowed (they cost nothing and mean nothing on meta);
- any other op touching a meta tensor raises `MetaInitUnsupported`, because its result would silently
  be garbage (e.g. a buffer computed in `__init__`).

`build_module(factory)` tries meta first and, on `MetaInitUnsupported`, logs why and builds normally.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

logger = logging.getLogger("kernelbay.models")
M = TypeVar("M")
aten = torch.ops.aten

# In-place initialisers: fine on meta (nothing to fill).
_INIT_OPS = {
    "normal_",
    "uniform_",
    "zero_",
    "fill_",
    "bernoulli_",
    "random_",
    "exponential_",
    "geometric_",
    "log_normal_",
    "cauchy_",
    "trunc_normal_",
    "ones_like",
    "zeros_like",
    "empty_like",
    "full_like",
}
# Shape/metadata-only ops: their result is fully defined on meta.
_VIEW_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "select",
    "slice",
    "as_strided",
    "t",
    "transpose",
    "permute",
    "detach",
    "alias",
    "unsqueeze",
    "squeeze",
    "expand",
    "narrow",
    "unbind",
    "split",
    "chunk",
    "_to_copy",
    "clone",
    "set_",
    "lift_fresh",
    "_has_compatible_shallow_copy_type",
    "requires_grad_",
    "empty_strided",
}


class MetaInitUnsupported(RuntimeError):
    """An op during meta construction needs real values; the caller should build normally instead."""


def _op_name(func) -> str:
    return func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)


class MetaInitMode(TorchDispatchMode):
    """See the module docstring. Counts what it intercepted (`created`) for tests and traces."""

    def __init__(self):
        super().__init__()
        self.created = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Model construction never runs under torch.compile; opting out (the hook TorchDispatchMode
        # documents) keeps the first build from importing torch._dynamo, seconds of start-up on a CPU box.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        name = _op_name(func)
        if not tensors and "device" in _schema_kwargs(func):
            kwargs["device"] = torch.device("meta")
            self.created += 1
            return func(*args, **kwargs)
        touches_meta = any(t.is_meta for t in tensors)
        if touches_meta and name not in _INIT_OPS and name not in _VIEW_OPS:
            raise MetaInitUnsupported(f"aten.{name} needs tensor values during module construction")
        if touches_meta and name == "_to_copy" and kwargs.get("device") not in (None, torch.device("meta")):
            raise MetaInitUnsupported("moving a meta tensor to a real device during module construction")
        return func(*args, **kwargs)


def _schema_kwargs(func) -> set[str]:
    return {a.name for a in func._schema.arguments if a.kwarg_only}


def build_module(factory: Callable[[], M], *, meta: bool = True) -> tuple[M, bool]:
    """Run `factory()` under `MetaInitMode` (if `meta`); returns (module, built_on_meta).

    Falls back to a normal build, with one INFO log line saying which op forced it.
    """
    if meta:
        try:
            with MetaInitMode():
                return factory(), True
        except MetaInitUnsupported as why:
            logger.info("meta-device init not possible (%s); building the model with real tensors", why)
    return factory(), False
