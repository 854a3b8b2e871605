"""First-party and contrib plugin packages, built and installed for real (pip --target) once per session.

Two site dirs: `first_party` (kernelbay-torch, -llama, -deepseek, -flashinfer) and `acme` (kernelbay-acme),
so a registry or a subprocess can be given the environment with or without the vendor plugin. The tests of
kernelbay-flashinfer and kernelbay-acme (plugins/flashinfer/tests, contrib/acme/tests) import these fixtures.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernelbay.attention import clear_selection_cache
from kernelbay.hooks import reset_hooks
from kernelbay.registry import Registry, default_registry, reset_registry
from kernelbay.registry._discovery import discover
from tests._install import install_into

REPO = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("plugins/torch", "plugins/llama", "plugins/deepseek", "plugins/flashinfer")
CONTRIB = ("contrib/acme", "contrib/acme-llama")
ACME_PACKAGES = ("kernelbay_acme", "kernelbay_acme_llama")
# Providers that register through decorators (plugins and the example custom dirs): a fresh registry only
# sees their registrations if their modules run again, so each registry re-imports them and the test's
# originals are put back afterwards.
DECORATOR_PROVIDERS = (
    "kernelbay_acme",
    "kernelbay_acme_llama",
    "kernelbay_llama",
    "kernelbay_deepseek",
    "olmo",
    "llama_override",
)


@dataclass(frozen=True)
class Sites:
    first_party: Path
    acme: Path

    def path(self, with_acme: bool = True) -> list[str]:
        return [str(self.acme)] * with_acme + [str(self.first_party)]


def pip_install(target: Path, *package_dirs: str) -> None:
    install_into(target, *(REPO / d for d in package_dirs))


def _move_out(src: Path, dst: Path, packages: tuple[str, ...]) -> None:
    """Split one pip --target install in two sites (one pip run builds every wheel: half the time)."""
    dst.mkdir()
    for item in src.iterdir():
        if item.name.split("-")[0] in packages:
            shutil.move(str(item), dst / item.name)


@pytest.fixture(scope="session")
def sites(tmp_path_factory) -> Sites:
    """Every first-party and contrib plugin installed from its own pyproject, once per session."""
    root = tmp_path_factory.mktemp("eco")
    pip_install(root / "first_party", *FIRST_PARTY, *CONTRIB)
    _move_out(root / "first_party", root / "acme", ACME_PACKAGES)
    return Sites(root / "first_party", root / "acme")


@pytest.fixture(scope="module", autouse=True)
def _sites_importable(sites):
    """The sites are on sys.path while this directory's test modules run, and only then: a registry built by
    another area's test must never discover kernelbay-acme. Appended, not prepended, so the editable
    first-party installs keep serving their own imports."""
    sys.path.extend(sites.path())
    yield
    for entry in sites.path():
        sys.path.remove(entry)


def clean_environ(**extra: str) -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("KERNELBAY_", "ACME_"))} | extra


def _take_modules(tops: tuple[str, ...]) -> dict:
    taken = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] in tops}
    for name in taken:
        del sys.modules[name]
    return taken


@pytest.fixture
def make_registry(sites):
    """Install a process registry discovered over the real environment plus the installed sites."""
    previous = default_registry()
    originals = _take_modules(DECORATOR_PROVIDERS)

    def make(with_acme: bool = True, **env: str) -> Registry:
        _take_modules(DECORATOR_PROVIDERS)  # a second registry in one test re-imports them too
        environ = clean_environ(**env)
        rest = [p for p in sys.path if p not in sites.path()]
        registry = Registry(environ=environ, discovery=discover(environ, path=[*sites.path(with_acme), *rest]))
        reset_registry(registry)
        reset_hooks()
        clear_selection_cache()
        return registry

    yield make
    _take_modules(DECORATOR_PROVIDERS)
    sys.modules.update(originals)
    reset_registry(previous)
    reset_hooks()
    clear_selection_cache()


def run_kernelbay(sites: Sites, *args: str, with_acme: bool = True, **env: str) -> subprocess.CompletedProcess:
    """`kernelbay ARGS` in a fresh process whose only plugins are the installed sites' (and the editable core's)."""
    environ = clean_environ(**env)
    environ["PYTHONPATH"] = os.pathsep.join(sites.path(with_acme))
    return subprocess.run(
        [sys.executable, "-m", "kernelbay.cli", *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=REPO,
        timeout=300,
    )
