"""`kernelbay doctor`, the kit's check of every installed plugin: each index entry's provider registers that name and
nothing it does not advertise, every class entry point resolves, no slot is in conflict, no preference is idle."""

from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable findings")


def _check_model_providers(reg, found) -> list[str]:
    from kernelbay.registry._records import CLASS_KINDS, MODEL_INDEX

    findings = []
    by_module: dict[str, list] = {}
    for entry in found.in_group(MODEL_INDEX):
        by_module.setdefault(entry.module, []).append(entry)
    for module, entries in sorted(by_module.items()):
        dist = entries[0].distribution
        try:
            reg.import_provider(entries[0].provider)
        except Exception as exc:  # noqa: BLE001 - reported as a finding
            findings.append(f"{dist}: provider {module} is broken: {exc}")
            continue
        advertised = {e.name for e in entries}
        registered = {r.name for r in reg.log() if r.provider.module == module and r.kind not in CLASS_KINDS}
        for name in sorted(advertised - registered):
            findings.append(f"{dist}: {module} is advertised for {name!r} ({MODEL_INDEX}) but never registers it")
        for name in sorted(registered - advertised):
            findings.append(
                f"{dist}: {module} registers {name!r} but does not advertise it in "
                f"{MODEL_INDEX}; add an entry point or it can only be found after an import"
            )
    return findings


def _check_class_targets(reg, found) -> list[str]:
    from kernelbay.registry._records import CLASS_KINDS, INDEX_GROUP

    findings = []
    for kind in CLASS_KINDS:
        group = INDEX_GROUP[kind]
        for entry in found.in_group(group):
            if ":" not in entry.value:
                findings.append(
                    f"{entry.distribution}: entry point {group} {entry.name} = {entry.value!r} "
                    "must name a class as 'module:Class'"
                )
                continue
            try:
                target = reg.resolve(kind, entry.name)
            except Exception as exc:  # noqa: BLE001 - reported as a finding
                findings.append(f"{entry.distribution}: {group} {entry.name!r}: {exc}")
                continue
            if kind == "attention_backend" and (gaps := _serves_nothing(target, entry.name)):
                findings.append(f"{entry.distribution}: warning: {gaps}")
    return findings


def _serves_nothing(backend, name: str) -> str | None:
    """Why an installed attention backend can serve no common geometry (it would never be chosen), or None (also
    for a class that is no AttentionBackend: it has no declarations to read)."""
    from kernelbay.attention import AttentionBackend
    from kernelbay.testing.claims import common_geometry_gaps, declarations_hint

    if not (isinstance(backend, type) and issubclass(backend, AttentionBackend)):
        return None
    gaps = common_geometry_gaps(backend)
    return declarations_hint(name, gaps) if gaps else None


def findings() -> list[str]:
    """Every problem `kernelbay doctor` reports, one line each (empty: the installed plugins are consistent)."""
    from kernelbay.hooks import broken_hook_plugins
    from kernelbay.registry import default_registry

    reg = default_registry()
    found = reg.discovery()
    out = found.findings() + [
        f"{p.distribution} {p.version} does not declare which kernelbay it supports; add a requirement "
        f"such as 'kernelbay>=0.1,<0.2'"
        for p in found.plugins.values()
        if p.distribution != "kernelbay" and p.requires_kernelbay is None
    ]
    out += _check_model_providers(reg, found) + _check_class_targets(reg, found)
    out += [f"{b.distribution}: hook plugin {b.name!r} is broken: {b.cause}" for b in broken_hook_plugins()]
    out += [
        f"slot {s.kind} {s.name!r}: conflict between " + " and ".join(r.provider.describe() for r in s.conflict)
        for s in reg.slots()
        if s.conflict
    ]
    # a KERNELBAY_PREFER entry naming no provider of its slot has no effect: say so
    return out + [problem for s in reg.slots() if (problem := reg.preference_problem(s))]


def run(args) -> int:
    problems = findings()
    if args.json:
        print(json.dumps({"ok": not problems, "findings": problems}, indent=2))
    elif problems:
        print(f"kernelbay doctor: {len(problems)} finding(s):")
        print("\n".join(f"  - {p}" for p in problems))
    else:
        print("kernelbay doctor: no problems found")
    return 1 if problems else 0
