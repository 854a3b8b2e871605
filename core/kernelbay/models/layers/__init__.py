"""Building blocks shared by model families: norms, rotary embeddings, linear layers, MLPs."""

from .activation import GatedMLP, activation
from .linear import ExpertLinear, Linear, MergedLinear
from .norm import RMSNorm
from .rotary import RopeParams, RotaryEmbedding, yarn_mscale

__all__ = ["ExpertLinear", "GatedMLP", "Linear", "MergedLinear", "RMSNorm", "RopeParams", "RotaryEmbedding",
           "activation", "yarn_mscale"]
