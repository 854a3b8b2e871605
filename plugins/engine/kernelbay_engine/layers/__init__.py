"""Building blocks shared by model families: norms, rotary embeddings, linear layers, MLPs."""

from kernelbay_engine.layers.activation import GatedMLP, activation
from kernelbay_engine.layers.linear import ExpertLinear, Linear, MergedLinear
from kernelbay_engine.layers.norm import RMSNorm
from kernelbay_engine.layers.rotary import RopeParams, RotaryEmbedding, yarn_mscale

__all__ = [
    "ExpertLinear",
    "GatedMLP",
    "Linear",
    "MergedLinear",
    "RMSNorm",
    "RopeParams",
    "RotaryEmbedding",
    "activation",
    "yarn_mscale",
]
