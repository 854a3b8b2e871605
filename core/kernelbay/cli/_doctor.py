"""`kernelbay doctor`: every index entry's provider registers that name and nothing it does not advertise."""

from __future__ import annotations

import json

MODELS = "kernelbay.models"  # the module index of every model kind; each other kind's group names classes


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable findings")


def _check_model_providers(reg, found) -> list[str]:
    from kernelbay.registry._records import INDEX_GROUP

    model_kinds = {kind for kind, group in INDEX_GROUP.items() if group == MODELS}
    findings = []
    modules: dict[str, set[str]] = {}
    for entry in found.in_group(MODELS):
        modules.setdefault(entry.module, set()).add(entry.name)
    for module, advertised in sorted(modules.items()):
        entry = next(e for e in found.in_group(MODELS) if e.module == module)
        try:
            reg.import_provider(reg.provider_of_entry(entry))
        except Exception as exc:  # noqa: BLE001 - reported as a finding
            findings.append(f"{entry.distribution}: provider {module} is broken: {exc}")
            continue
        registered = {r.name for r in reg.log() if r.provider.module == module and r.kind in model_kinds}
        for name in sorted(advertised - registered):
            findings.append(
                f"{entry.distribution}: {module} is advertised for {name!r} ({MODELS}) but never registers it"
            )
        for name in sorted(registered - advertised):
            findings.append(
                f"{entry.distribution}: {module} registers {name!r} but does not advertise it in "
                f"{MODELS}; add an entry point or it can only be found after an import"
            )
    return findings


def _check_class_targets(reg, found) -> list[str]:
    from kernelbay.registry._records import INDEX_GROUP

    findings = []
    for kind, group in INDEX_GROUP.items():
        if group == MODELS:  # modules, not classes: _check_model_providers
            continue
        for entry in found.in_group(group):
            if ":" not in entry.value:
                findings.append(
                    f"{entry.distribution}: entry point {group} {entry.name} = {entry.value!r} "
                    "must name a class as 'module:Class'"
                )
                continue
            try:
                reg.resolve(kind, entry.name)
            except Exception as exc:  # noqa: BLE001 - reported as a finding
                findings.append(f"{entry.distribution}: {group} {entry.name!r}: {exc}")
    return findings


def _check_hook_plugins() -> list[str]:
    from kernelbay.hooks import broken_hook_plugins

    return [f"{b.distribution}: hook plugin {b.name!r} is broken: {b.cause}" for b in broken_hook_plugins()]


def _check_versions(found) -> list[str]:
    return [
        f"{p.distribution} {p.version} does not declare which kernelbay it supports; add a requirement "
        f"such as 'kernelbay>=0.1,<0.2'"
        for p in found.plugins.values()
        if p.distribution != "kernelbay" and p.requires_kernelbay is None
    ]


def findings() -> list[str]:
    from kernelbay.registry import default_registry

    reg = default_registry()
    found = reg.discovery()
    out = found.findings() + _check_versions(found)
    out += _check_model_providers(reg, found) + _check_class_targets(reg, found) + _check_hook_plugins()
    out += [
        f"slot {s.kind} {s.name!r}: conflict between " + " and ".join(r.provider.describe() for r in s.conflict)
        for s in reg.slots()
        if s.conflict
    ]
    return out + _check_preferences(reg)


def _check_preferences(reg) -> list[str]:
    """A KERNELBAY_PREFER entry naming no provider of its slot has no effect: say so."""
    return [problem for s in reg.slots() if (problem := reg.preference_problem(s))]


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
