"""`import kernelbay` and `kernelbay plugins` stay light: no torch, no transformers, no plugin module."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import env_with_site

HEAVY = ("torch", "transformers", "kernelbay_", "kb_")
PROBE = """
import json, sys
{body}
print(json.dumps(sorted(m for m in sys.modules if m.startswith({heavy!r}))))
"""


def _heavy_modules_after(body: str, env=None, heavy=HEAVY) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body, heavy=heavy)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_kernelbay_imports_no_torch_transformers_or_plugin():
    """A fresh interpreter importing kernelbay has none of torch, transformers or any plugin module."""
    assert _heavy_modules_after("import kernelbay") == []


PLUGINS_JSON = """
import contextlib, io
from kernelbay.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(['plugins', '--json', '--log'])
"""


def test_plugins_command_imports_no_plugin_module(fixture_site):
    """`kernelbay plugins --json` (with fixture plugins installed) imports no plugin module and no torch."""
    assert _heavy_modules_after(PLUGINS_JSON, env_with_site(fixture_site)) == []


def test_import_kernelbay_leaves_the_metadata_libraries_to_discovery():
    """`import kernelbay` imports neither importlib_metadata nor packaging: the first discovery does."""
    assert _heavy_modules_after("import kernelbay", heavy=("importlib_metadata", "packaging", "email")) == []


def test_plain_core_ranges_are_checked_without_importing_packaging_requirements(fixture_site):
    """Plugins declaring `kernelbay>=a,<b` are checked with SpecifierSet alone (packaging.requirements, markers
    and tags cost ~15 ms more to import); the fixtures and first-party plugins all declare such ranges."""
    assert (
        _heavy_modules_after(
            PLUGINS_JSON, env_with_site(fixture_site), heavy=("packaging.requirements", "packaging.markers")
        )
        == []
    )


def test_public_names_resolve_lazily_and_are_cached():
    """kernelbay.register_model is found through PEP 562 and cached in the module afterwards."""
    import kernelbay

    first = kernelbay.register_model
    assert "register_model" in vars(kernelbay) and kernelbay.register_model is first
    assert "resolve" in dir(kernelbay) and not {"LLM", "ModelConfig"} & set(dir(kernelbay))  # kernelbay-engine's


def test_runtime_names_asked_of_the_core_say_where_they_live():
    """`kernelbay.LLM` is not the core's: the error names kernelbay-engine and the import to write."""
    import kernelbay

    with pytest.raises(AttributeError, match=r"pip install kernelbay-engine, then `from kernelbay_engine import LLM`"):
        kernelbay.LLM  # noqa: B018 - the attribute access is the test
    with pytest.raises(AttributeError, match=r"then `from kernelbay_engine.config import ModelConfig`"):
        kernelbay.ModelConfig  # noqa: B018
