"""The slot registry: one mechanism for every slot kind, derived from a replayable log."""

from __future__ import annotations

import os
import sys
import threading
from collections import namedtuple
from collections.abc import Iterable, Mapping

from .._trace import trace, warn
from ..errors import (
    InputError,
    PluginImportError,
    RegistrationConflict,
    UnknownNameError,
    UnsupportedArchitecture,
    unknown_name_message,
)
from ._discovery import Discovery, EntryPointRecord, PluginInfo, discover
from ._imports import BrokenProvider, import_module, load_attribute
from ._records import (
    ANY_ARCHITECTURE,
    CLASS_KINDS,
    INDEX_GROUP,
    KIND_LABEL,
    KINDS,
    MODEL_INDEX,
    Origin,
    Preferences,
    Provider,
    Registration,
    Slot,
    decide,
    first_party_provides,
    normalize_dist,
    origin_of,
)

MODEL_IMPLS = ("auto", "native", "transformers")


def _top(module: str) -> str:
    return module.partition(".")[0]


# Registrations (and their objects) made while one provider module imports; committed only if it succeeds.
_Frame = namedtuple("_Frame", "provider registrations objects")


class Registry:
    def __init__(self, environ: Mapping[str, str] | None = None, discovery: Discovery | None = None):
        self._env = os.environ if environ is None else environ
        self._lock = threading.RLock()
        self._local = threading.local()
        self._discovery = discovery
        self._indexed = False
        self._log: dict[str, list[Registration]] = {}  # provider module -> its registrations; slots derive from it
        self._claims: dict[tuple[str, str], list[Registration]] = {}  # the log by slot key, kept in step with it
        self._objects: dict[str, object] = {}  # target -> the object registered (a local class has no import path)
        self._resolved: dict[tuple[str, str], object] = {}
        self._broken: dict[str, BrokenProvider] = {}
        self._attempted: set[str] = set()
        self._unloaded: set[str] = set()
        self._warned: set[tuple[str, ...]] = set()  # what was warned about once
        self._prefs = Preferences.parse(self._env.get("KERNELBAY_PREFER", ""))
        self.custom_paths: dict[str, str] = {}  # resolved path -> module name

    # ---- discovery and the static index -------------------------------------------------
    def discovery(self) -> Discovery:
        with self._lock:
            if self._discovery is None:
                self._discovery = discover(self._env)
            if not self._indexed:  # backends, platforms, configs, formats named by entry points: slots from metadata
                self._indexed = True
                for kind in CLASS_KINDS:
                    for e in self._discovery.in_group(INDEX_GROUP[kind]):
                        self._commit(e.provider, [Registration(kind, e.name, e.value, e.provider)])
            return self._discovery

    def index_entries(self, kind: str, name: str) -> list[EntryPointRecord]:
        return self.discovery().named(INDEX_GROUP[kind], name)

    def names(self, kind: str) -> list[str]:
        """Every name known for `kind` (index + registered), without importing anything."""
        _check_kind(kind)
        # the other kinds' entry points are slots already; vision encoders and drafts share the models index
        # with models, and only their slots say which
        found = self.discovery()
        entries = found.in_group(MODEL_INDEX) if kind == "model" else []
        indexed = {e.name for e in entries if e.module not in self._unloaded}
        return sorted((indexed | {n for (k, n) in self._slots() if k == kind}) - {ANY_ARCHITECTURE})

    # ---- recording ----------------------------------------------------------------------
    def _frames(self) -> list[_Frame]:
        if not hasattr(self._local, "frames"):
            self._local.frames = []
        return self._local.frames

    def _credit(self, owner: str) -> tuple[_Frame | None, Provider]:
        """Who registers from module `owner`. While a provider of its package imports: that provider (its frame),
        or `owner` itself when the index names it (a sibling the outer provider imports). Otherwise where `owner`
        comes from: the plugins' index (enabled ones first, then refused ones), then installed metadata."""
        frames = self._frames()
        frame = frames[-1] if frames and _top(frames[-1].provider.module) == _top(owner) else None
        if frame is not None:
            outer = frame.provider
            sibling = owner != outer.module and self.discovery().names_module(owner)
            return frame, outer._replace(module=owner) if sibling else outer
        for info in sorted(self.discovery().plugins.values(), key=lambda info: info.refused is not None):
            if _top(owner) in {_top(m) for m in info.modules}:
                return None, Provider(owner, info.distribution, info.version, info.origin)
        dist = _distribution_of(owner)
        return None, Provider(owner, dist[0], dist[1], origin_of(dist[0])) if dist else Provider(owner)

    def _warn_once(self, mark: tuple[str, ...], message: str) -> None:
        """Warn `message` the first time `mark` (what it is about) comes up in this registry."""
        if mark not in self._warned:
            self._warned.add(mark)
            warn("%s", message)

    def add(self, kind: str, names: Iterable[str], target: object, caller: str | None = None) -> None:
        """Register `target` (a class, or "module:Class" imported lazily) under each name.

        The provider is the module that made the call (`caller`), not the target's module: a
        user's runtime `register_model("X", target=SomeBuiltinClass)` is external.
        """
        _check_kind(kind)
        names = _check_names(names)
        key_target, owner = _target_and_owner(target)
        with self._lock:
            frame, provider = self._credit(caller or owner)
            regs = [Registration(kind, n, key_target, provider) for n in names]
            objects = {} if isinstance(target, str) else {key_target: target}
            if frame is not None:  # committed when the provider's import succeeds
                frame.registrations.extend(regs)
                frame.objects.update(objects)
                return
            _remember_import_time(regs, objects)
            # blocked stays blocked (as in pluggy): a refused distribution's module imported by hand takes no slot
            info = self.discovery().plugins.get(normalize_dist(provider.distribution or ""))
            if info is not None and info.refused:
                what = ", ".join(f"{KIND_LABEL[r.kind]} {r.name!r}" for r in regs)
                self._warn_once(
                    ("refused", provider.module),
                    f"refused {what} registered by {provider.module}: its distribution {provider.distribution} "
                    f"{provider.version} is refused ({info.refused}); it takes no slot",
                )
                return
            self._objects.update(objects)
            self._commit(provider, regs)

    def record(self, provider: Provider, registrations: Iterable[tuple[str, str, str]]) -> None:
        """Add registrations of `provider` as (kind, name, "module:Class") — lazy, nothing imported."""
        regs = [Registration(k, n, t, provider) for k, n, t in registrations]
        for reg in regs:
            _check_kind(reg.kind)
        with self._lock:
            self._commit(provider, regs)

    def _commit(self, provider: Provider, regs: list[Registration]) -> None:
        entries = self._log.setdefault(provider.module, [])
        for reg in regs:
            claims = self._claims.setdefault(reg.key, [])
            if reg not in claims:  # a key's claims, not the whole log: one provider's 2,000 names stay linear
                entries.append(reg)
                claims.append(reg)
                trace("register %s %r -> %s by %s", reg.kind, reg.name, reg.target, provider.describe())
        self._unloaded.discard(provider.module)
        for key in {r.key for r in regs}:
            self._changed(key)

    def _changed(self, key: tuple[str, str]) -> None:
        """The claims on `key` changed: forget its resolved object, warn if an external now displaces a built-in."""
        self._resolved.pop(key, None)
        slot = self._slots(key).get(key)
        if slot is None or slot.winner is None or slot.winner.provider.is_builtin:
            return
        builtin = [r.provider.describe() for r in slot.displaced if r.provider.is_builtin]
        if builtin:
            winner = slot.winner.provider
            self._warn_once(
                (*key, winner.module),
                f"{KIND_LABEL[slot.kind]} {slot.name!r}: external {winner.describe()} takes the slot from built-in "
                f"{builtin[0]}",
            )

    def _slots(
        self, only: tuple[str, str] | None = None, claims: Iterable[Registration] | None = None
    ) -> dict[tuple[str, str], Slot]:
        """Slots (or the one slot `only`) as the precedence rule derives them from `claims`, the log by default:
        never stored, the log is the state. A key whose claims leave no winner and no conflict has no slot."""
        by_key: dict[tuple[str, str], list[Registration]]
        if claims is None:  # the log's claims by key (each provider's in its order, all `decide` reads of order);
            # a copy: a reader outside the lock must not see the dict change size while it iterates
            by_key = dict(self._claims) if only is None else {only: self._claims.get(only, [])}
        else:
            by_key = {}
            for reg in claims:
                if only is None or reg.key == only:
                    by_key.setdefault(reg.key, []).append(reg)
        slots = {key: decide(*key, regs, self._prefs) for key, regs in by_key.items()}
        return {key: slot for key, slot in slots.items() if slot.winner is not None or slot.conflict}

    # ---- importing providers --------------------------------------------------------------
    def run_in_frame(self, provider: Provider, body) -> None:
        """Run `body` (an import) collecting registrations; commit them only if it succeeds."""
        with self._lock:
            frame = _Frame(provider, [], {})
            self._frames().append(frame)
            try:
                body()
            finally:
                self._frames().pop()
            _remember_import_time(frame.registrations, frame.objects)
            self._objects.update(frame.objects)
            # the provider's own registrations, then each sibling's it imported (credited apart by _credit)
            for who in dict.fromkeys([provider, *(r.provider for r in frame.registrations)]):
                self._commit(who, [r for r in frame.registrations if r.provider == who])

    def import_provider(self, provider: Provider) -> None:
        """Import one provider module in an isolating frame; a failure leaves nothing behind."""
        with self._lock:
            if provider.module in self._broken:
                raise self._broken[provider.module].error
            if provider.module in self._attempted:
                return
            self._attempted.add(provider.module)
            trace("import %s", provider.describe())
            preloaded = provider.module in sys.modules
            try:
                self.run_in_frame(provider, lambda: import_module(provider))
            except PluginImportError as err:
                self._broken[provider.module] = BrokenProvider(provider, err)
                trace("broken %s: %s", provider.module, err)
                raise
            if preloaded:  # imported before this registry existed: its decorators will not run again
                for reg, obj in import_time_registrations(provider.module):
                    if obj is not None:
                        self._objects[reg.target] = obj
                    self._commit(reg.provider, [reg])

    def _import_indexed(self, kind: str, name: str) -> list[BrokenProvider]:
        broken = []
        for entry in self.index_entries(kind, name):
            if entry.module in self._unloaded:
                continue
            try:
                self.import_provider(entry.provider)
            except PluginImportError:
                broken.append(self._broken[entry.module])
        return broken

    # ---- resolving -----------------------------------------------------------------------
    def resolve(self, kind: str, name: str) -> object:
        """Import the providers the index names for (kind, name), apply precedence, return the object."""
        hit = self._resolved.get((kind, name))
        if hit is not None:
            return hit
        _check_kind(kind)
        with self._lock:
            broken = self._import_indexed(kind, name)
            slot = self.slot(kind, name)
            winner = self._winner_or_raise(kind, name, slot, broken)
            obj = self._load_winner(winner)
            self._resolved[(kind, name)] = obj
            trace("resolve %s %r -> %s from %s", kind, name, winner.target, winner.provider.describe())
            # a plugin refused for its core range that provides this name is replaced visibly, once (one the
            # user switched off is not a surprise)
            for info in self._advertisers(kind, name):
                if info.refused and not info.refused.startswith("disabled"):
                    self._warn_once(
                        (kind, name, "refused:" + info.distribution),
                        f"{KIND_LABEL[kind]} {name!r}: using {winner.provider.describe()}; {info.distribution} "
                        f"{info.version} also provides it but is refused: {info.refused}",
                    )
            problem = self.preference_problem(slot)
            if problem:
                self._warn_once(("prefer", kind, name), problem)
            return obj

    def _advertisers(self, kind: str, name: str) -> list[PluginInfo]:
        """Installed plugins whose metadata names (kind, name), refused ones included."""
        group = INDEX_GROUP[kind]
        return [info for info in self.discovery().plugins.values() if name in info.groups.get(group, ())]

    def preference_problem(self, slot: Slot | None) -> str | None:
        """Why a KERNELBAY_PREFER entry for this slot has no effect (it names no provider claiming it)."""
        if slot is None or slot.name not in self._prefs.by_name:
            return None
        claims = ([slot.winner] if slot.winner else []) + list(slot.displaced) + list(slot.conflict)
        if self._prefs.pick(slot.name, claims) is not None:
            return None
        who = self._prefs.by_name[slot.name]
        providers = ", ".join(sorted({r.provider.distribution or r.provider.module for r in claims}))
        return (
            f"KERNELBAY_PREFER names {who!r} for {KIND_LABEL[slot.kind]} {slot.name!r}, but it does not claim "
            f"that slot (claimed by: {providers}); name one of those"
        )

    def fallback_claim(self, kind: str) -> Registration | None:
        """The fallback's claim on every name of `kind` (its "*" slot, imported), if a fallback is installed."""
        with self._lock:
            broken = self._import_indexed(kind, ANY_ARCHITECTURE)
            slot = self.slot(kind, ANY_ARCHITECTURE)
        winner = slot.winner if slot is not None else None
        if winner is not None and winner.provider.is_fallback:
            return winner
        if broken:  # installed but failing to import: say so rather than "not installed"
            raise type(broken[0].error)(f"the fallback provider cannot be used: {broken[0].error}") from broken[0].error
        return None

    def resolve_impl(self, kind: str, name: str, model_impl: str = "auto", hf_config=None) -> object:
        """`resolve` with vLLM's `model_impl`: "native" never takes the fallback; "auto" takes the fallback's "*"
        claim when no plugin claims or advertises the name; "transformers" takes it even where a native provider
        exists. A fallback refusing `hf_config` (its `refusal(hf_config)`), like any name nobody serves, is
        UnsupportedArchitecture, with the native error and the fallback's reason together."""
        if model_impl not in MODEL_IMPLS:
            raise InputError(f"model_impl must be one of {', '.join(MODEL_IMPLS)}, got {model_impl!r}")
        context = f"{KIND_LABEL[kind]} {name!r}: model_impl='transformers'"
        if model_impl == "transformers":
            fallback = self.fallback_claim(kind)
            if fallback is None:
                raise UnsupportedArchitecture(
                    f"{context} needs the fallback provider, which is not installed: pip install kernelbay-transformers"
                )
        else:
            try:
                return self.resolve(kind, name)
            except UnknownNameError as err:
                fallback = self.fallback_claim(kind) if kind == "model" and model_impl == "auto" else None
                # a plugin advertising the name (refused, or never registering it) is to be fixed, not papered over
                if fallback is None or self._advertisers(kind, name):
                    raise UnsupportedArchitecture(str(err)) from err
                trace("%s %r: no native provider (%s); the fallback %s serves", kind, name, err, fallback.target)
                context = str(err)
        impl = self._load_winner(fallback)
        refusal = getattr(impl, "refusal", None) if hf_config is not None else None
        reason = refusal(hf_config) if callable(refusal) else None
        if reason:  # the reason first, in one sentence; what else is known after it
            why = "no installed plugin provides it, and" if model_impl == "auto" else f"with model_impl={model_impl!r},"
            raise UnsupportedArchitecture(
                f"{KIND_LABEL[kind]} {name!r} cannot be served: {why} the fallback {fallback.provider.describe()} "
                f"refuses it: {reason.rstrip('.')}. ({context})"
            )
        return impl

    def _winner_or_raise(self, kind: str, name: str, slot: Slot | None, broken: list[BrokenProvider]) -> Registration:
        """The slot's winner, else the error that explains why there is none (a broken import first)."""
        winner_external = slot is not None and slot.winner is not None and not slot.winner.provider.is_builtin
        for b in broken:
            if not (b.provider.is_builtin and winner_external):
                raise type(b.error)(f"cannot resolve {KIND_LABEL[kind]} {name!r}: {b.error}") from b.error
        if slot is not None and slot.conflict:
            raise RegistrationConflict(_conflict_message(slot))
        if slot is None or slot.winner is None:
            raise UnknownNameError(self._unknown_message(kind, name))
        return slot.winner

    def _unknown_message(self, kind: str, name: str) -> str:
        msg = unknown_name_message(KIND_LABEL[kind], name, self.names(kind))
        entries = self.index_entries(kind, name)
        advertised = [e for e in entries if e.module not in self._unloaded]
        if entries and not advertised:
            unloaded = ", ".join(e.module for e in entries)
            return f"{msg} Its provider {unloaded} was removed with unregister_provider()."
        if advertised:
            who = ", ".join(f"{e.distribution} ({e.module})" for e in advertised)
            return (
                f"{msg} {who} advertise(s) {name!r} in {INDEX_GROUP[kind]} but never registered it; "
                "run `kernelbay doctor`."
            )
        for info in self._advertisers(kind, name):
            if info.refused:
                return f"{msg} {info.distribution} {info.version} provides it but is not used: {info.refused}."
        dist = first_party_provides(kind).get(name)
        return f"{msg} It is provided by the first-party plugin {dist}: pip install {dist}." if dist else msg

    def _load_winner(self, reg: Registration) -> object:
        obj = self._objects.get(reg.target)
        if obj is not None:
            return obj
        module = reg.target.partition(":")[0]
        # `==`, not `is`: an origin that came through JSON/pickle from the parent is an equal, new string
        if reg.provider.origin == Origin.CUSTOM_DIR and reg.provider.path:
            from ._custom_dirs import load_custom_module_dirs

            load_custom_module_dirs([reg.provider.path], registry=self)
        elif module == reg.provider.module:
            self.import_provider(reg.provider)
        obj = self._objects.get(reg.target) or load_attribute(reg.target, reg.provider)
        self._objects[reg.target] = obj
        return obj

    def indexed_slots(self) -> list[tuple[Slot, str]]:
        """Every slot as (slot, state): "registered" (a live claim on it) or "indexed" (predicted from metadata).

        A slot is decided over the live claims and those of the indexed providers not imported yet together, as
        `resolve` (which imports them first) will: a custom dir holding a slot an installed plugin also claims is
        the conflict `run` meets, here too."""
        entries = self.discovery().in_group(MODEL_INDEX)
        skipped = self._attempted | self._unloaded  # imported (their claims are live) or removed
        pending = [Registration("model", e.name, e.module, e.provider) for e in entries if e.module not in skipped]
        live = [reg for regs in dict(self._claims).values() for reg in regs]
        registered = self._slots().keys()
        slots = self._slots(claims=[*live, *pending])
        return [(slots[k], "registered" if k in registered else "indexed") for k in sorted(slots)]

    # ---- the log ------------------------------------------------------------------------
    def slot(self, kind: str, name: str) -> Slot | None:
        self.discovery()
        return self._slots((kind, name)).get((kind, name))

    def slots(self) -> list[Slot]:
        self.discovery()
        slots = self._slots()
        return [slots[k] for k in sorted(slots)]

    def log(self) -> list[Registration]:
        self.discovery()
        return [r for regs in self._log.values() for r in regs]

    def broken(self) -> list[BrokenProvider]:
        return list(self._broken.values())

    def rebuild(self) -> None:
        """Replay the log: slots are derived from it, so this forgets every resolved object."""
        with self._lock:
            self._resolved.clear()
            for key in {r.key for r in self.log()}:
                self._changed(key)

    def unregister_provider(self, module: str) -> list[Registration]:
        """Remove a provider's registrations; the slots it held go back to whoever else claims them."""
        with self._lock:
            removed = self._log.pop(module, [])
            for key in {r.key for r in removed}:
                kept = [r for r in self._claims[key] if r.provider.module != module]
                if kept:
                    self._claims[key] = kept
                else:
                    del self._claims[key]
            self._unloaded.add(module)
            # an unregistered custom dir can be loaded again: forget its path and its imported modules
            for path in [p for p, m in self.custom_paths.items() if m == module]:
                from ._custom_dirs import drop_modules

                del self.custom_paths[path]
                drop_modules(module)
            for key in {r.key for r in removed}:
                self._changed(key)
            trace("unregistered %s (%d registrations)", module, len(removed))
            return removed

    def prefer(self, name: str, provider: str) -> None:
        """API twin of KERNELBAY_PREFER: `provider` (distribution or module) wins slot `name`."""
        with self._lock:
            self._prefs = Preferences({**self._prefs.by_name, name: provider})
            self.rebuild()

    def export_providers(self) -> dict:
        """The external providers as module names + their registrations, for a worker process."""
        providers: dict[str, dict] = {}
        for reg in self.log():
            if reg.provider.is_builtin or reg.provider.is_fallback:  # first-party: the worker discovers them
                continue
            item = providers.setdefault(reg.provider.module, {"provider": reg.provider.to_dict(), "registrations": []})
            item["registrations"].append([reg.kind, reg.name, reg.target])
        return {
            "version": 1,
            "prefer": dict(self._prefs.by_name),
            "providers": list(providers.values()),
            "unregistered": sorted(self._unloaded),  # removals too: a worker must not re-import them
        }

    def import_providers(self, state: dict) -> None:
        """Replay an export in this process: same registry, still lazy (nothing imported now)."""
        with self._lock:
            self.discovery()  # index first: its metadata slots must not come back over the removals below
            self._prefs = Preferences({**self._prefs.by_name, **state.get("prefer", {})})
            for module in state.get("unregistered", []):
                self.unregister_provider(module)
            for item in state["providers"]:
                p = item["provider"]
                provider = Provider(p["module"], p["distribution"], p["version"], _check_origin(p["origin"]), p["path"])
                self.record(provider, [tuple(r) for r in item["registrations"]])
            self.rebuild()


# Registrations each module made while it executed, process-wide: a registry created after a
# provider was imported (reset_registry, a second Registry) replays them instead of losing them, and
# `registered_slots(obj)` reads every slot an object registered for. Keyed by (registration, id of its object) so
# a module imported twice adds nothing; the objects stay referenced here, so their ids are not reused.
_IMPORT_TIME: dict[str, dict[tuple[Registration, int], object | None]] = {}


def _remember_import_time(regs: list[Registration], objects: dict[str, object]) -> None:
    for reg in regs:
        obj = objects.get(reg.target)
        _IMPORT_TIME.setdefault(reg.provider.module, {}).setdefault((reg, id(obj)), obj)


def import_time_registrations(module: str | None = None) -> list[tuple[Registration, object | None]]:
    """(registration, object) pairs made while `module` (default: every module) executed, in order."""
    tables = _IMPORT_TIME.values() if module is None else [_IMPORT_TIME.get(module, {})]
    return [(reg, obj) for table in tables for (reg, _), obj in table.items()]


def _check_origin(origin: str) -> str:
    if origin not in Origin.ALL:
        raise ValueError(f"unknown provider origin {origin!r}; origins are: {', '.join(Origin.ALL)}")
    return origin


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown slot kind {kind!r}; kinds are: {', '.join(KINDS)}")


def _check_names(names: Iterable[str]) -> list[str]:
    names = list(names)
    if not names:
        raise ValueError("register_*: give at least one name")
    for n in names:
        if not isinstance(n, str) or not n.strip() or n != n.strip():
            raise ValueError(f"register_*: names must be non-empty strings without surrounding spaces, got {n!r}")
    return names


def _target_and_owner(target: object) -> tuple[str, str]:
    if isinstance(target, str):
        module, sep, qual = target.partition(":")
        if not sep or not module or not qual:
            raise ValueError(f"register_*: a string target must look like 'package.module:ClassName', got {target!r}")
        return target, module
    owner = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not owner or not qualname:
        raise TypeError(f"register_*: cannot register {target!r}: it has no __module__/__qualname__")
    return f"{owner}:{qualname}", owner


_dist_cache: Mapping[str, list[str]] | None = None


def _distribution_of(module: str) -> tuple[str, str] | None:
    """The installed distribution of a module no plugin's entry points name (a runtime registration's)."""
    global _dist_cache
    import importlib_metadata  # discovery's library (already imported by the scan): one reader of metadata

    if _dist_cache is None:
        _dist_cache = importlib_metadata.packages_distributions()
    names = _dist_cache.get(_top(module))
    return (names[0], importlib_metadata.version(names[0])) if names else None


def _conflict_message(slot: Slot) -> str:
    who = " and ".join(r.provider.describe() for r in slot.conflict)
    dists = [r.provider.distribution or r.provider.module for r in slot.conflict]
    return (
        f"{KIND_LABEL[slot.kind]} {slot.name!r} is claimed by two providers: {who}. Choose one with "
        f'KERNELBAY_PREFER="{slot.name}={dists[0]}" (or kernelbay.registry.prefer({slot.name!r}, '
        f"{dists[0]!r})), or uninstall/disable one of them."
    )
