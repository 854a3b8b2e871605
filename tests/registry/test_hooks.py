"""pluggy hooks: hook modules load at the first hook call, and plugins add rules through register()."""

from __future__ import annotations

import sys

from kernelbay.hooks import collect


def test_hook_plugins_load_on_first_call_and_register_rules(make_registry):
    """kb_good.hooks is imported only when a hook is collected; its rule is attributed to it."""
    make_registry()
    assert "kb_good.hooks" not in sys.modules
    rules = collect("register_config_rules")
    assert "kb_good.hooks" in sys.modules
    (rule, plugin), = [(r, p) for r, p in rules if p == "good"]
    assert rule({"beam_width": 4}) == ["good: beam search is not supported"]
    assert rule({"beam_width": 1}) == []


def test_disabled_plugin_contributes_no_hooks(make_registry):
    """A plugin removed by KERNELBAY_DISABLE_PLUGINS is not loaded for hooks either."""
    make_registry(KERNELBAY_DISABLE_PLUGINS="kb-fixture-good")
    assert [p for _, p in collect("register_config_rules")].count("good") == 0
