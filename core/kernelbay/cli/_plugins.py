"""`kernelbay plugins [--log] [--json]`: what is installed, who holds each slot, what is broken.

Reads metadata only: no plugin module is imported (slots of unimported providers are "indexed"), so a
provider that fails to import is not found here: "broken" lists only what already failed in this process,
and `imports_checked` is false; `kernelbay doctor` imports every provider and reports the broken ones.
"""

from __future__ import annotations

import json

NOT_CHECKED = "(providers not imported; run `kernelbay doctor` to find the ones that fail to import)"


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--log", action="store_true", help="include the registration log, in order")


def report(include_log: bool) -> dict:
    from kernelbay._version import __version__
    from kernelbay.registry import default_registry

    reg = default_registry()
    found = reg.discovery()
    doc = {
        "kernelbay_version": __version__,
        "plugins": [p.to_dict() for p in sorted(found.plugins.values(), key=lambda p: p.distribution)],
        "slots": [{**slot.to_dict(), "state": state, "covers": _covers(slot)} for slot, state in reg.indexed_slots()],
        "broken": [b.to_dict() for b in reg.broken()],
        "imports_checked": False,  # nothing is imported here: run `kernelbay doctor` to find broken providers
        "findings": found.findings(),
    }
    if include_log:
        doc["log"] = [r.to_dict() for r in reg.log()]
    return doc


def _covers(slot) -> str | None:
    """What a fallback's "*" slot covers, in words (None for every other slot)."""
    from kernelbay.registry._records import ANY_ARCHITECTURE, FALLBACK_DISTRIBUTIONS, normalize_dist

    if slot.name != ANY_ARCHITECTURE or slot.winner is None or not slot.winner.provider.is_fallback:
        return None
    what = FALLBACK_DISTRIBUTIONS.get(normalize_dist(slot.winner.provider.distribution or ""), "any architecture")
    return f"{what}, where no other installed plugin provides it"


def _who(reg: dict) -> str:
    p = reg["provider"]
    where = f"{p['distribution']} {p['version']}" if p["distribution"] else (p["path"] or "runtime")
    return f"{reg['target']} [{where}, {p['origin']}]"


def _slot_line(slot: dict) -> str:
    head = f"  {slot['kind']:<17} {slot['name']:<28} "
    if slot["conflict"]:
        return head + "CONFLICT: " + " vs ".join(_who(r) for r in slot["conflict"])
    line = head + _who(slot["winner"]) + (" (not imported yet)" if slot["state"] == "indexed" else "")
    for loser in slot["displaced"]:
        line += f"\n  {'':<17} {'':<28}   displaced {_who(loser)}"
    if slot.get("covers"):
        line += f"\n  {'':<17} {'':<28}   covers {slot['covers']}"
    return line


def _plugin_line(p: dict) -> str:
    groups = "; ".join(f"{g.split('.')[-1]}: {', '.join(n)}" for g, n in p["entry_points"].items())
    state = f"  REFUSED: {p['refused']}" if p["refused"] else ""
    requires = p["requires_kernelbay"] or " (any)"
    return f"  {p['distribution']} {p['version']} ({p['origin']}, requires kernelbay{requires}){state}\n      {groups}"


def render(doc: dict) -> str:
    lines = [f"kernelbay {doc['kernelbay_version']}", "", "Plugins:"]
    lines += [_plugin_line(p) for p in doc["plugins"]] or ["  (none)"]
    lines += ["", "Slots:"] + ([_slot_line(s) for s in doc["slots"]] or ["  (none)"])
    if doc["broken"]:
        lines += ["", "Broken plugins:"] + [f"  {b['provider']['module']}: {b['cause']}" for b in doc["broken"]]
        lines.append(f"  {NOT_CHECKED}")
    else:
        lines += ["", f"Broken plugins: none found {NOT_CHECKED}"]
    if doc["findings"]:
        lines += ["", "Findings:"] + [f"  {f}" for f in doc["findings"]]
    if "log" in doc:
        lines += ["", "Registration log:"]
        lines += [f"  {i:>3}. {r['kind']} {r['name']} -> {_who(r)}" for i, r in enumerate(doc["log"], 1)]
    return "\n".join(lines)


def run(args) -> int:
    doc = report(args.log)
    print(json.dumps(doc) if args.json else render(doc))
    return 0
