"""Checkpoint loading: find the files, plan which tensor goes where, read each straight into place."""

from kernelbay_engine.loading.checkpoint import Checkpoint, CheckpointError
from kernelbay_engine.loading.formats import CheckpointFormat, TensorReader, WeightSource, open_checkpoint
from kernelbay_engine.loading.loader import load_weights
from kernelbay_engine.loading.plan import LoadPlan, NameRules, Target

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointFormat",
    "TensorReader",
    "WeightSource",
    "LoadPlan",
    "NameRules",
    "Target",
    "load_weights",
    "open_checkpoint",
]
