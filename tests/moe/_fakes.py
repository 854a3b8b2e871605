"""MoE backends that are wrong on purpose, each in one way, built on TORCH_MOE: the kit must catch them."""

from __future__ import annotations

import dataclasses

import torch

from kernelbay.moe import MoEBackend
from kernelbay_torch.moe import TorchMoEBackend


class IgnoresBias(TorchMoEBackend):
    """Claims expert biases, computes without them."""

    name = "FAKE_IGNORES_BIAS"

    def _experts(self, x, topk_ids, topk_weights, weights):
        return super()._experts(
            x, topk_ids, topk_weights, dataclasses.replace(weights, gate_up_bias=None, down_bias=None)
        )


class AlwaysSilu(TorchMoEBackend):
    """Claims every activation, computes SiLU whatever the geometry says."""

    name = "FAKE_ALWAYS_SILU"

    def __init__(self, geometry, quant_config=None):
        super().__init__(geometry, quant_config)
        if geometry.activation != "swigluoai":
            self.geometry = dataclasses.replace(geometry, activation="silu")


class BuildsRefusedBias(TorchMoEBackend):
    """Refuses biases in its declarations, yet builds a biased layer instead of raising ValueError."""

    name = "FAKE_BUILDS_REFUSED_BIAS"
    bias = False

    def __init__(self, geometry, quant_config=None):
        self.geometry, self.quant_config = geometry, quant_config


class WrongShape(TorchMoEBackend):
    """Returns one row too few."""

    name = "FAKE_WRONG_SHAPE"

    def _experts(self, x, topk_ids, topk_weights, weights):
        return super()._experts(x, topk_ids, topk_weights, weights)[1:]


class DeclaresNothing(MoEBackend):
    """A backend that declares nothing: capable of nothing."""

    name = "FAKE_DECLARES_NOTHING"

    def _experts(self, x, topk_ids, topk_weights, weights):
        return torch.zeros_like(x)
