"""Fixture plugin distributions, installed for real (pip --target) once per session."""

from __future__ import annotations

import builtins
import os
import sys
from pathlib import Path

import pytest

from kernelbay.hooks import reset_hooks
from kernelbay.registry import Registry, default_registry, reset_registry
from kernelbay.registry._discovery import discover
from tests._install import install_into

DISTS = Path(__file__).parent / "dists"
FIXTURE_PACKAGES = (
    "kb_good",
    "kb_other",
    "kb_syntax",
    "kb_missingdep",
    "kb_raising",
    "kb_attrerror",
    "kb_badversion",
    "kb_liar",
    "kb_conflict_a",
    "kb_conflict_b",
    "kb_oldapi",
    "kb_vendor",
    "kb_exits",
)


def install_fixture_dists(target: Path) -> Path:
    return install_into(target, *sorted(d for d in DISTS.iterdir() if d.is_dir()))


@pytest.fixture(scope="session")
def _installed_fixture_site(tmp_path_factory) -> Path:
    return install_fixture_dists(tmp_path_factory.mktemp("site"))


@pytest.fixture
def fixture_site(_installed_fixture_site) -> Path:
    """A site directory holding every fixture distribution, on sys.path while the test runs (only then: a
    registry another area's test builds later in this process must never discover the fixture plugins)."""
    sys.path.insert(0, str(_installed_fixture_site))
    yield _installed_fixture_site
    sys.path.remove(str(_installed_fixture_site))


def _purge_fixture_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in FIXTURE_PACKAGES]:
        del sys.modules[name]
    builtins.__dict__.pop("_kb_fixture_imports", None)


def fixture_imports() -> list[str]:
    """Fixture modules executed since the test began (each module appends itself when run)."""
    return list(builtins.__dict__.get("_kb_fixture_imports", []))


@pytest.fixture
def make_registry(fixture_site):
    """Build the process registry over the real environment plus the fixture site."""
    previous = default_registry()

    def make(**env: str) -> Registry:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")} | env
        registry = Registry(environ=environ, discovery=discover(environ, path=[str(fixture_site), *sys.path]))
        reset_registry(registry)
        reset_hooks()
        return registry

    _purge_fixture_modules()
    yield make
    _purge_fixture_modules()
    reset_registry(previous)
    reset_hooks()


def env_with_site(site: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env | extra
