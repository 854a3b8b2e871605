"""The selector: a kernel per layer group (attention backends, MoE kernels), with a reason for every candidate.

One selection path and one cache: `select_attention_backend` is the one-group case of
`select_for_layer_groups`. Its only input is requirement records (the engine builds them from a model's
config); it knows nothing of model configs."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .._trace import trace, warn
from ..errors import IncapableBackend, UnknownBackend, unknown_name_message
from ._capabilities import KERNEL_KINDS, AttentionRequirements

_NOT_INSTALLED = "not installed (no plugin provides it)"


class BackendNotCapable(IncapableBackend):
    """The requested backend exists but lacks capabilities the layers need."""


class NoCapableBackend(IncapableBackend):
    """No installed backend can run these layers on this platform. `groups`: per layer group, its
    SelectionResult (None where nothing can run it) and every candidate's report."""

    def __init__(self, message: str, violations=(), groups: tuple = ()):
        super().__init__(message, violations)
        self.groups = groups


@dataclass(frozen=True, slots=True)
class CandidateReport:
    """One backend the selector looked at and what it found."""

    name: str
    source: str  # "platform priority" (listed by the platform) or "installed" (found through the registry)
    chosen: bool
    reason: str
    failures: tuple[str, ...] = ()  # every failed capability (or the import error); empty when capable
    backend_cls: type | None = field(default=None, compare=False, repr=False)

    @property
    def capable(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "chosen": self.chosen,
            "capable": self.capable,
            "reason": self.reason,
            "failures": list(self.failures),
        }


@dataclass(frozen=True, slots=True)
class SelectionResult:
    """The chosen backend and, for every candidate, why it was or was not chosen."""

    backend_name: str
    backend_cls: type = field(compare=False, repr=False)
    requirements: Any  # AttentionRequirements, or kernelbay.moe.MoERequirements for an MoE selection
    platform: str
    requested: str | None
    candidates: tuple[CandidateReport, ...]

    def to_dict(self) -> dict:
        return {
            "backend": self.backend_name,
            "platform": self.platform,
            "requested": self.requested,
            "requirements": self.requirements.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }


@dataclass(frozen=True, slots=True)
class LayerGroupSelection:
    """One SelectionResult per layer group; `shared` when a single backend serves every group."""

    groups: tuple[tuple[str, SelectionResult], ...]
    shared: bool

    def backend_for(self, group: str) -> SelectionResult:
        for name, result in self.groups:
            if name == group:
                return result
        raise KeyError(f"no layer group {group!r}; groups: {', '.join(n for n, _ in self.groups)}")


def select_attention_backend(
    requirements: AttentionRequirements, requested: str | None = None, platform=None
) -> SelectionResult:
    """The backend for one group of layers on `platform` (default: the current one).

    `requested` (or KERNELBAY_ATTENTION_BACKEND) must be known and capable; there is no fallback.
    """
    return select_for_layer_groups({"layers": requirements}, requested, platform).groups[0][1]


def select_for_layer_groups(
    groups: Mapping[str, Any], requested: str | None = None, platform=None, kind: str = "attention_backend"
) -> LayerGroupSelection:
    """Select per group; the first candidate capable for *every* group wins them all, else each its own.
    `kind`: a KERNEL_KINDS slot kind (kernelbay.moe selects its kernels here with MoERequirements)."""
    from ..platforms import Platform, current_platform, get_platform
    from ..registry import names

    if not groups:
        raise ValueError("select_for_layer_groups needs at least one layer group")
    if platform is None:
        platform = current_platform()
    plat = platform if isinstance(platform, Platform) else get_platform(str(platform))
    items = tuple((name, req if req.platform else req.with_platform(plat.name)) for name, req in groups.items())
    priority = tuple(getattr(plat, KERNEL_KINDS[kind][2])())
    return _select_groups(items, _requested_name(requested, kind), plat.name, priority, tuple(names(kind)), kind)


def clear_selection_cache() -> None:
    """Forget cached selections (after registering or unloading backends at runtime)."""
    _select_groups.cache_clear()


def _requested_name(requested: str | None, kind: str = "attention_backend") -> str | None:
    return requested or os.environ.get(KERNEL_KINDS[kind][1]) or None


def load_backend(kind: str, name: str) -> tuple[Any, str | None]:
    """The class an installed name resolves to, or why not: a broken backend is a reason, never a crash."""
    from ..registry import resolve

    try:
        return resolve(kind, name), None
    except Exception as exc:  # noqa: BLE001
        return None, f"failed to import: {type(exc).__name__}: {exc}"


def _verdicts(req, priority: tuple[str, ...], installed: tuple[str, ...], kind: str) -> dict[str, CandidateReport]:
    """Every candidate (platform priority first, then every installed backend) with its failures; chosen and
    reason come once every group has answered."""
    order = dict.fromkeys(priority, "platform priority") | {n: "installed" for n in installed if n not in priority}
    return {
        name: CandidateReport(name, source, False, "", *_ask(kind, name, installed, req))
        for name, source in order.items()
    }


def _ask(kind: str, name: str, installed: tuple[str, ...], req) -> tuple[tuple[str, ...], type | None]:
    """Load one candidate and ask it every capability: (failures, class); failures to load are failures, not
    crashes."""
    if name not in installed:
        return (_NOT_INSTALLED,), None
    cls, broken = load_backend(kind, name)
    if cls is None:
        return (str(broken),), None
    try:
        failures = cls.capability_failures(req)
    except Exception as exc:  # noqa: BLE001
        return (f"capability check of {name} raised {type(exc).__name__}: {exc}",), cls
    if not isinstance(failures, (list, tuple)) or not all(isinstance(f, str) for f in failures):
        # a junk answer (None, a bare string) must neither crash selection nor pass as "capable"
        return (f"{name}.capability_failures() must return a list of failure strings, got {failures!r}",), cls
    return tuple(failures), cls


@functools.lru_cache(maxsize=256)
def _select_groups(items, requested, platform_name, priority, installed, kind) -> LayerGroupSelection:
    label = KERNEL_KINDS[kind][0]
    verdicts = {name: _verdicts(req, priority, installed, kind) for name, req in items}
    for name, req in items if requested else ():
        _check_requested(name if len(items) > 1 else None, requested, verdicts[name], req, kind)
    first = next(iter(verdicts.values()))
    shared = requested or next((n for n in first if all(vs[n].capable for vs in verdicts.values())), None)
    outcomes = tuple((g, *_group_result(g, req, verdicts, shared, requested, platform_name)) for g, req in items)
    for (name, req), (_, result, reports) in zip(items, outcomes, strict=True):
        if result is None:  # every group's outcome travels with the error (explain shows them all)
            where = f"layer group {name!r}: " if len(items) > 1 else ""
            raise NoCapableBackend(
                f"{where}no installed {label} can run {req.describe()} on {platform_name}",
                [f"{c.name}: {'; '.join(c.failures)}" for c in reports],
                outcomes,
            )
    results = tuple((name, result) for name, result, _ in outcomes)
    for name, result in results:
        for c in result.candidates:
            failed = (": " + "; ".join(c.failures)) if c.failures else ""
            trace("  candidate %s for %s (%s): %s%s", c.name, name, c.source, c.reason, failed)
        _warn_broken_priority(result, label)
        desc = result.requirements.describe()
        trace("select %s %s for %s (%s) on %s", label, result.backend_name, name, desc, platform_name)
    return LayerGroupSelection(results, len({r.backend_name for _, r in results}) == 1)


def _check_requested(group: str | None, requested: str, verdicts: dict[str, CandidateReport], req, kind: str) -> None:
    from ..registry import names

    label, env, _ = KERNEL_KINDS[kind]
    where = f"layer group {group!r}: " if group else ""
    verdict = verdicts.get(requested)
    if verdict is None or verdict.failures == (_NOT_INSTALLED,):
        message = unknown_name_message(label, requested, names(kind))
        raise UnknownBackend(f"{where}{message} (requested via argument or {env})")
    if verdict.failures:
        raise BackendNotCapable(
            f"{where}requested {label} {requested} cannot run {req.describe()}; failed capabilities:",
            verdict.failures,
        )


def _group_result(group, req, verdicts, shared, requested, platform_name):
    """(the group's SelectionResult or None where no candidate can run it, every candidate's report)."""
    own, others = verdicts[group], {g: vs for g, vs in verdicts.items() if g != group}
    winner = shared or next((v.name for v in own.values() if v.capable), None)
    reports = tuple(
        replace(v, chosen=v.name == winner and v.capable, reason=_reason(v, winner, requested, shared, others))
        for v in own.values()
    )
    if winner is None:
        return None, reports
    return SelectionResult(winner, own[winner].backend_cls, req, platform_name, requested, reports), reports


def _reason(v: CandidateReport, winner: str | None, requested: str | None, shared: str | None, others: dict) -> str:
    if v.failures:
        return "not capable"
    if v.name == winner:
        if requested:
            return "requested and capable"
        if not others:
            return "first capable candidate in priority order"
        return "first candidate capable for every layer group" if shared else "first capable candidate"
    if requested:
        return f"capable, but {winner} was requested"
    lacking = [g for g, vs in others.items() if not vs[v.name].capable]
    if shared and lacking:
        return f"capable here, but not for layer group(s) {', '.join(lacking)}; {winner} serves every group"
    return f"capable, but {winner} comes first"


_WARNED_BROKEN: set[tuple[str, str]] = set()


def _warn_broken_priority(result: SelectionResult, label: str) -> None:
    """A backend the platform lists first that fails to import is a degraded choice: warn once, naming the cause."""
    for c in result.candidates:
        broken = c.source == "platform priority" and c.failures and c.failures[0].startswith("failed to import")
        if broken and (result.platform, c.name) not in _WARNED_BROKEN:
            _WARNED_BROKEN.add((result.platform, c.name))
            listed = f"{label} {c.name}, in platform {result.platform}'s priority list"
            warn("%s, is broken; using %s instead. %s", listed, result.backend_name, c.failures[0])
