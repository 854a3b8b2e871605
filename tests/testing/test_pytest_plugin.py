"""`pytest --kernelbay-backend NAME`: one item per spec; free and silent without the option."""

from __future__ import annotations

import os
import subprocess
import sys

from tests._paths import REPO

from .test_cli import BAD_BACKEND_DIR

# the repo's own strictness, so a warning from the plugin would fail these runs
STRICT_INI = (
    "[pytest]\naddopts = --strict-markers -p no:cacheprovider\nfilterwarnings =\n    error\n"
    "    ignore::UserWarning:torch.*\n    ignore::DeprecationWarning:torch.*\n"
)


def pytest_in(path, *args: str) -> subprocess.CompletedProcess:
    (path / "pytest.ini").write_text(STRICT_INI)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")} | {"PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", *args],
        capture_output=True,
        text=True,
        cwd=path,
        env=env,
        timeout=300,
    )


def test_one_item_per_spec(tmp_path):
    """[SDPA] gives one item per spec: its claims pass, its refusals are skips naming the capability."""
    done = pytest_in(tmp_path, "--kernelbay-backend", "SDPA")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "30 passed, 5 skipped" in done.stdout  # the 34 specs and claims_a_spec
    assert "not claimed: logit_softcap: attention logit soft-capping is not supported" in done.stdout


def test_items_are_named_and_selectable(tmp_path):
    """Items are `kernelbay-backend[NAME]::SPEC`, carry the kernelbay_conformance marker and obey -k."""
    done = pytest_in(
        tmp_path, "--kernelbay-backend", "VANILLA", "-m", "kernelbay_conformance", "-k", "decode", "--collect-only"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kernelbay-backend[VANILLA]::small_decode" in done.stdout
    assert "kernelbay-backend[VANILLA]::small_prefill" not in done.stdout


def test_a_failing_spec_fails_its_item(tmp_path):
    """A backend registered by the project's conftest is checked; a wrong spec fails with the kit's detail."""
    (tmp_path / "conftest.py").write_text(BAD_BACKEND_DIR)
    done = pytest_in(tmp_path, "--kernelbay-backend", "FAKE_WINDOW_OFF_BY_ONE", "-k", "sliding or small_decode")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[FAKE_WINDOW_OFF_BY_ONE] sliding_window: max err " in done.stdout
    assert "3 failed, 1 passed" in done.stdout  # sliding_window, runs_sliding_decode, sinks_sliding; small_decode


def test_an_unknown_backend_is_a_usage_error(tmp_path):
    """An unknown name stops the run before any test, listing the known backends."""
    done = pytest_in(tmp_path, "--kernelbay-backend", "SPDA")
    assert done.returncode == 4
    assert "--kernelbay-backend SPDA: Unknown attention backend: 'SPDA'" in done.stderr


def test_without_the_option_nothing_is_imported_or_collected(tmp_path):
    """Loaded in every run, the plugin adds no item and imports neither torch nor any kernelbay backend."""
    (tmp_path / "test_light.py").write_text(
        "import sys\n\ndef test_light():\n    assert 'torch' not in sys.modules\n"
        "    assert 'kernelbay.testing.pytest_plugin' in sys.modules\n"
    )
    done = pytest_in(tmp_path)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr


def test_a_backend_claiming_no_spec_fails_claims_a_spec(tmp_path):
    """FAKE_CLAIMS_NOTHING (no head size declared) skips every spec, but `claims_a_spec` fails naming head_sizes."""
    (tmp_path / "conftest.py").write_text(
        "from kernelbay import register_attention_backend\n"
        "from tests.testing._fakes import ClaimsNothing\n\n"
        'register_attention_backend("FAKE_CLAIMS_NOTHING", target=ClaimsNothing)\n'
    )
    done = pytest_in(tmp_path, "--kernelbay-backend", "FAKE_CLAIMS_NOTHING", "-k", "claims_a_spec or small_decode")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 skipped" in done.stdout, done.stdout
    hint = "[FAKE_CLAIMS_NOTHING] claims_a_spec: FAKE_CLAIMS_NOTHING can serve nothing: head_sizes refuse"
    assert hint in done.stdout, done.stdout
