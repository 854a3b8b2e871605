"""pluggy hooks: hook modules load at the first hook call, plugins add rules through register(), and a
distribution declares the hooks it calls (`declare_hooks`). The fixture plugins implement a hook of their own,
`register_fixture_rules`: the host hosts any hook by name."""

from __future__ import annotations

import sys

from kernelbay.hooks import collect


def test_hook_plugins_load_on_first_call_and_register_rules(make_registry):
    """kb_good.hooks is imported only when a hook is collected; its rule is attributed to it."""
    make_registry()
    assert "kb_good.hooks" not in sys.modules
    rules = collect("register_fixture_rules")
    assert "kb_good.hooks" in sys.modules
    ((rule, _plugin),) = [(r, p) for r, p in rules if p == "good"]
    assert rule({"beam_width": 4}) == ["good: beam search is not supported"]
    assert rule({"beam_width": 1}) == []


def test_disabled_plugin_contributes_no_hooks(make_registry):
    """A plugin removed by KERNELBAY_DISABLE_PLUGINS is not loaded for hooks either."""
    make_registry(KERNELBAY_DISABLE_PLUGINS="kb-fixture-good")
    assert [p for _, p in collect("register_fixture_rules")].count("good") == 0


def test_broken_hook_plugin_is_listed_and_the_others_still_run(make_registry, caplog):
    """A hook module that fails to import is recorded with its cause and a warning; good plugins still register."""
    from kernelbay.hooks import broken_hook_plugins

    make_registry()
    with caplog.at_level("WARNING", logger="kernelbay"):
        plugins = [p for _, p in collect("register_fixture_rules")]
    assert "good" in plugins
    (broken,) = broken_hook_plugins()
    assert (broken.name, broken.distribution) == ("missingdep", "kb-fixture-missingdep")
    assert "'kb_not_installed_dependency', which is not installed" in broken.cause
    assert "hook plugin 'missingdep' of kb-fixture-missingdep is broken" in caplog.text


def test_first_party_family_rules_come_through_the_hook_as_built_in(make_registry):
    """kernelbay-llama's model-type rules arrive through its kernelbay.hooks entry point, provenance attached."""
    from kernelbay.hooks import call_hook, hook_provider

    make_registry()
    calls = []
    call_hook("register_model_type_rules", lambda plugin: lambda types, **rules: calls.append((plugin, types, rules)))
    ((plugin, _, rules),) = [c for c in calls if c[1] == "gemma2"]
    provider = hook_provider(plugin)
    assert (provider.distribution, provider.origin, list(rules)) == ("kernelbay-llama", "built-in", ["layers"])


def test_runtime_hook_plugin_is_external_and_named_when_its_hook_raises(make_registry):
    """A plugin registered on the manager at runtime has no distribution (external); its hook's raise names it."""
    import pytest

    from kernelbay.errors import PluginImportError
    from kernelbay.hooks import call_hook, hook_provider, hookimpl, plugin_manager

    class Broken:
        @hookimpl
        def register_model_type_rules(self, register):
            raise KeyError("oops")

    make_registry()
    plugin_manager().register(Broken(), name="acme")
    assert (hook_provider("acme").distribution, hook_provider("acme").origin) == (None, "external")
    with pytest.raises(PluginImportError, match="hook register_model_type_rules of plugin 'acme' raised KeyError"):
        call_hook("register_model_type_rules", lambda plugin: lambda *args, **rules: None)


def test_a_declared_hook_checks_its_implementations(make_registry):
    """declare_hooks adds a distribution's specs once; an implementation whose arguments do not match is refused."""
    import pluggy
    import pytest

    from kernelbay.hooks import declare_hooks, hookimpl, hookspec, plugin_manager

    class FixtureSpecs:
        @hookspec
        def register_fixture_rules(self, register):
            """Call `register(rule)`."""

    make_registry()
    declare_hooks(FixtureSpecs)
    declare_hooks(FixtureSpecs)  # idempotent
    assert plugin_manager().hook.register_fixture_rules.spec is not None
    assert [p for _, p in collect("register_fixture_rules")].count("good") == 1

    class WrongArguments:
        @hookimpl
        def register_fixture_rules(self, register, extra):
            pass

    with pytest.raises(pluggy.PluginValidationError):
        plugin_manager().register(WrongArguments(), name="wrong")
