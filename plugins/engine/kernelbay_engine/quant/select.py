"""Which kernel runs a quantized linear: the first capable and available one, with a reason for every candidate."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from kernelbay.errors import ConfigError
from kernelbay_engine.quant.kernels import KERNEL_NAMES, KERNELS, LinearKernel, LinearRequirements


@dataclass(frozen=True, slots=True)
class Candidate:
    name: str
    chosen: bool
    capable: bool
    reason: str
    failures: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "chosen": self.chosen,
            "capable": self.capable,
            "reason": self.reason,
            "failures": list(self.failures),
        }


@dataclass(frozen=True, slots=True)
class KernelChoice:
    kernel: type[LinearKernel]
    candidates: tuple[Candidate, ...]


def _verdict(kernel: type[LinearKernel], req: LinearRequirements) -> tuple[list[str], str]:
    failures = kernel.failures(req)
    ok, why = kernel.is_available()
    if not ok:
        failures = [*failures, f"not available: {why}"]
    return failures, why


@functools.cache
def select_kernel(req: LinearRequirements, requested: str | None = None) -> KernelChoice:
    """The kernel for `req`: `requested` if capable (else a ConfigError naming why), or the first capable one."""
    if requested is not None and requested not in KERNEL_NAMES:
        raise ConfigError(f"unknown linear kernel {requested!r}: valid kernels are {', '.join(KERNEL_NAMES)}")
    verdicts = [(k, *_verdict(k, req)) for k in KERNELS]
    pool = [v for v in verdicts if requested in (None, v[0].name)]
    chosen = next((k for k, failures, _ in pool if not failures), None)
    if chosen is None:  # only a requested kernel can be missing: the dense one always runs
        failures = pool[0][1]
        raise ConfigError(f"linear kernel {requested!r} cannot run this layer", failures)
    candidates = tuple(_candidate(k, failures, why, k is chosen, requested) for k, failures, why in verdicts)
    return KernelChoice(chosen, candidates)


def _candidate(kernel, failures: list[str], why: str, chosen: bool, requested: str | None) -> Candidate:
    if chosen:
        reason = "requested" if requested else "chosen"
        reason += f": {why}" if kernel.name != "dense" else ": plain weights in the model dtype"
    elif failures:
        reason = "not capable"
    else:
        reason = "capable, not requested" if requested else "capable, a preferred kernel was chosen"
    return Candidate(kernel.name, chosen, not failures, reason, tuple(failures))
