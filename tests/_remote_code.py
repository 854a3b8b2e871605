"""Isolate transformers' remote-code imports in one test: its own HF_MODULES_CACHE, on sys.path only for the test,
and no `transformers_modules` package left over from (or leaked to) another test."""

from __future__ import annotations

import sys


def isolate_remote_code(monkeypatch, cache) -> None:
    import transformers.dynamic_module_utils as dyn

    monkeypatch.setattr(dyn, "HF_MODULES_CACHE", str(cache))
    monkeypatch.setattr(sys, "path", list(sys.path))  # init_hf_modules appends the cache; undone afterwards
    for name in [m for m in sys.modules if m == "transformers_modules" or m.startswith("transformers_modules.")]:
        monkeypatch.delitem(sys.modules, name)  # restored afterwards; this test imports its own
