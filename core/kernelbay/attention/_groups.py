"""Selection per layer group (full, sliding, chunked, MLA...), preferring one backend for all groups."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from ._requirements import AttentionRequirements
from ._selector import (CandidateReport, NoCapableBackend, SelectionResult, _check_requested, _describe,
                        _requested_name, _resolve_platform, evaluate_candidates)


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

    def to_dict(self) -> dict:
        return {"shared_backend": self.shared, "groups": {n: r.to_dict() for n, r in self.groups}}


def select_for_layer_groups(groups: Mapping[str, AttentionRequirements], requested: str | None = None,
                            platform=None) -> LayerGroupSelection:
    """Select per group; the first candidate capable for *every* group wins them all, else each its own."""
    if not groups:
        raise ValueError("select_for_layer_groups needs at least one layer group")
    plat = _resolve_platform(platform)
    items = tuple((name, req if req.platform else req.with_platform(plat.name)) for name, req in groups.items())
    from ..registry import names

    return _select_groups(items, _requested_name(requested), plat.name, tuple(plat.backend_priority()),
                          tuple(names("attention_backend")))


@functools.lru_cache(maxsize=64)
def _select_groups(items, requested, platform_name, priority, installed) -> LayerGroupSelection:
    verdicts = {name: evaluate_candidates(req, priority, installed) for name, req in items}
    if requested is not None:
        for name, req in items:
            _check_group(name, requested, verdicts[name], req)
    shared = requested or _first_capable_everywhere(verdicts)
    results = tuple((name, _group_result(name, req, verdicts, shared, requested, platform_name)) for name, req in items)
    return LayerGroupSelection(results, len({r.backend_name for _, r in results}) == 1)


def _check_group(group: str, requested: str, verdicts, req) -> None:
    try:
        _check_requested(requested, verdicts, req)
    except Exception as exc:
        exc.args = (f"layer group {group!r}: {exc.args[0]}",) + exc.args[1:]
        raise


def _first_capable_everywhere(verdicts: dict) -> str | None:
    order = [v.name for v in next(iter(verdicts.values()))]
    for name in order:
        if all(_capable(vs, name) for vs in verdicts.values()):
            return name
    return None


def _capable(verdicts, name: str) -> bool:
    return any(v.name == name and v.cls is not None and not v.failures for v in verdicts)


def _group_result(group, req, verdicts, shared, requested, platform_name) -> SelectionResult:
    own = verdicts[group]
    winner = shared or next((v.name for v in own if v.cls is not None and not v.failures), None)
    if winner is None:
        raise NoCapableBackend(f"layer group {group!r}: no installed attention backend can run {_describe(req)} "
                               f"on {platform_name}", [f"{v.name}: {'; '.join(v.failures)}" for v in own])
    others = {g: vs for g, vs in verdicts.items() if g != group}
    reports = tuple(_report(v, winner, requested, shared, others) for v in own)
    cls = next(v.cls for v in own if v.name == winner)
    return SelectionResult(winner, cls, req, platform_name, requested, reports)


def _report(v, winner, requested, shared, others) -> CandidateReport:
    if v.failures:
        return CandidateReport(v.name, v.source, False, "not capable", v.failures)
    if v.name == winner:
        reason = ("requested and capable" if requested else
                  "first candidate capable for every layer group" if shared else "first capable candidate")
        return CandidateReport(v.name, v.source, True, reason)
    if requested:
        return CandidateReport(v.name, v.source, False, f"capable, but {winner} was requested")
    lacking = [g for g, vs in others.items() if not _capable(vs, v.name)]
    if shared and lacking:
        return CandidateReport(v.name, v.source, False, f"capable here, but not for layer group(s) "
                               f"{', '.join(lacking)}; {winner} serves every group")
    return CandidateReport(v.name, v.source, False, f"capable, but {winner} comes first")


def select_for_model(cfg, kv_cache_dtype: str | None = "auto", requested: str | None = None, platform=None,
                     dtype: str | None = None, **runtime) -> LayerGroupSelection:
    """Per-group selection for a resolved ModelConfig (`cfg.layer_groups()`), skipping no-attention layers."""
    groups = {kind: AttentionRequirements.from_model_config(cfg, kind, kv_cache_dtype=kv_cache_dtype,
                                                            dtype=dtype, **runtime)
              for kind, _layers in cfg.layer_groups() if kind != "no_attention"}
    return select_for_layer_groups(groups, requested=requested, platform=platform)


def clear_group_cache() -> None:
    _select_groups.cache_clear()
