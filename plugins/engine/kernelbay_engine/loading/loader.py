"""Fill a model's parameters from a checkpoint, one tensor at a time, with a progress bar.

Parameters still on the `meta` device (the model was built with `MetaInitMode`) get real storage
just before their first tensor is read into them, so memory grows by exactly the weights.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

import torch
from torch import nn
from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no stubs (types-tqdm is not installed)

from kernelbay_engine.loading.errors import CheckpointError
from kernelbay_engine.loading.formats import WeightSource
from kernelbay_engine.loading.plan import LoadPlan, NameRules, SourcePiece, make_plan
from kernelbay_engine.loading.safetensors_file import SHAPE_HINT, shape_mismatch

logger = logging.getLogger("kernelbay.models")


@contextlib.contextmanager
def _progress_bar(total: int, show: bool) -> Iterator[Callable[[int], object]]:
    """`advance(nbytes)` of a tqdm bar over `total` bytes, or of nothing when it is not shown: a tqdm made even
    disabled takes a multiprocessing lock and starts its monitor thread."""
    if not show:
        yield lambda nbytes: None
        return
    with tqdm(total=total, unit="B", unit_scale=True, desc="Loading weights") as bar:
        yield bar.update


def _slot(model: nn.Module, param_path: str) -> tuple[nn.Module, str]:
    module_path, _, name = param_path.rpartition(".")
    return model.get_submodule(module_path), name


def _param(module: nn.Module, name: str) -> nn.Parameter:
    param = module._parameters[name]
    assert param is not None  # the plan maps only named_parameters(), which skips None slots
    return param


def _materialize(model: nn.Module, param_path: str) -> torch.Tensor:
    """The parameter's tensor, given real (uninitialised) CPU storage if it is still on meta."""
    module, name = _slot(model, param_path)
    param = _param(module, name)
    if param.is_meta:
        param = nn.Parameter(torch.empty(param.shape, dtype=param.dtype), requires_grad=False)
        module._parameters[name] = param
    return param.data


def _map_whole(model: nn.Module, reader, name: str, target) -> bool:
    """mmap mode: make a still-unallocated parameter a view of the file itself; False if it cannot be."""
    module, attr = _slot(model, target.param)
    param = _param(module, attr)
    if target.index or target.transposed or target.source or not param.is_meta:
        return False
    mapped = reader.mapped(name, param.dtype)
    if mapped is None or tuple(mapped.shape) != tuple(param.shape):
        return False
    module._parameters[attr] = nn.Parameter(mapped, requires_grad=False)
    return True


def _load_one(model: nn.Module, reader, name: str, target, mmap: bool) -> None:
    if mmap and _map_whole(model, reader, name, target):
        loaded = _slot_tensor(model, target.param)
    else:
        dest = _materialize(model, target.param)
        loaded = dest[target.index] if target.index else dest
        stored = loaded.t() if target.transposed else loaded  # in the checkpoint's layout
        if not target.source:
            reader.read_into(name, stored)
        for piece in target.source:  # a rank's share: only its slices are read
            part = stored.narrow(piece.dim, piece.dest_start, piece.length)
            reader.read_slice_into(name, part, piece.dim, piece.start)
    if not _all_finite(loaded):
        raise CheckpointError(
            f"{name} in {reader.checkpoint.folder} holds NaN or infinite values (as {loaded.dtype}); "
            f"the checkpoint is corrupt, or its values overflow the requested dtype"
        )


def _slot_tensor(model: nn.Module, param_path: str) -> torch.Tensor:
    module, name = _slot(model, param_path)
    return _param(module, name).data


_FINITE_CHUNK = 1 << 22  # elements per reduction: bounds the float16 copy an fp8 chunk needs


def _all_finite(t: torch.Tensor) -> bool:
    """No NaN/inf in a float tensor (one pass, in chunks); integer tensors are always finite.

    min/max propagate NaN and surface +-inf, so one aminmax reduction answers it without the bool mask
    `isfinite(...).all()` writes (10x faster: it keeps the check a small part of a load)."""
    if not t.is_floating_point() or t.numel() == 0:  # an empty tensor holds no NaN (and aminmax refuses it)
        return True
    for chunk in t.reshape(-1).split(_FINITE_CHUNK):
        if chunk.element_size() == 1:  # no float8 kernels; float16 keeps NaN and every fp8 value
            chunk = chunk.to(torch.float16)
        low, high = torch.aminmax(chunk)
        if not (bool(torch.isfinite(low)) and bool(torch.isfinite(high))):
            return False
    return True


def _check_shapes(model: nn.Module, checkpoint: WeightSource, plan: LoadPlan) -> None:
    """Whole-parameter tensors of the wrong shape, all named before any byte is read."""
    params = dict(model.named_parameters(remove_duplicate=False))
    wrong = [
        shape_mismatch(name, checkpoint.shape(name), _stored_shape(params[t.param], t))
        for name, t in plan.assignments.items()
        if not t.index
        and not t.source
        and t.param in params
        and tuple(checkpoint.shape(name)) != _stored_shape(params[t.param], t)
    ]
    if wrong:
        raise CheckpointError("\n".join([*wrong, SHAPE_HINT]))


def _check_dtypes(model: nn.Module, checkpoint: WeightSource, plan: LoadPlan) -> None:
    """Integer or bool tensors where the model holds floats (or another integer type where it holds codes), all
    named before any byte is read: a cast would load them silently as other numbers. Integer weights are only the
    codes of a quantized format, whose layers hold exactly the stored dtype (MXFP4's uint8 blocks and scales)."""
    stored = getattr(checkpoint, "dtype", None)  # formats that dequantize as they read (GGUF) declare none
    if stored is None:
        return
    params = dict(model.named_parameters(remove_duplicate=False))
    wrong = [
        f"{name} is stored as {_dtype_name(stored(name))} where the model holds {_dtype_name(params[t.param].dtype)}"
        for name, t in plan.assignments.items()
        if t.param in params and not _loadable_as(stored(name), params[t.param].dtype)
    ]
    if wrong:
        listed = "; ".join(wrong[:5]) + (f"; and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        raise CheckpointError(
            f"{checkpoint.folder}: {listed}. Integer weights are only the codes of a quantized format that "
            "config.json's quantization_config declares, held as stored (MXFP4's uint8 blocks and scales); "
            "re-convert the checkpoint with float weights"
        )


def _loadable_as(stored: torch.dtype, held: torch.dtype) -> bool:
    """A float read into any float dtype (a cast); codes (integers, bool) only into exactly their own dtype."""
    return stored.is_floating_point if held.is_floating_point else stored == held


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _stored_shape(param: torch.Tensor, target) -> tuple[int, ...]:
    """The shape the checkpoint must hold for `param` (reversed for a transposed, [in, out] weight)."""
    return tuple(reversed(param.shape)) if target.transposed else tuple(param.shape)


def load_weights(
    model: nn.Module,
    checkpoint: WeightSource,
    rules: NameRules = NameRules(),
    *,
    progress: bool | None = None,
    mmap: bool = False,
    sources: Mapping[str, tuple[SourcePiece, ...]] | None = None,
) -> LoadPlan:
    """Load every tensor the plan maps (the plan raises first if anything is missing or unexpected).

    `mmap=True`: tensors that map 1:1 onto a parameter in the same dtype become copy-on-write views of
    the file (paged in on first use, shared with the page cache); fused, sliced or cast ones are read.
    Only for checkpoints nobody rewrites while the model lives: untouched pages follow the file.
    Every float tensor is checked for NaN/inf once as it loads (in mmap mode too: that pages the file in once).
    `sources`: a tensor-parallel rank's share, by model-side name (the checkpoint name after the family's renames):
    the pieces of that tensor it reads (kernelbay_engine.distributed.sharding); the others are read whole.
    """
    plan = make_plan(model, checkpoint.names, rules)
    if sources:
        plan.assignments = {
            name: replace(t, source=sources.get(rules.rename(name), ())) for name, t in plan.assignments.items()
        }
    _check_shapes(model, checkpoint, plan)
    _check_dtypes(model, checkpoint, plan)
    names = checkpoint.in_file_order(plan.assignments)
    total = sum(checkpoint.nbytes_of(n) for n in names)
    show = sys.stderr.isatty() if progress is None else progress
    start = time.perf_counter()
    with checkpoint.reader() as reader, _progress_bar(total, show) as advance:
        for name in names:
            _load_one(model, reader, name, plan.assignments[name], mmap)
            advance(checkpoint.nbytes_of(name))
    logger.info(
        "loaded %d tensors (%.1f MB) from %s in %.2fs",
        len(names),
        total / 1e6,
        checkpoint.folder,
        time.perf_counter() - start,
    )
    return plan
