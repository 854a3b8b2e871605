"""Kernel backends that fail at run time, each in one way: a first-party backend's capabilities, a broken forward."""

import torch

from kernelbay_torch.moe import TorchMoEBackend
from kernelbay_torch.vanilla import VanillaBackend


class RaisesInLayerOne(VanillaBackend):
    """Raises from the second attention layer on, at the first step."""

    name = "FAULTY_RAISES"

    def _attend(self, q, md, args):
        if self.geometry.layer_idx >= 1:
            raise RuntimeError("vendor kernel: illegal memory access")
        return super()._attend(q, md, args)


class RaisesOnDecode(VanillaBackend):
    """Prefill works; the first decode-only step raises."""

    name = "FAULTY_DECODE"

    def _attend(self, q, md, args):
        if md.is_decode_only:
            raise RuntimeError("decode kernel not implemented")
        return super()._attend(q, md, args)


class ReturnsNaN(VanillaBackend):
    """Returns NaN everywhere: the model would decode garbage."""

    name = "FAULTY_NAN"

    def _attend(self, q, md, args):
        return torch.full_like(super()._attend(q, md, args), float("nan"))


class MoERaises(TorchMoEBackend):
    """TORCH_MOE's capabilities; its expert kernel raises."""

    name = "FAULTY_MOE"

    def _experts(self, x, topk_ids, topk_weights, weights):
        raise IndexError("expert kernel: routing table out of range")
