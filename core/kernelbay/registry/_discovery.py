"""Entry-point discovery from distribution metadata only: no plugin module is imported here."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from .._trace import trace
from .._version import __version__
from ._records import FIRST_PARTY_DISTRIBUTIONS, GROUPS, Origin, normalize_dist, origin_of


@dataclass(frozen=True, slots=True)
class EntryPointRecord:
    group: str
    name: str
    value: str  # "module" or "module:Class"
    distribution: str
    version: str
    origin: Origin

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()


@dataclass
class PluginInfo:
    """One distribution that declares kernelbay entry points."""

    distribution: str
    version: str
    origin: Origin
    requires_kernelbay: str | None
    location: str | None
    groups: dict[str, list[str]] = field(default_factory=dict)
    refused: str | None = None  # why the plugin is not used (version mismatch, filtered out)

    def to_dict(self) -> dict:
        return {
            "distribution": self.distribution,
            "version": self.version,
            "origin": str(self.origin),
            "requires_kernelbay": self.requires_kernelbay,
            "location": self.location,
            "entry_points": self.groups,
            "refused": self.refused,
        }


@dataclass
class Discovery:
    """What metadata says is installed, after the allow-list, deny-list and version checks."""

    plugins: dict[str, PluginInfo] = field(default_factory=dict)
    entries: list[EntryPointRecord] = field(default_factory=list)
    unknown_filter_names: list[str] = field(default_factory=list)

    def in_group(self, group: str) -> list[EntryPointRecord]:
        return [e for e in self.entries if e.group == group]

    def findings(self) -> list[str]:
        out = [f"{n!r} in KERNELBAY_PLUGINS/KERNELBAY_DISABLE_PLUGINS is not an installed plugin distribution"
               for n in self.unknown_filter_names]
        out += [f"{p.distribution} {p.version} refused: {p.refused}"
                for p in self.plugins.values() if p.refused and not p.refused.startswith("disabled")]
        return out


def _split_names(text: str | None) -> set[str] | None:
    if text is None or not text.strip():
        return None
    return {normalize_dist(n.strip()) for n in text.split(",") if n.strip()}


def _kernelbay_requirement(dist) -> str | None:
    for req_text in dist.requires or ():
        from packaging.requirements import Requirement

        req = Requirement(req_text)
        if normalize_dist(req.name) == "kernelbay" and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return str(req.specifier)
    return None


def _version_refusal(name: str, version: str, spec: str | None) -> str | None:
    if spec is None or name == "kernelbay":
        return None
    from packaging.specifiers import SpecifierSet

    if SpecifierSet(spec).contains(__version__, prereleases=True):
        return None
    return (f"{name} {version} requires kernelbay{spec}, but kernelbay {__version__} is installed; "
            f"install a {name} release built for kernelbay {__version__}, or a kernelbay matching {spec}")


def _iter_kernelbay_distributions(path: list[str] | None):
    """Distributions with `[kernelbay.*]` entry points, first on sys.path wins (as for imports)."""
    from importlib import metadata

    seen: set[str] = set()
    for dist in metadata.distributions(path=path if path is not None else sys.path):
        text = dist.read_text("entry_points.txt")
        if not text or "[kernelbay." not in text:
            continue
        name = normalize_dist(dist.metadata["Name"] or "")
        if not name or name in seen:
            continue
        seen.add(name)
        yield name, dist


def _plugin_info(name: str, dist) -> tuple[PluginInfo, list[EntryPointRecord]]:
    location = getattr(dist, "_path", None)
    info = PluginInfo(
        distribution=name,
        version=dist.version,
        origin=origin_of(name),
        requires_kernelbay=_kernelbay_requirement(dist),
        location=str(location) if location else None,
    )
    records = []
    for ep in dist.entry_points:
        if ep.group in GROUPS:
            info.groups.setdefault(ep.group, []).append(ep.name)
            records.append(EntryPointRecord(ep.group, ep.name, ep.value, name, dist.version, info.origin))
    return info, records


def _filter_refusal(name: str, allow: set[str] | None, deny: set[str] | None) -> str | None:
    if name == "kernelbay":  # the core's own platforms are not a plugin to switch off
        return None
    if allow is not None and name not in allow:
        return "disabled: not in KERNELBAY_PLUGINS"
    if deny is not None and name in deny:
        return "disabled: listed in KERNELBAY_DISABLE_PLUGINS"
    return None


def discover(environ: dict | None = None, path: list[str] | None = None) -> Discovery:
    """Scan installed distributions once; filter by allow/deny lists and core-API range."""
    env = os.environ if environ is None else environ
    allow = _split_names(env.get("KERNELBAY_PLUGINS"))
    deny = _split_names(env.get("KERNELBAY_DISABLE_PLUGINS"))
    found = Discovery()
    for name, dist in _iter_kernelbay_distributions(path):
        info, eps = _plugin_info(name, dist)
        info.refused = _filter_refusal(name, allow, deny) or _version_refusal(
            name, info.version, info.requires_kernelbay)
        found.plugins[name] = info
        if info.refused is None:
            found.entries.extend(eps)
        trace("discovered %s %s (%s): %s", name, info.version, info.origin, info.refused or "enabled")
    named = (allow or set()) | (deny or set())
    found.unknown_filter_names = sorted(n for n in named if n not in found.plugins)
    return found


__all__ = ["Discovery", "EntryPointRecord", "PluginInfo", "discover", "FIRST_PARTY_DISTRIBUTIONS"]
