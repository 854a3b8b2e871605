"""`kernelbay plugins` and `kernelbay doctor` as a user runs them (subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import env_with_site


def _cli(site, *args, **env):
    return subprocess.run(
        [sys.executable, "-m", "kernelbay.cli", *args], capture_output=True, text=True, env=env_with_site(site, **env)
    )


def test_plugins_json_lists_plugins_slots_provenance_and_refusals(fixture_site):
    """The JSON names each plugin, the slot winners with what they displaced, and refused plugins."""
    out = _cli(fixture_site, "plugins", "--json", "--log")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    plugins = {p["distribution"]: p for p in doc["plugins"]}
    assert plugins["kb-fixture-good"]["origin"] == "external"
    assert "requires kernelbay<0.1" in plugins["kb-fixture-badversion"]["refused"]
    cpu = next(s for s in doc["slots"] if s["kind"] == "platform" and s["name"] == "cpu")
    assert cpu["winner"]["provider"]["distribution"] == "kb-fixture-good"
    assert cpu["displaced"][0]["provider"]["distribution"] == "kernelbay"
    conflict = next(s for s in doc["slots"] if s["name"] == "ConflictForCausalLM")
    assert conflict["state"] == "indexed" and len(conflict["conflict"]) == 2
    assert any(r["name"] == "cpu" for r in doc["log"])


def test_plugins_text_marks_indexed_slots_and_conflicts(fixture_site):
    """The human view shows unimported providers and conflicts plainly."""
    out = _cli(fixture_site, "plugins")
    assert out.returncode == 0
    assert "GoodForCausalLM" in out.stdout and "(not imported yet)" in out.stdout
    assert "CONFLICT:" in out.stdout
    assert "REFUSED: kb-fixture-badversion 1.0 requires kernelbay<0.1" in out.stdout


def test_doctor_lists_every_finding_and_exits_nonzero(fixture_site):
    """doctor reports the liar, the broken plugins (hooks too), the conflict and the refused plugin."""
    out = _cli(
        fixture_site,
        "doctor",
        KERNELBAY_PLUGINS="kb-fixture-liar,kb-fixture-syntax,kb-fixture-badversion,"
        "kb-fixture-conflict-a,kb-fixture-conflict-b,"
        "kb-fixture-missingdep",
    )
    assert out.returncode == 1
    text = out.stdout
    assert "kb_liar.modeling is advertised for 'LiarForCausalLM' (kernelbay.models) but never registers it" in text
    assert "kb_liar.modeling registers 'UnadvertisedForCausalLM' but does not advertise it" in text
    assert "kb-fixture-syntax: provider kb_syntax.modeling is broken: syntax error" in text
    assert "kb-fixture-badversion 1.0 refused" in text
    assert "slot model 'ConflictForCausalLM': conflict between" in text
    assert "kb-fixture-missingdep: hook plugin 'missingdep' is broken" in text


def test_doctor_is_clean_with_a_good_plugin_only(fixture_site):
    """With only well-behaved plugins (and the core) doctor finds nothing for them."""
    out = _cli(fixture_site, "doctor", "--json", KERNELBAY_PLUGINS="kb-fixture-other")
    findings = json.loads(out.stdout)["findings"]
    assert not [f for f in findings if "kb-fixture" in f], findings


def test_trace_logs_discovery_imports_and_registrations(fixture_site):
    """KERNELBAY_TRACE=1 logs each discovery, import and registration on stderr."""
    out = _cli(fixture_site, "doctor", KERNELBAY_TRACE="1", KERNELBAY_PLUGINS="kb-fixture-other")
    assert "[kernelbay] discovered kb-fixture-other 1.0 (external): enabled" in out.stderr
    assert "[kernelbay] import kb_other.modeling (kb-fixture-other 1.0, external)" in out.stderr
    assert "[kernelbay] register model 'OtherForCausalLM' -> kb_other.modeling:OtherForCausalLM" in out.stderr


def test_unknown_command_prints_help():
    """No subcommand prints help and exits 2."""
    out = subprocess.run([sys.executable, "-m", "kernelbay.cli"], capture_output=True, text=True)
    assert out.returncode == 2 and "plugins" in out.stdout


def test_a_plugin_calling_sys_exit_is_a_doctor_finding_not_the_exit_code(fixture_site):
    """doctor imports every provider: one that calls sys.exit(3) is listed broken (doctor's own exit 1, not 3)."""
    out = _cli(fixture_site, "doctor", KERNELBAY_PLUGINS="kb-fixture-exits")
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    assert "kb-fixture-exits: provider kb_exits.modeling is broken: provider kb_exits.modeling" in out.stdout
    assert "called sys.exit(3)" in out.stdout
