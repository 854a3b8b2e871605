"""Backend plugins that misbehave, installed for real (pip --target) once per session, and the CLI run over them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._install import install_into

DISTS = Path(__file__).parent / "dists"
KERNELBAY = str(Path(sys.executable).with_name("kernelbay"))


@pytest.fixture(scope="session")
def faulty_site(tmp_path_factory) -> Path:
    """A site holding kb-fixture-faulty (FAULTY_RAISES, FAULTY_DECODE, FAULTY_NAN, FAULTY_MOE) and
    kb-fixture-lazyvendor."""
    return install_into(tmp_path_factory.mktemp("faulty-site"), DISTS / "faulty", DISTS / "lazyvendor")


@pytest.fixture(scope="session")
def kernelbay_cli(faulty_site):
    """`kernelbay ARGS...` in a subprocess that sees the fixture site (and no KERNELBAY_* of the caller)."""

    def run(*args: str, **env: str) -> subprocess.CompletedProcess:
        base = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")}
        base["PYTHONPATH"] = os.pathsep.join([str(faulty_site), base.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return subprocess.run(
            [KERNELBAY, *args], capture_output=True, text=True, env=base | env, timeout=300, check=False
        )

    return run
