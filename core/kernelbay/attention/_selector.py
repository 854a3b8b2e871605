"""Choosing an attention backend for a requirements record, with a reason for every candidate."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from .._trace import trace
from ..errors import ConfigError, UnknownNameError, unknown_name_message
from ._requirements import AttentionRequirements

BACKEND_ENV = "KERNELBAY_ATTENTION_BACKEND"


class BackendNotCapable(ConfigError):
    """The requested backend exists but lacks capabilities the layers need."""


class NoCapableBackend(ConfigError):
    """No installed backend can run these layers on this platform."""


@dataclass(frozen=True, slots=True)
class CandidateReport:
    """One backend the selector looked at and what it found."""

    name: str
    source: str
    """"platform priority" (listed by the platform) or "installed" (found through the registry)."""
    chosen: bool
    reason: str
    failures: tuple[str, ...] = ()
    """Every failed capability (or the import error); empty when capable."""

    @property
    def capable(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "chosen": self.chosen, "capable": self.capable,
                "reason": self.reason, "failures": list(self.failures)}


@dataclass(frozen=True, slots=True)
class SelectionResult:
    """The chosen backend and, for every candidate, why it was or was not chosen."""

    backend_name: str
    backend_cls: type = field(compare=False, repr=False)
    requirements: AttentionRequirements
    platform: str
    requested: str | None
    candidates: tuple[CandidateReport, ...]

    def to_dict(self) -> dict:
        return {"backend": self.backend_name, "platform": self.platform, "requested": self.requested,
                "requirements": self.requirements.to_dict(), "candidates": [c.to_dict() for c in self.candidates]}

    def explain(self) -> str:
        lines = [f"{self.backend_name} on {self.platform}" + (f" (requested)" if self.requested else "")]
        for c in self.candidates:
            mark = "*" if c.chosen else " "
            lines.append(f" {mark} {c.name:<12} {c.reason}")
            lines += [f"       - {f}" for f in c.failures]
        return "\n".join(lines)


def _resolve_platform(platform):
    from ..platforms import Platform, current_platform, get_platform

    if platform is None:
        return current_platform()
    return platform if isinstance(platform, Platform) else get_platform(str(platform))


def _candidate_order(priority: list[str], installed: list[str]) -> list[tuple[str, str]]:
    seen, order = set(), []
    for name, source in [(n, "platform priority") for n in priority] + [(n, "installed") for n in installed]:
        if name not in seen:
            seen.add(name)
            order.append((name, source))
    return order


def _ask(name: str, installed: set[str], req: AttentionRequirements) -> tuple[type | None, list[str]]:
    """Load one candidate and ask it every capability; failures to load are failures, not crashes."""
    if name not in installed:
        return None, ["not installed (no plugin provides it)"]
    from ..registry import resolve

    try:
        cls = resolve("attention_backend", name)
    except Exception as exc:  # noqa: BLE001 - a broken backend must not break selection of the others
        return None, [f"failed to import: {type(exc).__name__}: {exc}"]
    try:
        return cls, cls.capability_failures(req)
    except Exception as exc:  # noqa: BLE001
        return cls, [f"capability check raised {type(exc).__name__}: {exc}"]


@dataclass(frozen=True, slots=True)
class _Verdict:
    name: str
    source: str
    cls: type | None
    failures: tuple[str, ...]


def evaluate_candidates(req: AttentionRequirements, priority: tuple[str, ...],
                        installed: tuple[str, ...]) -> list[_Verdict]:
    """Every candidate (platform priority first, then every installed backend) with its failures."""
    order = _candidate_order(list(priority), list(installed))
    return [_Verdict(n, s, *_with_tuple(_ask(n, set(installed), req))) for n, s in order]


def _with_tuple(pair):
    cls, failures = pair
    return cls, tuple(failures)


def _requested_name(requested: str | None) -> str | None:
    return requested or os.environ.get(BACKEND_ENV) or None


def select_attention_backend(requirements: AttentionRequirements, requested: str | None = None,
                             platform=None) -> SelectionResult:
    """The backend for `requirements` on `platform` (default: the current one).

    `requested` (or KERNELBAY_ATTENTION_BACKEND) must be known and capable; there is no fallback.
    """
    plat = _resolve_platform(platform)
    req = requirements.with_platform(plat.name) if requirements.platform is None else requirements
    from ..registry import names

    return _select_cached(req, _requested_name(requested), plat.name, tuple(plat.backend_priority()),
                          tuple(names("attention_backend")))


@functools.lru_cache(maxsize=256)
def _select_cached(req: AttentionRequirements, requested: str | None, platform_name: str,
                   priority: tuple[str, ...], installed: tuple[str, ...]) -> SelectionResult:
    verdicts = evaluate_candidates(req, priority, installed)
    if requested is not None:
        winner = _check_requested(requested, verdicts, req)
    else:
        winner = next((v for v in verdicts if v.cls is not None and not v.failures), None)
        if winner is None:
            raise NoCapableBackend(f"no installed attention backend can run {_describe(req)} on {platform_name}",
                                   [f"{v.name}: {'; '.join(v.failures)}" for v in verdicts])
    result = SelectionResult(winner.name, winner.cls, req, platform_name, requested,
                             tuple(_report(v, winner.name, requested) for v in verdicts))
    trace("select attention backend %s for %s on %s", winner.name, _describe(req), platform_name)
    return result


def _check_requested(requested: str, verdicts: list[_Verdict], req: AttentionRequirements) -> _Verdict:
    from ..registry import names

    by_name = {v.name: v for v in verdicts}
    verdict = by_name.get(requested)
    if verdict is None or verdict.failures == ("not installed (no plugin provides it)",):
        raise UnknownNameError(unknown_name_message("attention backend", requested, names("attention_backend"))
                               + f" (requested via argument or {BACKEND_ENV})")
    if verdict.failures:
        raise BackendNotCapable(f"requested attention backend {requested} cannot run {_describe(req)}; "
                                f"failed capabilities:", verdict.failures)
    return verdict


def _report(v: _Verdict, winner: str, requested: str | None) -> CandidateReport:
    if v.name == winner:
        reason = "requested and capable" if requested else "first capable candidate in priority order"
        return CandidateReport(v.name, v.source, True, reason)
    if v.failures:
        return CandidateReport(v.name, v.source, False, "not capable", v.failures)
    reason = f"capable, but {winner} was requested" if requested else f"capable, but {winner} comes first"
    return CandidateReport(v.name, v.source, False, reason)


def _describe(req: AttentionRequirements) -> str:
    parts = [req.attn_type.value, f"head_size={req.head_size}", req.dtype, f"kv={req.kv_cache_dtype}"]
    parts += [flag for flag in ("use_mla", "logit_softcap") if getattr(req, flag)]
    return "layers (" + ", ".join(parts) + ")"


def clear_selection_cache() -> None:
    """Forget cached selections (after registering backends at runtime)."""
    _select_cached.cache_clear()
