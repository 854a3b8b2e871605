"""Checkpoint loading: find the files, plan which tensor goes where, read each straight into place."""

from .checkpoint import Checkpoint, CheckpointError, open_checkpoint
from .loader import load_weights
from .plan import LoadPlan, NameRules, Target

__all__ = ["Checkpoint", "CheckpointError", "LoadPlan", "NameRules", "Target", "load_weights", "open_checkpoint"]
