"""Plugin-host semantics: blocked stays blocked, workers mirror the parent, no silent fallback around plugins."""

from __future__ import annotations

import importlib
import json
import pickle
import subprocess
import sys

import pytest

import kernelbay.models
from kernelbay import register_model
from kernelbay.attention import AttentionRequirements, clear_selection_cache, select_attention_backend
from kernelbay.errors import UnknownNameError
from kernelbay.platforms import current_platform
from kernelbay.registry import Registry, default_registry, load_custom_module_dirs, reset_registry
from kernelbay.registry._discovery import discover
from kernelbay.testing.doctor import findings as doctor_findings

REFUSALS = [
    ({"KERNELBAY_DISABLE_PLUGINS": "kb-fixture-other"}, "kb_other.modeling", "OtherForCausalLM", "DISABLE"),
    ({"KERNELBAY_PLUGINS": "kb-fixture-good"}, "kb_other.modeling", "OtherForCausalLM", "not in KERNELBAY_PLUGINS"),
    ({}, "kb_oldapi.modeling", "OldApiForCausalLM", "requires kernelbay<0.1"),
]


@pytest.mark.parametrize(("env", "module", "name", "why"), REFUSALS, ids=["disabled", "not-allowed", "core-range"])
def test_refused_distribution_imported_by_hand_takes_no_slot(make_registry, caplog, env, module, name, why):
    """Importing a refused distribution's module registers nothing, and the warning names the plugin and why."""
    reg = make_registry(**env)
    with caplog.at_level("WARNING", logger="kernelbay"):
        importlib.import_module(module)
    assert reg.slot("model", name) is None
    assert name not in reg.names("model")
    assert f"registered by {module}" in caplog.text and why in caplog.text


def _custom_file(tmp_path, stem: str, arch: str):
    path = tmp_path / f"{stem}.py"
    path.write_text(f"from kernelbay import register_model\n\n\n@register_model({arch!r})\nclass Custom:\n    pass\n")
    return path


WORKER = """
import json, pickle, sys
import kernelbay.registry as r
state = pickle.loads(pickle.dumps(json.loads(sys.stdin.read())))
r.import_providers(state)
print(r.resolve("model", "WorkerCustomForCausalLM").__name__, "SDPA" in r.names("attention_backend"))
"""


def test_custom_dir_provider_and_removed_builtin_reach_a_worker(make_registry, tmp_path):
    """A worker fed the JSON/pickle export imports the custom file by path and mirrors a removed built-in."""
    reg = make_registry()
    name = load_custom_module_dirs([_custom_file(tmp_path, "kb_worker_custom", "WorkerCustomForCausalLM")])[0]
    reg.resolve("attention_backend", "SDPA")
    for module in {r.provider.module for r in reg.log() if r.name == "SDPA"}:
        reg.unregister_provider(module)
    state = json.dumps(reg.export_providers())
    out = subprocess.run([sys.executable, "-c", WORKER], input=state, capture_output=True, text=True, timeout=120)
    sys.modules.pop(name, None)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Custom", "False"]


def test_import_providers_replays_removals_after_discovery(make_registry):
    """Removals carried in an export stay removed in a fresh registry, whose index would otherwise restore them."""
    reg = make_registry(KERNELBAY_PLUGINS="kernelbay-torch")
    reg.resolve("attention_backend", "FLEX")
    for module in {r.provider.module for r in reg.log() if r.name == "FLEX"}:
        reg.unregister_provider(module)
    state = pickle.loads(pickle.dumps(json.loads(json.dumps(reg.export_providers()))))
    worker = Registry(environ=reg._env, discovery=discover(reg._env))
    worker.import_providers(state)
    assert "FLEX" not in worker.names("attention_backend")
    with pytest.raises(UnknownNameError):
        worker.resolve("attention_backend", "FLEX")


def test_models_attribute_always_agrees_with_resolve(make_registry):
    """`kernelbay.models.X` follows later registrations and unregister_provider, never a frozen first answer."""
    reg = make_registry()
    assert kernelbay.models.GoodForCausalLM is reg.resolve("model", "GoodForCausalLM")
    reg.unregister_provider("kb_good.modeling")
    assert not hasattr(kernelbay.models, "GoodForCausalLM")

    class Replacement:
        pass

    register_model("GoodForCausalLM", target=Replacement)
    assert kernelbay.models.GoodForCausalLM is Replacement is reg.resolve("model", "GoodForCausalLM")


@pytest.fixture
def stale_registry(tmp_path):
    """A registry over a site holding one distribution whose entry point names a module that does not exist."""
    info = tmp_path / "kb_stale-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kb-stale\nVersion: 1.0\nRequires-Dist: kernelbay\n")
    (info / "entry_points.txt").write_text("[kernelbay.models]\nStaleForCausalLM = kb_stale_missing.modeling\n")
    previous = default_registry()
    environ = {"PATH": ""}
    yield reset_registry(Registry(environ=environ, discovery=discover(environ, path=[str(tmp_path), *sys.path])))
    reset_registry(previous)


def test_hasattr_on_a_stale_entry_point_is_false(stale_registry):
    """An entry point whose module is gone provides nothing: hasattr() answers False instead of raising."""
    assert "StaleForCausalLM" in dir(kernelbay.models)
    assert not hasattr(kernelbay.models, "StaleForCausalLM")
    with pytest.raises(AttributeError, match=r"kb_stale_missing\.modeling"):
        kernelbay.models.StaleForCausalLM  # noqa: B018 - the access is the test


def test_custom_dir_loads_again_after_unregister(make_registry, tmp_path):
    """unregister_provider forgets a custom dir's path and module, so loading it again works."""
    reg = make_registry()
    path = _custom_file(tmp_path, "kb_reload_custom", "ReloadForCausalLM")
    assert load_custom_module_dirs([path]) == ["kb_reload_custom"]
    reg.unregister_provider("kb_reload_custom")
    with pytest.raises(UnknownNameError):
        reg.resolve("model", "ReloadForCausalLM")
    assert load_custom_module_dirs([path]) == ["kb_reload_custom"]
    assert reg.resolve("model", "ReloadForCausalLM").__name__ == "Custom"
    reg.unregister_provider("kb_reload_custom")


def test_prefer_a_builtin_distribution_over_one_external(make_registry):
    """KERNELBAY_PREFER="Arch=<built-in dist>" wins even when a single external claims the slot."""
    reg = make_registry(KERNELBAY_PREFER="LlamaForCausalLM=kernelbay-llama")
    builtin = reg.resolve("model", "LlamaForCausalLM")

    class External:
        pass

    register_model("LlamaForCausalLM", target=External)
    assert reg.resolve("model", "LlamaForCausalLM") is builtin
    slot = reg.slot("model", "LlamaForCausalLM")
    assert slot.winner.provider.distribution == "kernelbay-llama"
    assert [r.provider.module for r in slot.displaced] == [__name__]


def test_preference_naming_no_claimant_warns_and_is_a_doctor_finding(make_registry, caplog):
    """A KERNELBAY_PREFER entry that names a provider not claiming the slot is reported, not ignored."""
    reg = make_registry(KERNELBAY_PLUGINS="kb-fixture-good,kb-fixture-other", KERNELBAY_PREFER="GoodForCausalLM=kb-x")
    with caplog.at_level("WARNING", logger="kernelbay"):
        reg.resolve("model", "GoodForCausalLM")
    expected = "KERNELBAY_PREFER names 'kb-x' for architecture 'GoodForCausalLM', but it does not claim that slot"
    assert expected in caplog.text
    assert any(expected in f for f in doctor_findings())


def test_broken_backend_first_on_its_platform_warns_naming_the_cause(make_registry, caplog):
    """A vendor backend that fails to import on its own platform is replaced loudly: plugin and cause named."""
    make_registry()
    clear_selection_cache()
    with caplog.at_level("WARNING", logger="kernelbay"):
        result = select_attention_backend(AttentionRequirements(head_size=64, dtype="float32"), platform="kbvendor")
    assert result.backend_name == "SDPA"
    assert "VENDOR_ATTN, in platform kbvendor's priority list, is broken; using SDPA" in caplog.text
    assert "kb-fixture-vendor" in caplog.text and "kb_vendor_runtime_not_installed" in caplog.text
    vendor = next(c for c in result.candidates if c.name == "VENDOR_ATTN")
    assert vendor.source == "platform priority" and "kb_vendor_runtime_not_installed" in vendor.failures[0]
    clear_selection_cache()


def test_plugin_refused_for_its_core_range_is_replaced_visibly(make_registry, caplog):
    """Resolving a name that a core-range-refused plugin provides warns once, naming the plugin and why."""
    reg = make_registry()
    with caplog.at_level("WARNING", logger="kernelbay"):
        reg.resolve("model", "LlamaForCausalLM")
        reg.rebuild()
        reg.resolve("model", "LlamaForCausalLM")
    assert caplog.text.count("kb-fixture-oldapi 1.0 also provides it but is refused") == 1
    assert "requires kernelbay<0.1" in caplog.text


def test_unknown_after_unregister_does_not_list_the_name(make_registry):
    """After unregister_provider + rebuild the unknown-name error neither lists the name nor blames the plugin."""
    reg = make_registry(KERNELBAY_PLUGINS="kernelbay-torch")
    reg.resolve("attention_backend", "FLEX")
    for module in {r.provider.module for r in reg.log() if r.name == "FLEX"}:
        reg.unregister_provider(module)
    reg.rebuild()
    assert "FLEX" not in reg.names("attention_backend")
    with pytest.raises(UnknownNameError) as err:
        reg.resolve("attention_backend", "FLEX")
    known = str(err.value).split("Known attention backends:")[1].split(".")[0]
    assert "FLEX" not in known and "was removed with unregister_provider()" in str(err.value)


def test_trace_logs_platform_detection_and_selection(make_registry, caplog):
    """The trace says which platforms were detected, which was chosen, and why each backend candidate lost."""
    make_registry(KERNELBAY_PLUGINS="kernelbay-torch")
    clear_selection_cache()
    with caplog.at_level("DEBUG", logger="kernelbay"):
        select_attention_backend(AttentionRequirements(head_size=64), platform=current_platform())
    assert "detect platform cpu: current" in caplog.text
    assert "detect platform cpu: chosen" in caplog.text or "detect platform cuda: chosen" in caplog.text
    assert "candidate VANILLA for layers (platform priority)" in caplog.text
    clear_selection_cache()
