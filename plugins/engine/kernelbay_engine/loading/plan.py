"""Which checkpoint tensor fills which model parameter (and which rows of it), checked before any read."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from torch import nn

from kernelbay_engine.loading.checkpoint import CheckpointError


@dataclass(frozen=True, slots=True)
class Target:
    """Parameter `param` (dotted path in the model), at `index` (() for all of it)."""

    param: str
    index: tuple = ()
    transposed: bool = False  # the checkpoint holds this 2-D weight as [in, out] (GPT-2's Conv1D)
    source: tuple[SourcePiece, ...] = ()  # a rank's share: pieces of the checkpoint tensor (); () reads all of it


@dataclass(frozen=True, slots=True)
class SourcePiece:
    """Checkpoint tensor [..., start : start + length, ...] along `dim` (checkpoint coordinates) into the same axis of
    the destination at `dest_start` (tensor parallelism: a rank reads only its slice)."""

    dim: int
    start: int
    length: int
    dest_start: int = 0


_NONE = Target("")


@dataclass
class LoadPlan:
    """checkpoint name -> Target, for every tensor that will be read."""

    assignments: dict[str, Target] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # ignored by the family (e.g. DeepSeek's MTP layer)


@dataclass(frozen=True, slots=True)
class NameRules:
    """A family's checkpoint naming: renames applied to checkpoint names, and names to ignore."""

    renames: Sequence[tuple[str, str]] = ()  # (regex, replacement), applied in order
    ignore: Sequence[str] = ()  # regexes (fullmatch) of checkpoint tensors that have no place in the model
    tied: Sequence[str] = ()  # checkpoint names that duplicate a tied parameter (skipped when present)

    def rename(self, name: str) -> str:
        for pattern, repl in self.renames:
            name = re.sub(pattern, repl, name)
        return name

    def ignored(self, name: str) -> bool:
        return name in self.tied or any(re.fullmatch(p, name) for p in self.ignore)


def _direct_and_aliases(model: nn.Module) -> tuple[dict[str, Target], dict[str, list[str]]]:
    """Direct names (param paths) and, per param, the alias checkpoint names that together fill it."""
    direct = {name: Target(name) for name, _ in model.named_parameters()}
    aliases_of: dict[str, list[str]] = {}
    alias_targets: dict[str, Target] = {}
    for path, module in model.named_modules():
        if getattr(module, "checkpoint_transposed", False):
            weight = f"{path}.weight" if path else "weight"
            direct[weight] = Target(weight, transposed=True)
        hook = getattr(module, "checkpoint_aliases", None)
        if hook is None:
            continue
        for ckpt_name, (param, index) in hook(path).items():
            full = f"{path}.{param}" if path else param
            alias_targets[ckpt_name] = Target(full, index)
            aliases_of.setdefault(full, []).append(ckpt_name)
    direct.update(alias_targets)
    return direct, aliases_of


def _held(model: nn.Module) -> set[str]:
    """Weights a layer's method already holds itself (a linear quantized before loading): nothing to read.
    A merged layer's parts too, under the names its `checkpoint_aliases` would give them (`parent.part.weight`)."""
    held = set()
    for path, module in model.named_modules():
        if getattr(getattr(module, "method", None), "holds_weight", False):
            parent = path.rpartition(".")[0]
            held.add(f"{path}.weight")
            held.update(f"{parent}.{part}.weight" for part in getattr(module, "part_rows", dict)())
    return held


def make_plan(model: nn.Module, names: Iterable[str], rules: NameRules) -> LoadPlan:
    """Map every checkpoint name; raise one error naming all unexpected and all missing tensors.

    Tensors of weights a layer already holds (`method.holds_weight`: quantized before loading) are skipped."""
    targets, aliases_of = _direct_and_aliases(model)
    held = _held(model)
    plan, unexpected = LoadPlan(), []
    for name in names:
        mapped = rules.rename(name)
        if rules.ignored(name) or rules.ignored(mapped) or mapped in held or targets.get(mapped, _NONE).param in held:
            plan.skipped.append(name)
        elif mapped in targets:
            plan.assignments[name] = targets[mapped]
        else:
            unexpected.append(name)
    filled = {rules.rename(n) for n, t in plan.assignments.items() if t.index != ()}  # alias names, renamed
    missing = _missing(model, plan, aliases_of, filled, held)
    if unexpected or missing:
        raise CheckpointError(_mismatch_message(unexpected, missing))
    return plan


def _missing(
    model: nn.Module, plan: LoadPlan, aliases_of: dict[str, list[str]], by_alias: set[str], held: set[str]
) -> list[str]:
    """Parameters neither held by their layer, nor loaded whole, nor through all of their aliases (reported by
    checkpoint name).

    by_alias: the alias names filled, after the family's renames (OPT's `decoder.*` -> `model.decoder.*`)."""
    whole = {t.param for t in plan.assignments.values() if t.index == ()}
    missing = []
    for name, _ in model.named_parameters():
        if name in whole or name in held:
            continue
        expected = aliases_of.get(name, [])
        absent = [a for a in expected if a not in by_alias]
        if not expected:
            missing.append(name)
        elif absent:
            missing.extend(absent if len(absent) < len(expected) else [f"{name} (or {', '.join(expected)})"])
    return missing


def _mismatch_message(unexpected: list[str], missing: list[str]) -> str:
    lines = ["the checkpoint does not match the model:"]
    if missing:
        lines.append(f"  missing tensors ({len(missing)}): " + ", ".join(missing))
    if unexpected:
        lines.append(f"  unexpected tensors ({len(unexpected)}): " + ", ".join(unexpected))
    lines.append("  (is config.json's architecture right for these weights, and is the folder complete?)")
    return "\n".join(lines)
