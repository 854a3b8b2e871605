"""A vendor plugin frozen as a built wheel (tests/contract/frozen: kernelbay-acme 0.1.0, never rebuilt) keeps
passing the conformance kit against the current core: the contract a released plugin was built on still holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._install import install_into
from tests.ecosystem.conftest import clean_environ

REPO = Path(__file__).resolve().parents[2]
FROZEN = Path(__file__).parent / "frozen" / "kernelbay_acme-0.1.0-py3-none-any.whl"
WHICH = """import json, sys
import kernelbay_acme
from kernelbay import resolve
backend = resolve("attention_backend", "ACME_INT8")
print(json.dumps({"package": kernelbay_acme.__file__, "backend": sys.modules[backend.__module__].__file__}))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The frozen wheel (not contrib/acme's source) installed into a --target site of its own."""
    return install_into(tmp_path_factory.mktemp("frozen") / "site", FROZEN)


def run(site: Path, *args: str) -> subprocess.CompletedProcess:
    """`python ARGS` in a fresh process, the site first on its path, no KERNELBAY_* / ACME_* from the caller."""
    environ = clean_environ()
    environ["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=environ, cwd=REPO, timeout=300, check=False
    )


def test_the_frozen_wheel_is_what_serves_acme(site):
    """The only kernelbay-acme discovered is the wheel's, accepted by this core's version range, and ACME_INT8
    resolves to its module under the site, not to contrib/acme (an editable install there would shadow it)."""
    done = run(site, "-m", "kernelbay.cli", "plugins", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (acme,) = [p for p in json.loads(done.stdout)["plugins"] if p["distribution"] == "kernelbay-acme"]
    assert Path(acme["location"]).parent == site, acme
    assert acme["refused"] is None, f"{acme['refused']} (a minor bump needs a wheel frozen for it: frozen/README.md)"
    done = run(site, "-c", WHICH)
    assert done.returncode == 0, done.stdout + done.stderr
    files = {k: Path(v) for k, v in json.loads(done.stdout).items()}
    assert all(site in path.parents for path in files.values()), files


def test_the_frozen_wheel_passes_the_kit(site):
    """`kernelbay check-backend ACME_INT8 --json` on the frozen wheel: exit 0, no failed spec, every claimed spec
    (as many as when it was frozen) within int8 error of the kit's reference."""
    done = run(site, "-m", "kernelbay.cli", "check-backend", "ACME_INT8", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "ACME_INT8" and report["passed"], report
    assert report["counts"]["fail"] == 0 and not [r for r in report["results"] if r["status"] == "fail"], report
    passed = {r["spec"] for r in report["results"] if r["status"] == "pass"}
    assert len(passed) >= 15 and {"small_prefill", "small_decode", "gqa", "sliding_window"} <= passed, report
