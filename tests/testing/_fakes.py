"""Backends that are wrong on purpose, each in one way, built on VANILLA at runtime: the kit must catch them."""

from __future__ import annotations

import dataclasses

import torch

from kernelbay_torch.vanilla import VanillaBackend


class IgnoresSoftcap(VanillaBackend):
    """Claims logit soft-capping, attends without it."""

    name = "FAKE_IGNORES_SOFTCAP"

    def _attend_one(self, q, k, v, mask, sinks=None):
        scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * self.geometry.scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1).nan_to_num(0.0), v.float())


class WindowOffByOne(VanillaBackend):
    """Sees one key too many under a sliding window (`q - k <= window`, the classic convention slip)."""

    name = "FAKE_WINDOW_OFF_BY_ONE"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.geometry.sliding_window is not None:
            self.geometry = dataclasses.replace(self.geometry, sliding_window=self.geometry.sliding_window + 1)


class CrashesOnDecode(VanillaBackend):
    """Raises on decode-only steps."""

    name = "FAKE_CRASHES_ON_DECODE"

    def _attend(self, q, md, args):
        if md.is_decode_only:
            raise RuntimeError("decode kernel not implemented")
        return super()._attend(q, md, args)


class BuildsRefusedGeometry(VanillaBackend):
    """Refuses soft-capping, yet builds a soft-capped layer instead of raising ValueError."""

    name = "FAKE_BUILDS_REFUSED"
    logit_softcap = False

    def _refuse_unsupported_geometry(self) -> None:
        pass


class TwoFaced(VanillaBackend):
    """Refuses soft-capping when asked directly, accepts it when the selector asks (with a platform)."""

    name = "FAKE_TWO_FACED"
    logit_softcap = False

    @classmethod
    def capability_failures(cls, req, fields=None):
        return [] if req.platform is not None else super().capability_failures(req, fields)


class Unavailable(VanillaBackend):
    """Installed, but its kernels cannot run here."""

    name = "FAKE_UNAVAILABLE"

    @classmethod
    def is_available(cls):
        return False, "libfake.so not found"


class ClaimsNothing(VanillaBackend):
    """Declares no head size, so it claims no spec at all."""

    name = "FAKE_CLAIMS_NOTHING"
    head_sizes = frozenset()
