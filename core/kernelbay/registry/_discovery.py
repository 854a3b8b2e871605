"""Entry-point discovery from distribution metadata only: no plugin module is imported here.

Metadata comes from `importlib_metadata`, requirements are checked with `packaging`; both are
imported inside the functions that need them, so `import kernelbay` imports neither.
"""

from __future__ import annotations

import os
import re
import sys
from collections import namedtuple
from collections.abc import Mapping

from .._trace import trace
from .._version import __version__
from ._records import GROUPS, Provider, normalize_dist, origin_of, split_preferences


class EntryPointRecord(namedtuple("EntryPointRecord", "group name value distribution version origin")):
    """One `kernelbay.*` entry point; `value` is "module" or "module:Class"."""

    __slots__ = ()

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    @property
    def provider(self) -> Provider:
        return Provider(self.module, self.distribution, self.version, self.origin)


class PluginInfo:
    """One distribution that declares kernelbay entry points."""

    def __init__(self, distribution: str, version: str, origin: str, location: str | None):
        self.distribution = distribution
        self.version = version
        self.origin = origin
        self.requires_kernelbay: str | None = None  # the range of the core it declares
        self.location = location
        self.groups: dict[str, list[str]] = {}  # entry-point group -> names
        self.refused: str | None = None  # why the plugin is not used (version mismatch, filtered out)
        self.modules: set[str] = set()  # modules its entry points name: a refused one's imports are refused too

    def to_dict(self) -> dict:
        fields = {key: value for key, value in vars(self).items() if key not in ("groups", "modules")}
        return {**fields, "entry_points": self.groups}


class Discovery:
    """What metadata says is installed, after the allow-list, deny-list and version checks."""

    def __init__(self) -> None:
        self.plugins: dict[str, PluginInfo] = {}
        self.entries: list[EntryPointRecord] = []
        self.unknown_filter_names: list[str] = []
        self.env_problems: list[str] = []  # malformed KERNELBAY_* values, in words
        # the entries indexed on first use, so that resolving each of 1,000 names, or each registration a
        # provider's import makes, stays linear
        self._by_group: dict[str, list[EntryPointRecord]] = {}
        self._by_name: dict[tuple[str, str], list[EntryPointRecord]] = {}
        self._modules: set[str] = set()
        self._indexed = False

    def _index(self) -> None:
        if self._indexed:
            return
        by_group: dict[str, list[EntryPointRecord]] = {}
        by_name: dict[tuple[str, str], list[EntryPointRecord]] = {}
        for e in self.entries:
            by_group.setdefault(e.group, []).append(e)
            by_name.setdefault((e.group, e.name), []).append(e)
        # built whole, then published: a reader in another thread sees no index or all of it
        self._by_group, self._by_name, self._modules = by_group, by_name, {e.module for e in self.entries}
        self._indexed = True

    def in_group(self, group: str) -> list[EntryPointRecord]:
        self._index()
        return self._by_group.get(group, [])

    def named(self, group: str, name: str) -> list[EntryPointRecord]:
        """The entry points called `name` in `group`."""
        self._index()
        return self._by_name.get((group, name), [])

    def names_module(self, module: str) -> bool:
        """Whether an entry point names `module`."""
        self._index()
        return module in self._modules

    def findings(self) -> list[str]:
        out = list(self.env_problems)
        out += [
            f"{n!r} in KERNELBAY_PLUGINS/KERNELBAY_DISABLE_PLUGINS is not an installed plugin distribution"
            for n in self.unknown_filter_names
        ]
        out += [
            f"{p.distribution} {p.version} refused: {p.refused}"
            for p in self.plugins.values()
            if p.refused and not p.refused.startswith("disabled")
        ]
        return out


def _split_names(variable: str, text: str | None, problems: list[str]) -> set[str] | None:
    """The distributions a comma-separated allow/deny list names; None (no filter) when unset or empty.

    A value made only of separators (",,,") names nothing: it is treated as unset, like the empty string,
    and said so in `problems` (a finding) and on stderr, rather than silently disabling every plugin."""
    if text is None or not text.strip():
        return None
    names = {normalize_dist(n.strip()) for n in text.split(",") if n.strip()}
    if not names:
        problem = f"{variable}={text!r} names no distribution; treated as unset (list names like 'kernelbay-llama')"
        problems.append(problem)
        print(f"kernelbay: warning: {problem}", file=sys.stderr)
        return None
    return names


def _kernelbay_distributions(path: list[str] | None):
    """Distributions declaring `kernelbay.*` entry points: path entry by path entry (sys.path by
    default), by metadata directory within one, so the order does not depend on the file system.

    `importlib_metadata` is imported here, not at module level: it (and the email parser its metadata
    needs) costs ~20 ms, which `import kernelbay` must not pay.
    """
    import importlib_metadata

    for entry in sys.path if path is None else path:
        if not os.path.exists(entry or "."):  # spares a zip probe (and importing zipfile) for absent entries
            continue
        dists = [d for d in importlib_metadata.distributions(path=[entry]) if _declares_kernelbay_group(d)]
        yield from sorted(dists, key=lambda d: _location(d) or "")


def _declares_kernelbay_group(dist) -> bool:
    # A substring test before parsing: most distributions have entry points, none of them kernelbay's
    text = dist.read_text("entry_points.txt")
    return bool(text) and "[kernelbay." in text


def _read_metadata(dist) -> tuple[str, str, list[str]] | None:
    """Normalised name, version and requirements, from one parse of the metadata file."""
    try:
        meta = dist.metadata
    except OSError:  # MetadataNotFound: a metadata directory without METADATA or PKG-INFO
        return None
    name = meta.get("Name")
    if not name:
        return None
    # `dist.requires` would parse the file again; it is needed for an egg-info's requires.txt
    requires = meta.get_all("Requires-Dist") or dist.requires or []
    return normalize_dist(name), meta.get("Version") or "", requires


def _location(dist) -> str | None:
    # The metadata directory, which tells two copies apart; PathDistribution keeps it as `_path`
    # (pip reads it the same way), other providers may have none.
    where = getattr(dist, "_path", None)
    return None if where is None else str(where)


# The project name a requirement string starts with (PEP 508), to parse only those naming the core.
_LEADING_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _core_specifier(text: str, rest: str):
    """The SpecifierSet that the requirement `text` on kernelbay (`rest`: what follows the name) sets here; None
    when its marker is false here (another Python, or only with an extra). Raises ValueError (packaging's
    InvalidRequirement, InvalidSpecifier) for one packaging cannot read."""
    if not rest or (rest[0] in "<>=!~" and not any(c in rest for c in ";@[(")):
        # only version clauses: SpecifierSet alone reads them, sparing the import of packaging.requirements
        # (~15 ms more: markers, tags, dataclasses)
        from packaging.specifiers import SpecifierSet

        return SpecifierSet(rest)
    from packaging.requirements import Requirement

    req = Requirement(text)
    return req.specifier if req.marker is None or req.marker.evaluate({"extra": ""}) else None


def _core_requirement(name: str, version: str, requires) -> tuple[str | None, str | None]:
    """(the range of kernelbay the plugin declares for this environment, why it is refused if it is): every
    requirement on kernelbay that applies here, together (pip requires them all)."""
    if name == "kernelbay":
        return None, None
    spec = None
    for text in requires or ():
        match = _LEADING_NAME.match(text)
        if not match or normalize_dist(match.group(1)) != "kernelbay":
            continue
        rest = text[match.end() :].strip()
        try:
            one = _core_specifier(text, rest)
        except ValueError as exc:
            return rest, f"{name} {version} declares a requirement on kernelbay that packaging cannot read: {exc}"
        if one is not None:
            spec = one if spec is None else spec & one
    if spec is None:
        return None, None
    # prereleases=True: the core is already installed, and a dev or rc build still satisfies `>=0.1` (pip
    # check judges installed versions the same way)
    if spec.contains(__version__, prereleases=True):
        return str(spec) or None, None
    return str(spec) or None, (
        f"{name} {version} requires kernelbay{spec}, but kernelbay {__version__} is installed; "
        f"install a {name} release built for kernelbay {__version__}, or a kernelbay matching {spec}"
    )


def _plugin_info(dist, name: str, version: str) -> tuple[PluginInfo, list[EntryPointRecord]]:
    origin = origin_of(name)
    info = PluginInfo(name, version, origin, _location(dist))
    records = []
    for ep in dist.entry_points:
        if ep.group in GROUPS:
            records.append(EntryPointRecord(ep.group, ep.name, ep.value, name, version, origin))
            info.groups.setdefault(ep.group, []).append(ep.name)
            info.modules.add(records[-1].module)
    return info, records


def _filter_refusal(name: str, allow: set[str] | None, deny: set[str] | None) -> str | None:
    if name == "kernelbay":  # the core's own platforms are not a plugin to switch off
        return None
    if allow is not None and name not in allow:
        return "disabled: not in KERNELBAY_PLUGINS"
    if deny is not None and name in deny:
        return "disabled: listed in KERNELBAY_DISABLE_PLUGINS"
    return None


def discover(environ: Mapping[str, str] | None = None, path: list[str] | None = None) -> Discovery:
    """Scan installed distributions once; filter by allow/deny lists and core-API range."""
    env = os.environ if environ is None else environ
    found = Discovery()
    allow = _split_names("KERNELBAY_PLUGINS", env.get("KERNELBAY_PLUGINS"), found.env_problems)
    deny = _split_names("KERNELBAY_DISABLE_PLUGINS", env.get("KERNELBAY_DISABLE_PLUGINS"), found.env_problems)
    found.env_problems += split_preferences(env.get("KERNELBAY_PREFER", ""))[1]
    for dist in _kernelbay_distributions(path):
        meta = _read_metadata(dist)
        if meta is None or meta[0] in found.plugins:  # the first copy on the path wins, as for imports
            continue
        name, version, requires = meta
        info, eps = _plugin_info(dist, name, version)
        info.requires_kernelbay, version_refusal = _core_requirement(name, version, requires)
        info.refused = _filter_refusal(info.distribution, allow, deny) or version_refusal
        found.plugins[info.distribution] = info
        if info.refused is None:
            found.entries.extend(eps)
        trace("discovered %s %s (%s): %s", info.distribution, info.version, info.origin, info.refused or "enabled")
    named = (allow or set()) | (deny or set())
    found.unknown_filter_names = sorted(n for n in named if n not in found.plugins)
    return found
