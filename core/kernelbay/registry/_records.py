"""Immutable records of the registry and the precedence rule that turns them into slots."""

from __future__ import annotations

import functools
import os
import sys
from collections import namedtuple
from collections.abc import Iterable, Mapping

# Slot kinds: the entry-point group whose index names their providers, and the word messages use for a
# name. Vision encoders and draft models are model modules, so they share the `kernelbay.models` index.
KIND_INFO = {
    "model": ("kernelbay.models", "architecture"),
    "vision_encoder": ("kernelbay.models", "vision encoder"),
    "draft_model": ("kernelbay.models", "draft model"),
    "attention_backend": ("kernelbay.attention_backends", "attention backend"),
    "moe_backend": ("kernelbay.moe_backends", "MoE backend"),
    "platform": ("kernelbay.platforms", "platform"),
    "config": ("kernelbay.configs", "model_type"),
    "weight_format": ("kernelbay.weight_formats", "weight format"),
}
KINDS = tuple(KIND_INFO)
INDEX_GROUP = {kind: group for kind, (group, _) in KIND_INFO.items()}
KIND_LABEL = {kind: label for kind, (_, label) in KIND_INFO.items()}
MODEL_INDEX = "kernelbay.models"  # names provider modules; the other kinds' groups name classes (slots from metadata)
CLASS_KINDS = tuple(kind for kind, group in INDEX_GROUP.items() if group != MODEL_INDEX)
GROUPS = (*dict.fromkeys(INDEX_GROUP.values()), "kernelbay.hooks", "kernelbay.commands")

# What the first-party plugins (this repository's plugins/*) are and provide, generated from their pyproject.toml
# entry points by tools/first_party_table.py: named in "pip install ..." hints whether installed or not.
FIRST_PARTY_TABLE = os.path.join(os.path.dirname(__file__), "first_party.json")


@functools.cache
def _first_party() -> dict:
    import json

    with open(FIRST_PARTY_TABLE, encoding="utf-8") as file:
        return json.load(file)


def first_party_provides(kind: str) -> dict[str, str]:
    """Names of `kind` the first-party plugins provide -> the distribution, installed or not."""
    return dict(_first_party()["provides"].get(kind, {}))


# First-party distributions ranked below built-in ("fallback"): a claim of theirs fills a slot only when no
# other provider claims it. The value says what their "*" (any architecture) model claim covers.
FALLBACK_DISTRIBUTIONS = {"kernelbay-transformers": "any architecture transformers implements"}
ANY_ARCHITECTURE = "*"  # the model slot name of a fallback's claim on every architecture


class Origin:
    """Where a registration comes from (plain strings: they travel through JSON to workers)."""

    BUILTIN = "built-in"
    EXTERNAL = "external"
    CUSTOM_DIR = "custom-dir"
    FALLBACK = "fallback"  # below built-in: never displaces another provider
    ALL = (BUILTIN, EXTERNAL, CUSTOM_DIR, FALLBACK)


def normalize_dist(name: str) -> str:
    """PEP 503 normalisation, so `Kernelbay_Acme` and `kernelbay-acme` are one distribution."""
    return "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))


def origin_of(distribution: str | None) -> str:
    name = normalize_dist(distribution or "")
    if name in FALLBACK_DISTRIBUTIONS:
        return Origin.FALLBACK
    # built-in registrations only ever fill empty slots: the core's and the first-party plugins'
    return Origin.BUILTIN if name == "kernelbay" or name in _first_party()["distributions"] else Origin.EXTERNAL


# Immutable records are named tuples rather than dataclasses: `kernelbay plugins` must start fast,
# and `dataclasses` pulls in `inspect` and `ast`.
class Provider(
    namedtuple("Provider", "module distribution version origin path", defaults=(None, None, Origin.EXTERNAL, None))
):
    """Who registered: the provider module and where it comes from (`path` for custom dirs)."""

    __slots__ = ()

    @property
    def is_builtin(self) -> bool:
        return self.origin == Origin.BUILTIN

    @property
    def is_fallback(self) -> bool:
        return self.origin == Origin.FALLBACK

    def describe(self) -> str:
        where = f"{self.distribution} {self.version}" if self.distribution else (self.path or "no distribution")
        return f"{self.module} ({where}, {self.origin})"

    def to_dict(self) -> dict:
        return self._asdict()


class Registration(namedtuple("Registration", "kind name target provider")):
    """One claim on one slot: `kind`/`name` -> `target` ("module:qualname"), by `provider`."""

    __slots__ = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.name)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "target": self.target, "provider": self.provider.to_dict()}


class Slot(namedtuple("Slot", "kind name winner displaced conflict", defaults=((), ()))):
    """The outcome for one (kind, name): the winner, whom it displaced, or a conflict."""

    __slots__ = ()

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "winner": self.winner.to_dict() if self.winner else None,
            "displaced": [r.to_dict() for r in self.displaced],
            "conflict": [r.to_dict() for r in self.conflict],
        }


def split_preferences(text: str) -> tuple[dict[str, str], list[str]]:
    """The Name=distribution pairs of a KERNELBAY_PREFER value, and what is malformed in it, in words."""
    pairs, problems = {}, []
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, who = item.partition("=")
        if not sep or not name.strip() or not who.strip():
            problems.append(
                f"KERNELBAY_PREFER entry {item!r} is not of the form Name=distribution; write e.g. "
                'KERNELBAY_PREFER="LlamaForCausalLM=kernelbay-llama,FLASH=my-dist" (comma-separated)'
            )
            continue
        pairs[name.strip()] = who.strip()
    return pairs, problems


class Preferences:
    """`KERNELBAY_PREFER="Arch=dist,..."`: which provider wins a slot claimed twice."""

    __slots__ = ("by_name",)

    def __init__(self, by_name: Mapping[str, str] | None = None):
        self.by_name = dict(by_name or {})

    @classmethod
    def parse(cls, text: str) -> Preferences:
        """The pairs of `text`; a malformed entry is skipped and reported on stderr (discovery lists it as a
        finding): the variable is read while the registry is built, and a typo must not break every command."""
        pairs, problems = split_preferences(text)
        for problem in problems:
            print(f"kernelbay: warning: {problem}; the entry is ignored", file=sys.stderr)
        return cls(pairs)

    def pick(self, name: str, candidates: Iterable[Registration]) -> Registration | None:
        who = self.by_name.get(name)
        if who is None:
            return None
        for reg in candidates:
            dist = reg.provider.distribution
            if who == reg.provider.module or (dist and normalize_dist(dist) == normalize_dist(who)):
                return reg
        return None


def _one_per_provider(regs: Iterable[Registration]) -> list[Registration]:
    """A provider that claims a slot twice keeps its last claim (its decorator order)."""
    latest: dict[str, Registration] = {}
    for reg in regs:
        latest[reg.provider.module] = reg
    return sorted(latest.values(), key=lambda r: r.provider.module)


def decide(kind: str, name: str, regs: Iterable[Registration], prefs: Preferences) -> Slot:
    """The precedence rule. Depends on the *set* of claims only, never on their order."""
    claims = _one_per_provider(regs)
    # an explicit preference wins over the built-in/external rule: "Arch=<built-in dist>" is honoured
    winner = prefs.pick(name, claims)
    if winner is None:
        ranked = [r for r in claims if not r.provider.is_fallback] or claims  # a fallback wins only unopposed
        contenders = [r for r in ranked if not r.provider.is_builtin] or ranked  # external before built-in
        if len(contenders) != 1:  # no claim, or two that nothing ranks apart
            return Slot(kind, name, None, conflict=tuple(contenders))
        winner = contenders[0]
    return Slot(kind, name, winner, tuple(r for r in claims if r is not winner))
