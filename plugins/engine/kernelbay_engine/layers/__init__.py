"""Building blocks shared by model families: norms, position embeddings (rotary, learned), linear layers, MLPs."""

from kernelbay_engine.layers.activation import MLP, GatedMLP, activation
from kernelbay_engine.layers.linear import ExpertLinear, Linear, MergedLinear
from kernelbay_engine.layers.norm import LayerNorm, RMSNorm
from kernelbay_engine.layers.positions import LearnedPositionEmbedding
from kernelbay_engine.layers.rotary import RopeParams, RotaryEmbedding, yarn_mscale

__all__ = [
    "ExpertLinear",
    "GatedMLP",
    "LayerNorm",
    "LearnedPositionEmbedding",
    "Linear",
    "MLP",
    "MergedLinear",
    "RMSNorm",
    "RopeParams",
    "RotaryEmbedding",
    "activation",
    "yarn_mscale",
]
