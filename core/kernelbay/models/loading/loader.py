"""Fill a model's parameters from a checkpoint, one tensor at a time, with a progress bar.

Parameters still on the `meta` device (the model was built with `MetaInitMode`) get real storage
just before their first tensor is read into them, so memory grows by exactly the weights.
"""

from __future__ import annotations

import logging
import sys
import time

import torch
from torch import nn
from tqdm.auto import tqdm

from .checkpoint import Checkpoint
from .plan import LoadPlan, NameRules, make_plan

logger = logging.getLogger("kernelbay.models")


def _materialize(model: nn.Module, param_path: str) -> torch.Tensor:
    """The parameter's tensor, given real (uninitialised) CPU storage if it is still on meta."""
    module_path, _, name = param_path.rpartition(".")
    module = model.get_submodule(module_path)
    param = module._parameters[name]
    if param.is_meta:
        param = nn.Parameter(torch.empty(param.shape, dtype=param.dtype), requires_grad=False)
        module._parameters[name] = param
    return param.data


def load_weights(model: nn.Module, checkpoint: Checkpoint, rules: NameRules = NameRules(), *,
                 progress: bool | None = None) -> LoadPlan:
    """Load every tensor the plan maps (the plan raises first if anything is missing or unexpected)."""
    plan = make_plan(model, checkpoint.names, rules)
    names = checkpoint.in_file_order(plan.assignments)
    total = sum(_nbytes(checkpoint, n) for n in names)
    show = sys.stderr.isatty() if progress is None else progress
    start = time.perf_counter()
    with checkpoint.reader() as reader, tqdm(total=total, unit="B", unit_scale=True, desc="Loading weights",
                                             disable=not show) as bar:
        for name in names:
            target = plan.assignments[name]
            dest = _materialize(model, target.param)
            reader.read_into(name, dest[target.index] if target.index else dest)
            bar.update(_nbytes(checkpoint, name))
    logger.info("loaded %d tensors (%.1f MB) from %s in %.2fs", len(names), total / 1e6, checkpoint.folder,
                time.perf_counter() - start)
    return plan


def _nbytes(checkpoint: Checkpoint, name: str) -> int:
    entry = checkpoint.entries.get(name)
    if entry is not None:
        return entry.nbytes
    t = checkpoint.pickled[name]
    return t.numel() * t.element_size()
