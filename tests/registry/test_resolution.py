"""Resolution through the static index: precedence, conflicts, broken plugins isolated and explained."""

from __future__ import annotations

import pytest

from kernelbay.errors import MissingDependencyError, PluginImportError, RegistrationConflict, UnknownNameError
from kernelbay.registry import registered_slots, slot_info

from .conftest import fixture_imports


def test_resolve_imports_exactly_the_provider_module(make_registry):
    """Resolving one architecture imports its one provider module and nothing else."""
    reg = make_registry()
    cls = reg.resolve("model", "GoodForCausalLM")
    assert cls.__name__ == "GoodForCausalLM"
    assert fixture_imports() == ["kb_good.modeling"]
    assert reg.resolve("model", "GoodLMHeadModel") is cls
    assert reg.resolve("vision_encoder", "GoodVisionModel").__name__ == "GoodVisionModel"
    assert fixture_imports() == ["kb_good.modeling"]


def test_provenance_records_module_distribution_version_origin(make_registry):
    """The slot names its provider module, distribution, version and origin."""
    make_registry()
    info = slot_info("model", "GoodForCausalLM")
    assert info["winner"]["provider"] == {
        "module": "kb_good.modeling",
        "distribution": "kb-fixture-good",
        "version": "1.0",
        "origin": "external",
        "path": None,
    }
    assert info["winner"]["target"] == "kb_good.modeling:GoodForCausalLM"


def test_external_platform_takes_the_core_slot_and_records_what_it_displaced(make_registry):
    """kb-fixture-good's `cpu` platform wins over the core's built-in one, from metadata alone."""
    reg = make_registry()
    slot = reg.slot("platform", "cpu")
    assert slot.winner.provider.distribution == "kb-fixture-good"
    assert [r.provider.distribution for r in slot.displaced] == ["kernelbay"]
    assert reg.resolve("platform", "cpu").__name__ == "GoodCpuPlatform"


def test_two_externals_on_one_slot_conflict_naming_both_and_the_fix(make_registry):
    """Two externals claiming one architecture raise RegistrationConflict naming both and KERNELBAY_PREFER."""
    reg = make_registry()
    with pytest.raises(RegistrationConflict) as err:
        reg.resolve("model", "ConflictForCausalLM")
    msg = str(err.value)
    assert "kb-fixture-conflict-a" in msg and "kb-fixture-conflict-b" in msg
    assert 'KERNELBAY_PREFER="ConflictForCausalLM=kb-fixture-conflict-a"' in msg


@pytest.mark.parametrize("dist,cls", [("kb-fixture-conflict-b", "ConflictB"), ("kb_fixture_conflict_a", "ConflictA")])
def test_prefer_env_chooses_the_provider(make_registry, dist, cls):
    """KERNELBAY_PREFER="Arch=dist" settles a conflict; the loser is recorded as displaced."""
    reg = make_registry(KERNELBAY_PREFER=f"ConflictForCausalLM={dist}")
    assert reg.resolve("model", "ConflictForCausalLM").__name__ == cls
    assert len(reg.slot("model", "ConflictForCausalLM").displaced) == 1


def test_prefer_api_is_the_env_twin(make_registry):
    """registry.prefer() settles the same conflict at runtime."""
    reg = make_registry()
    with pytest.raises(RegistrationConflict):
        reg.resolve("model", "ConflictForCausalLM")
    reg.prefer("ConflictForCausalLM", "kb-fixture-conflict-b")
    assert reg.resolve("model", "ConflictForCausalLM").__name__ == "ConflictB"


def test_syntax_error_names_plugin_file_and_line(make_registry):
    """A plugin with a syntax error is broken with its distribution, file and line; others still resolve."""
    reg = make_registry()
    with pytest.raises(PluginImportError) as err:
        reg.resolve("model", "SyntaxForCausalLM")
    msg = str(err.value)
    assert "syntax error in provider kb_syntax.modeling (kb-fixture-syntax 1.0, external)" in msg
    assert "kb_syntax/modeling.py:5" in msg
    assert "KERNELBAY_DISABLE_PLUGINS=kb-fixture-syntax" in msg
    assert reg.resolve("model", "GoodForCausalLM").__name__ == "GoodForCausalLM"
    assert [b.provider.module for b in reg.broken()] == ["kb_syntax.modeling"]


def test_missing_dependency_is_reported_as_that_dependency(make_registry):
    """ModuleNotFoundError for another package names that package and the distribution to fix."""
    reg = make_registry()
    with pytest.raises(MissingDependencyError) as err:
        reg.resolve("model", "MissingDepForCausalLM")
    msg = str(err.value)
    assert (
        "kb_missingdep.modeling (kb-fixture-missingdep 1.0, external) needs the package "
        "'kb_not_installed_dependency', which is not installed" in msg
    )
    assert "kb_missingdep/modeling.py:4" in msg


def test_decorator_raising_leaves_nothing_half_registered(make_registry):
    """A module whose second decorator raises keeps none of its registrations, the first one included."""
    reg = make_registry()
    with pytest.raises(PluginImportError) as err:
        reg.resolve("model", "FirstForCausalLM")
    assert "names must be non-empty strings without surrounding spaces, got ' bad name '" in str(err.value)
    assert reg.slot("model", "FirstForCausalLM") is None
    assert not [r for r in reg.log() if r.provider.module == "kb_raising.modeling"]
    with pytest.raises(PluginImportError):  # stays broken; not re-imported half-way
        reg.resolve("model", "RaisingForCausalLM")


def test_attribute_error_inside_provider_becomes_import_error_naming_it(make_registry):
    """An AttributeError raised while a provider imports is an ImportError naming the provider."""
    reg = make_registry()
    with pytest.raises(ImportError) as err:
        reg.resolve("model", "AttrErrorForCausalLM")
    assert "AttributeError inside provider kb_attrerror.modeling (kb-fixture-attrerror 1.0, external)" in str(err.value)
    assert "no_such_function" in str(err.value)


def test_advertised_but_never_registered_points_at_doctor(make_registry):
    """An index entry whose module never registers that name is an error saying so."""
    reg = make_registry()
    with pytest.raises(UnknownNameError) as err:
        reg.resolve("model", "LiarForCausalLM")
    assert (
        "kb-fixture-liar (kb_liar.modeling) advertise(s) 'LiarForCausalLM' in kernelbay.models but never "
        "registered it; run `kernelbay doctor`" in str(err.value)
    )


def test_refused_plugin_is_named_when_its_architecture_is_requested(make_registry):
    """Asking for an architecture of a version-refused plugin says why it is not used (and never imports it)."""
    reg = make_registry()
    with pytest.raises(UnknownNameError) as err:
        reg.resolve("model", "OldForCausalLM")
    assert (
        "kb-fixture-badversion 1.0 provides it but is not used: kb-fixture-badversion 1.0 requires "
        "kernelbay<0.1" in str(err.value)
    )
    assert fixture_imports() == []


def test_unknown_name_lists_known_names_and_close_matches(make_registry):
    """A typo gets the known names and the close match; a missing first-party arch names its plugin."""
    reg = make_registry()
    with pytest.raises(UnknownNameError) as err:
        reg.resolve("model", "GoodForCausalLm")
    assert "Unknown architecture: 'GoodForCausalLm'." in str(err.value)
    assert "Did you mean: GoodForCausalLM" in str(err.value)
    reg = make_registry(KERNELBAY_DISABLE_PLUGINS="kernelbay-deepseek")
    with pytest.raises(UnknownNameError) as err:
        reg.resolve("model", "DeepseekV3ForCausalLM")
    assert "kernelbay-deepseek" in str(err.value)


def test_class_remembers_its_slots_after_losing_one(make_registry):
    """registered_slots() keeps every slot a class registered for, including one it lost."""
    reg = make_registry()
    good = reg.resolve("model", "GoodForCausalLM")
    from kernelbay import register_model

    @register_model("GoodForCausalLM")
    class Override:
        pass

    reg.prefer("GoodForCausalLM", __name__)
    assert reg.resolve("model", "GoodForCausalLM") is Override
    assert registered_slots(good) == [("model", "GoodForCausalLM"), ("model", "GoodLMHeadModel")]


def test_unknown_kind_is_an_error(make_registry):
    """A misspelt slot kind is a ValueError listing the kinds."""
    reg = make_registry()
    with pytest.raises(ValueError, match="unknown slot kind 'models'; kinds are: model, vision_encoder"):
        reg.resolve("models", "X")


def test_sys_exit_at_import_marks_the_plugin_broken_not_the_process_ended(make_registry):
    """A provider calling sys.exit(3) while imported is a PluginImportError naming it and the call; its earlier
    registration is dropped, and it stays broken (SystemExit is not allowed to end kernelbay)."""
    reg = make_registry(KERNELBAY_PLUGINS="kb-fixture-exits")
    with pytest.raises(PluginImportError) as err:
        reg.resolve("model", "ExitingForCausalLM")
    message = str(err.value)
    assert "provider kb_exits.modeling (kb-fixture-exits 1.0, external) called sys.exit(3)" in message
    assert "kb_exits/modeling.py:" in message and "KERNELBAY_DISABLE_PLUGINS=kb-fixture-exits" in message
    assert reg.slot("model", "ExitingForCausalLM") is None
    assert [b.provider.module for b in reg.broken()] == ["kb_exits.modeling"]
    with pytest.raises(PluginImportError):  # stays broken
        reg.resolve("model", "ExitingForCausalLM")


def test_system_exit_from_a_backend_module_fails_only_that_resolution(make_registry):
    """`raise SystemExit("...")` in a backend module is that backend's PluginImportError, with the message."""
    reg = make_registry(KERNELBAY_PLUGINS="kb-fixture-exits")
    with pytest.raises(PluginImportError, match=r"called sys.exit\('kb_exits: no accelerator found, giving up'\)"):
        reg.resolve("attention_backend", "EXITING_ATTN")
    assert reg.resolve("platform", "cpu") is not None
