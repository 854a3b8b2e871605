"""What the engine says when an installed kernel fails while the model runs: which backend (and the distribution
that ships it), in which layer, at which engine step — a `BackendFailure` (exit code 13), never a bare traceback.

A layer turns its backend's exception into a `KernelRaised` (the backend named); the runner, which knows the
layer's name and the step, re-raises it located (`located`). Logits holding NaN or +inf are `non_finite_logits`,
naming every backend the step used: a kernel returning NaN would otherwise decode as garbage text, silently."""

from __future__ import annotations

from collections.abc import Iterable

from kernelbay_engine.errors import BackendFailure

_SLOT = {"attention": "attention_backend", "MoE": "moe_backend"}
_CHOOSE = {"attention": "attention_backend= (--backend NAME)", "MoE": "moe_backend= (--moe-backend NAME)"}


class KernelRaised(BackendFailure):
    """A backend's forward raised (`kind`: "attention" or "MoE"); `module` is the layer whose backend it is, which
    the runner names. Raised `from` the backend's exception."""

    def __init__(self, kind: str, backend: str, module: object, cause: BaseException):
        self.kind, self.backend, self.module, self.cause = kind, backend, module, cause
        super().__init__(f"{kind} backend {describe_backend(kind, backend)} raised {_cause(cause)}")


def located(err: KernelRaised, layer: str, step: str) -> BackendFailure:
    """`err` with the layer's name and the step it happened in, and what to do about it."""
    return BackendFailure(
        f"{err.kind} backend {describe_backend(err.kind, err.backend)} failed in layer {layer} at {step}: "
        f"{_cause(err.cause)}. The backend is at fault, not the model: report it to its distribution, or run "
        f"another with {_CHOOSE[err.kind]}; --trace (KERNELBAY_TRACE=1) shows the traceback"
    )


def non_finite_logits(step: str, backends: Iterable[tuple[str, str]]) -> BackendFailure:
    """The step's logits hold NaN or +inf; `backends` are the (kind, name) pairs the step ran."""
    named = "; ".join(f"{kind} {describe_backend(kind, name)}" for kind, name in backends)
    return BackendFailure(
        f"the logits of {step} are not finite (NaN or +inf), so no token can be sampled; the kernels in use: "
        f"{named}. A backend returned garbage: check it with `kernelbay check-backend NAME`, or run another "
        f"with {_CHOOSE['attention']} / {_CHOOSE['MoE']}"
    )


def describe_backend(kind: str, name: str) -> str:
    """`'SDPA' (kernelbay-torch 0.1.0, built-in)`: the name and the provider holding its registry slot."""
    from kernelbay.registry import default_registry

    slot = default_registry().slot(_SLOT[kind], name)
    if slot is None or slot.winner is None:
        return repr(name)
    provider = slot.winner.provider
    where = f"{provider.distribution} {provider.version}" if provider.distribution else provider.path or provider.module
    return f"{name!r} ({where}, {provider.origin})"


def _cause(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
