"""The registration log: replay, unregister, export to a worker that stays lazy."""

from __future__ import annotations

import json
import subprocess
import sys

from kernelbay import register_model, register_platform

from .conftest import env_with_site, fixture_imports


def _state(reg):
    return {(s.kind, s.name): (s.winner, s.displaced, s.conflict) for s in reg.slots()}


def test_log_keeps_each_providers_registrations_in_decorator_order(make_registry):
    """The log lists a provider's registrations in the order its decorators ran."""
    reg = make_registry()
    reg.resolve("model", "GoodForCausalLM")
    names = [(r.kind, r.name) for r in reg.log() if r.provider.module == "kb_good.modeling"]
    assert names == [("model", "GoodForCausalLM"), ("model", "GoodLMHeadModel"), ("vision_encoder", "GoodVisionModel")]


def test_rebuild_replays_the_log_into_the_same_state(make_registry):
    """Dropping the slots and replaying the log yields the live state."""
    reg = make_registry()
    for name in ("GoodForCausalLM", "OtherForCausalLM"):
        reg.resolve("model", name)
    live = _state(reg)
    reg.rebuild()
    assert _state(reg) == live


def test_unregister_provider_gives_the_slot_back_to_the_builtin(make_registry):
    """Removing an external provider returns its slot to the built-in it displaced."""
    reg = make_registry()
    assert reg.slot("platform", "cpu").winner.provider.distribution == "kb-fixture-good"
    removed = reg.unregister_provider("kb_good.platform")
    assert [r.name for r in removed] == ["cpu"]
    slot = reg.slot("platform", "cpu")
    assert slot.winner.provider.distribution == "kernelbay" and slot.displaced == ()
    reg.rebuild()
    assert reg.slot("platform", "cpu").winner.provider.distribution == "kernelbay"


def test_unregistered_model_provider_is_not_silently_reimported(make_registry):
    """After unregister_provider, its architectures are gone until something registers them again."""
    reg = make_registry()
    reg.resolve("model", "OtherForCausalLM")
    reg.unregister_provider("kb_other.modeling")
    assert reg.slot("model", "OtherForCausalLM") is None


WORKER = r"""
import builtins, json, sys
from kernelbay.registry import default_registry, import_providers
state = json.loads(sys.stdin.read())
import_providers(state)
reg = default_registry()
before = [m for m in sys.modules if m.startswith("kb_") or m == "runtime_mod"]
cls = reg.resolve("model", sys.argv[1])
print(json.dumps({"before": before, "cls": f"{cls.__module__}:{cls.__qualname__}",
                  "slot": reg.slot("model", sys.argv[1]).to_dict()}))
"""


def test_exported_providers_rebuild_the_same_registry_lazily_in_a_worker(make_registry, fixture_site, tmp_path):
    """A worker given the external providers by module name imports none until it resolves, then matches."""
    (tmp_path / "runtime_mod.py").write_text(
        "from kernelbay import register_model\n\n@register_model('RuntimeForCausalLM')\nclass Runtime:\n    pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        reg = make_registry()
        import runtime_mod  # noqa: F401 - registers at import, outside any plugin: external, runtime

        reg.resolve("model", "GoodForCausalLM")
        state = reg.export_providers()
        assert {p["provider"]["module"] for p in state["providers"]} >= {"runtime_mod", "kb_good.modeling"}
        env = env_with_site(fixture_site, PYTHONPATH=f"{tmp_path}:{fixture_site}")
        out = subprocess.run(
            [sys.executable, "-c", WORKER, "RuntimeForCausalLM"],
            input=json.dumps(state),
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        doc = json.loads(out.stdout)
        assert doc["before"] == []
        assert doc["cls"] == "runtime_mod:Runtime"
        assert doc["slot"] == reg.slot("model", "RuntimeForCausalLM").to_dict()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("runtime_mod", None)


def test_runtime_string_registration_is_lazy_and_external(make_registry):
    """register_model(name, target="module:Class") imports nothing until resolved; the caller is the provider."""
    reg = make_registry()
    register_model("LazyForCausalLM", target="kb_other.modeling:OtherForCausalLM")
    assert fixture_imports() == []
    assert reg.resolve("model", "LazyForCausalLM").__name__ == "OtherForCausalLM"
    provider = reg.slot("model", "LazyForCausalLM").winner.provider
    assert provider.module == __name__ and provider.origin == "external"


def test_runtime_registration_of_a_builtin_class_is_external(make_registry):
    """Re-registering a first-party class at runtime takes the slot as external (DESIGN: runtime calls)."""
    reg = make_registry()
    register_platform("cpu", target="kernelbay.registry:Registry")
    slot = reg.slot("platform", "cpu")
    assert {r.provider.module for r in slot.conflict} == {__name__, "kb_good.platform"}
    reg.unregister_provider("kb_good.platform")
    slot = reg.slot("platform", "cpu")
    assert slot.winner.provider.module == __name__ and slot.winner.provider.origin == "external"
    assert [r.provider.distribution for r in slot.displaced] == ["kernelbay"]


def test_a_new_registry_sees_providers_imported_before_it(make_registry):
    """reset_registry() after a provider was imported replays that provider's registrations."""
    reg = make_registry()
    first = reg.resolve("model", "OtherForCausalLM")
    from kernelbay.registry import Registry, reset_registry

    fresh = Registry(environ=reg._env, discovery=reg.discovery())
    reset_registry(fresh)
    assert fresh.resolve("model", "OtherForCausalLM") is first
    assert fixture_imports() == ["kb_other.modeling"]
