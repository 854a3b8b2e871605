"""Installed for real and discovered through entry points: kernelbay-acme (external) takes the slots it claims
from the built-ins; without it (unregistered, or a process where it is not installed) the built-ins are back."""

from __future__ import annotations

import logging

import pytest

from kernelbay import resolve
from kernelbay.attention import AttentionRequirements, select_attention_backend
from kernelbay.platforms import current_platform
from kernelbay.registry import names, rebuild, slot_info, unregister_provider

from .conftest import REPO, run_kernelbay

# slot -> the acme distribution holding it: the kernel vendor's package needs only the contract, its model the runtime
ACME_SLOTS = {
    ("model", "LlamaForCausalLM"): "kernelbay-acme-llama",
    ("platform", "acme"): "kernelbay-acme",
    ("attention_backend", "ACME_INT8"): "kernelbay-acme",
}
BUILTIN_DISTS = {"kernelbay-torch", "kernelbay-llama", "kernelbay-deepseek", "kernelbay-flashinfer"}


def test_every_plugin_is_discovered_with_its_origin(make_registry):
    """The installed sites' distributions are found from metadata: first-party built-in, acme external."""
    found = make_registry().discovery().plugins
    assert {d: found[d].origin for d in BUILTIN_DISTS} == dict.fromkeys(BUILTIN_DISTS, "built-in")
    acme, acme_llama = found["kernelbay-acme"], found["kernelbay-acme-llama"]
    assert acme.origin == acme_llama.origin == "external" and acme.refused is acme_llama.refused is None
    assert acme.groups == {"kernelbay.platforms": ["acme"], "kernelbay.attention_backends": ["ACME_INT8"]}
    assert acme_llama.groups == {"kernelbay.models": ["LlamaForCausalLM"]}


def test_acme_takes_the_llama_slot_from_the_builtin(make_registry, caplog):
    """External acme wins LlamaForCausalLM over built-in kernelbay-llama, with provenance and one WARNING."""
    make_registry()
    with caplog.at_level(logging.WARNING, logger="kernelbay"):
        cls = resolve("model", "LlamaForCausalLM")
    assert f"{cls.__module__}:{cls.__qualname__}" == "kernelbay_acme_llama.modeling:AcmeLlamaForCausalLM"
    slot = slot_info("model", "LlamaForCausalLM")
    assert (slot["winner"]["provider"]["distribution"], slot["winner"]["provider"]["origin"]) == (
        "kernelbay-acme-llama",
        "external",
    )
    assert [(d["provider"]["distribution"], d["provider"]["origin"]) for d in slot["displaced"]] == [
        ("kernelbay-llama", "built-in")
    ]
    warnings = [r.getMessage() for r in caplog.records if "takes the slot" in r.getMessage()]
    assert (
        len(warnings) == 1
        and "kernelbay_acme_llama.modeling" in warnings[0]
        and "kernelbay_llama.modeling" in warnings[0]
    )
    assert resolve("model", "MistralForCausalLM").__module__ == "kernelbay_llama.modeling"  # acme did not claim it


def test_acme_holds_every_slot_it_claims(make_registry):
    """Platform acme and backend ACME_INT8 come from kernelbay-acme, Acme's Llama from kernelbay-acme-llama."""
    make_registry()
    for (kind, name), distribution in ACME_SLOTS.items():
        resolve(kind, name)
        assert slot_info(kind, name)["winner"]["provider"]["distribution"] == distribution, (kind, name)


def test_unregistering_acme_gives_the_slots_back(make_registry):
    """After acme's providers are unregistered and the registry rebuilt, the built-ins hold the slots again."""
    make_registry()
    resolve("model", "LlamaForCausalLM")
    for module in ("kernelbay_acme_llama.modeling", "kernelbay_acme.platform", "kernelbay_acme.backend"):
        unregister_provider(module)
    rebuild()
    assert resolve("model", "LlamaForCausalLM").__module__ == "kernelbay_llama.modeling"
    assert slot_info("model", "LlamaForCausalLM")["winner"]["provider"]["origin"] == "built-in"
    assert slot_info("platform", "acme", load=False) is None
    assert slot_info("attention_backend", "ACME_INT8", load=False) is None


def test_without_acme_installed_the_builtins_hold_the_slots(make_registry):
    """A registry over an environment without kernelbay-acme has no trace of it."""
    make_registry(with_acme=False)
    assert resolve("model", "LlamaForCausalLM").__module__ == "kernelbay_llama.modeling"
    assert slot_info("model", "LlamaForCausalLM")["displaced"] == []
    assert "acme" not in names("platform")


def test_plugins_command_shows_the_displacement(sites):
    """`kernelbay plugins` (metadata only) shows acme holding LlamaForCausalLM and the built-in it displaced."""
    done = run_kernelbay(sites, "plugins")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["model", "LlamaForCausalLM"])
    assert "kernelbay_acme_llama.modeling [kernelbay-acme-llama 0.1.0, external]" in lines[at]
    assert "displaced kernelbay_llama.modeling [kernelbay-llama 0.1.0, built-in]" in lines[at + 1]
    assert "kernelbay-acme 0.1.0 (external, requires kernelbay<0.2,>=0.1)" in done.stdout


def test_plugins_command_without_acme(sites):
    """In a process where acme is not installed, `kernelbay plugins` shows the built-in Llama, nothing displaced."""
    done = run_kernelbay(sites, "plugins", "--json", with_acme=False)
    import json

    doc = json.loads(done.stdout)
    slot = next(s for s in doc["slots"] if (s["kind"], s["name"]) == ("model", "LlamaForCausalLM"))
    assert slot["winner"]["provider"]["distribution"] == "kernelbay-llama" and slot["displaced"] == []
    assert "kernelbay-acme" not in {p["distribution"] for p in doc["plugins"]}


@pytest.mark.slow
def test_doctor_is_clean_with_acme_installed(sites):
    """`kernelbay doctor` imports every provider of every installed plugin (acme included) and finds nothing."""
    done = run_kernelbay(sites, "doctor")
    assert (done.returncode, done.stdout.strip()) == (0, "kernelbay doctor: no problems found"), (
        done.stdout + done.stderr
    )


def test_acme_backend_is_chosen_on_the_acme_platform_with_reasons(make_registry, monkeypatch):
    """On the acme platform ACME_INT8 wins by priority; every other candidate says why it was not chosen."""
    monkeypatch.setenv("ACME_VISIBLE_DEVICES", "0")
    make_registry()
    assert current_platform().name == "acme"
    result = select_attention_backend(AttentionRequirements(head_size=64, dtype="bfloat16"))
    reasons = {c.name: (c.reason, c.failures) for c in result.candidates}
    assert (result.backend_name, result.platform) == ("ACME_INT8", "acme")
    assert reasons["ACME_INT8"] == ("first capable candidate in priority order", ())
    assert reasons["SDPA"] == ("capable, but ACME_INT8 comes first", ())
    assert reasons["FLASHINFER"][0] == "not capable"
    assert "platform: acme is not supported (supported: cuda)" in reasons["FLASHINFER"][1]


def test_acme_declines_layers_it_cannot_run_and_the_next_in_priority_serves_them(make_registry, monkeypatch):
    """A chunked-attention layer group on acme goes to SDPA (next in acme's priority), with ACME_INT8's reason."""
    monkeypatch.setenv("ACME_VISIBLE_DEVICES", "0")
    make_registry()
    result = select_attention_backend(AttentionRequirements(head_size=64, attn_type="chunked_attention"))
    acme = next(c for c in result.candidates if c.name == "ACME_INT8")
    assert result.backend_name in ("SDPA", "VANILLA")
    assert acme.failures == ("chunked_attention: chunked attention is not supported",)


def test_off_acme_the_platform_is_cpu_and_acme_declines(make_registry, monkeypatch):
    """Without ACME_VISIBLE_DEVICES the platform is cpu and ACME_INT8 is refused for its platform."""
    monkeypatch.delenv("ACME_VISIBLE_DEVICES", raising=False)
    make_registry()
    result = select_attention_backend(AttentionRequirements(head_size=64))
    assert result.platform == "cpu" and result.backend_name == "CPU_PAGED"
    acme = next(c for c in result.candidates if c.name == "ACME_INT8")
    assert acme.failures == ("platform: cpu is not supported (supported: acme)",)


@pytest.mark.slow
def test_explain_shows_acme_chosen_and_why_not_the_others(sites):
    """`kernelbay explain` on the acme platform: acme's Llama (displacing the built-in), ACME_INT8 for every
    layer, and for each other backend the reason it was not chosen."""
    import json

    done = run_kernelbay(
        sites, "explain", str(REPO / "plugins/engine/kernelbay_engine/demo"), "--json", ACME_VISIBLE_DEVICES="0"
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["provider"]["distribution"], doc["provider"]["origin"]) == ("kernelbay-acme-llama", "external")
    assert [d["distribution"] for d in doc["provider"]["displaced"]] == ["kernelbay-llama"]
    attention = doc["attention"]
    assert attention["platform"] == "acme" and [g["backend"] for g in attention["layer_groups"]] == ["ACME_INT8"]
    candidates = {c["name"]: c for c in attention["layer_groups"][0]["candidates"]}
    assert candidates["ACME_INT8"]["chosen"]
    assert candidates["SDPA"]["reason"] == "capable, but ACME_INT8 comes first"
    assert "platform: acme is not supported (supported: cuda)" in candidates["FLASHINFER"]["failures"]


@pytest.mark.slow
def test_explain_and_run_agree_on_a_declining_provider(sites):
    """On a plain CPU acme's Llama declines (NoTarget): explain names the built-in Llama as the provider and the
    decline as its note, in the words `run` warns with, and run falls back to that same provider."""
    import json

    demo = str(REPO / "plugins/engine/kernelbay_engine/demo")
    doc = json.loads(run_kernelbay(sites, "explain", demo, "--json").stdout)
    assert (doc["provider"]["distribution"], doc["provider"]["origin"]) == ("kernelbay-llama", "built-in")
    note = doc["provider"]["note"]
    assert note.startswith("kernelbay_acme_llama.modeling (kernelbay-acme-llama 0.1.0, external) declined ")
    assert note.endswith(
        "falling back to the default implementation kernelbay_llama.modeling (kernelbay-llama 0.1.0, built-in)"
    )
    text = run_kernelbay(sites, "explain", demo).stdout
    assert "provider     kernelbay_llama.modeling (kernelbay-llama 0.1.0, built-in)" in text and note in text
    done = run_kernelbay(sites, "run", demo, "--prompt", "A", "--max-tokens", "2")
    assert done.returncode == 0 and note in done.stderr, done.stderr
