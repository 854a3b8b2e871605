"""Entry-point discovery from distribution metadata only: no plugin module is imported here."""

from __future__ import annotations

import os
import sys
from collections import namedtuple

from .._trace import trace
from .._version import __version__
from ._records import FIRST_PARTY_DISTRIBUTIONS, GROUPS, Origin, normalize_dist, origin_of


class EntryPointRecord(namedtuple("EntryPointRecord", "group name value distribution version origin")):
    """One `kernelbay.*` entry point; `value` is "module" or "module:Class"."""

    __slots__ = ()

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()


class PluginInfo:
    """One distribution that declares kernelbay entry points."""

    def __init__(self, distribution: str, version: str, origin: str, requires_kernelbay: str | None,
                 location: str | None):
        self.distribution = distribution
        self.version = version
        self.origin = origin
        self.requires_kernelbay = requires_kernelbay
        self.location = location
        self.groups: dict[str, list[str]] = {}
        self.refused: str | None = None  # why the plugin is not used (version mismatch, filtered out)

    def to_dict(self) -> dict:
        return {
            "distribution": self.distribution,
            "version": self.version,
            "origin": self.origin,
            "requires_kernelbay": self.requires_kernelbay,
            "location": self.location,
            "entry_points": self.groups,
            "refused": self.refused,
        }


class Discovery:
    """What metadata says is installed, after the allow-list, deny-list and version checks."""

    def __init__(self) -> None:
        self.plugins: dict[str, PluginInfo] = {}
        self.entries: list[EntryPointRecord] = []
        self.unknown_filter_names: list[str] = []
        self._by_group: dict[str, list[EntryPointRecord]] | None = None

    def in_group(self, group: str) -> list[EntryPointRecord]:
        if self._by_group is None:
            self._by_group = {}
            for e in self.entries:
                self._by_group.setdefault(e.group, []).append(e)
        return self._by_group.get(group, [])

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


class _InstalledDist(namedtuple("_InstalledDist", "name version requires entry_points location")):
    """The few facts discovery needs from one installed distribution's metadata directory:
    requires (Requires-Dist strings), entry_points ((group, name, value) of kernelbay groups)."""

    __slots__ = ()


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _parse_entry_points(text: str) -> list[tuple[str, str, str]]:
    """The INI format of entry_points.txt (PyPA spec), kernelbay groups only."""
    out, group = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
        elif group in GROUPS and "=" in line:
            name, _, value = line.partition("=")
            out.append((group, name.strip(), value.strip()))
    return out


def _parse_metadata(text: str) -> tuple[str, str, list[str]]:
    """Name, Version and Requires-Dist from the METADATA/PKG-INFO header block."""
    name = version = ""
    requires = []
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key == "name":
            name = value
        elif key == "version":
            version = value
        elif key == "requires-dist":
            requires.append(value)
    return name, version, requires


def _load_dist(meta_dir: str) -> _InstalledDist | None:
    text = _read(os.path.join(meta_dir, "entry_points.txt"))
    if not text or "[kernelbay." not in text:
        return None
    egg = meta_dir.endswith(".egg-info")
    header = _read(os.path.join(meta_dir, "PKG-INFO" if egg else "METADATA")) or ""
    name, version, requires = _parse_metadata(header)
    if egg:
        requires = [r for r in (_read(os.path.join(meta_dir, "requires.txt")) or "").split("[")[0].splitlines() if r]
    if not name:
        return None
    return _InstalledDist(normalize_dist(name), version, tuple(requires), tuple(_parse_entry_points(text)), meta_dir)


def _iter_kernelbay_distributions(path: list[str] | None):
    """Distributions with `[kernelbay.*]` entry points, first on sys.path wins (as for imports).

    Reads `*.dist-info` / `*.egg-info` directories directly (the PyPA on-disk format): scanning
    stays cheap with thousands of installed distributions and imports nothing heavy.
    """
    seen: set[str] = set()
    for entry in path if path is not None else sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for item in names:
            if not item.endswith((".dist-info", ".egg-info")):
                continue
            dist = _load_dist(os.path.join(entry or ".", item))
            if dist is not None and dist.name not in seen:
                seen.add(dist.name)
                yield dist


def _kernelbay_requirement(requires) -> str | None:
    for req_text in requires:
        spec, _, marker = req_text.partition(";")
        head = spec.strip()
        name = head.split("[")[0]
        for i, ch in enumerate(head):
            if ch in "<>=!~ ([":
                name = head[:i]
                break
        if normalize_dist(name.strip()) != "kernelbay" or "extra" in marker:
            continue
        return head[len(name):].strip().strip("()").strip()
    return None


_OPS = {
    ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    "<": lambda a, b: a < b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


def _release(text: str) -> tuple[int, ...] | None:
    """A plain release number ("0.1", "1.2.3") as a zero-padded tuple; None for anything richer."""
    parts = text.strip().split(".")
    if not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts) + (0,) * (6 - len(parts))


def _simple_clauses(spec: str) -> list[tuple[str, tuple[int, ...]]] | None:
    clauses = []
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op = next((o for o in (">=", "<=", "==", "!=", ">", "<") if clause.startswith(o)), None)
        if op is None or clause.startswith(("===", "~=")):
            return None
        version = _release(clause[len(op):])
        if version is None:
            return None
        clauses.append((op, version))
    return clauses


def _satisfies(spec: str) -> bool:
    """PEP 440 check of the core version against `spec`.

    Comparison clauses between plain release numbers (the usual `>=0.1,<0.2`) are exact as
    tuple comparisons and need no import; anything else (`~=`, wildcards, pre-releases, local
    versions) goes through `packaging.specifiers.SpecifierSet`.
    """
    current = _release(__version__)
    clauses = _simple_clauses(spec)
    if current is not None and clauses is not None:
        return all(_OPS[op](current, version) for op, version in clauses)
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(__version__, prereleases=True)


def _version_refusal(name: str, version: str, spec: str | None) -> str | None:
    if not spec or name == "kernelbay":
        return None
    if _satisfies(spec):
        return None
    return (f"{name} {version} requires kernelbay{spec}, but kernelbay {__version__} is installed; "
            f"install a {name} release built for kernelbay {__version__}, or a kernelbay matching {spec}")


def _plugin_info(dist: _InstalledDist) -> tuple[PluginInfo, list[EntryPointRecord]]:
    origin = origin_of(dist.name)
    info = PluginInfo(dist.name, dist.version, origin, _kernelbay_requirement(dist.requires) or None, dist.location)
    records = []
    for group, name, value in dist.entry_points:
        info.groups.setdefault(group, []).append(name)
        records.append(EntryPointRecord(group, name, value, dist.name, dist.version, origin))
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
    for dist in _iter_kernelbay_distributions(path):
        name = dist.name
        info, eps = _plugin_info(dist)
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
