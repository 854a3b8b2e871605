"""`kernelbay check-backend`: one line per spec, a summary, JSON on request, and the exit code says conform or not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests._paths import REPO

KERNELBAY = str(Path(sys.executable).with_name("kernelbay"))
# A custom module dir registering the planted off-by-one backend of _fakes (the one class, imported by path).
BAD_BACKEND_DIR = """
from kernelbay import register_attention_backend
from tests.testing._fakes import WindowOffByOne

register_attention_backend("FAKE_WINDOW_OFF_BY_ONE", target=WindowOffByOne)
"""


def check_backend(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")} | {"PYTHONPATH": str(REPO)}
    return subprocess.run([KERNELBAY, "check-backend", *args], capture_output=True, text=True, env=env, timeout=300)


def test_vanilla_conforms():
    """Every spec gets a PASS line with its error and tolerance, the summary says so, and the exit code is 0."""
    done = check_backend("VANILLA")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "VANILLA: conforms: 34 passed, 0 failed, 0 not claimed, 0 skipped"
    assert all(line.startswith("PASS  ") and " max err " in line and " <= " in line for line in lines[:-1])
    assert any(line.split()[1] == "small_decode" for line in lines)


def test_json_report():
    """--json prints the whole report: the verdict, the counts and one record per spec."""
    done = check_backend("SDPA", "--json", "--spec", "softcap", "--spec", "small_decode")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["passed"] is True and report["counts"]["not-claimed"] == 1
    got = [(r["spec"], r["status"]) for r in report["results"]]
    assert got == [("softcap", "not-claimed"), ("small_decode", "pass")]


def test_refusals_are_shown_not_failed():
    """A refused spec is a '----' line naming the missing capability; it does not fail the run."""
    done = check_backend("SDPA", "--spec", "softcap")
    assert done.returncode == 0
    assert done.stdout.splitlines()[0].split() == [
        "----",
        "softcap",
        "not",
        "claimed:",
        "logit_softcap:",
        "attention",
        "logit",
        "soft-capping",
        "is",
        "not",
        "supported",
    ]


def test_a_bad_backend_exits_1(tmp_path):
    """A backend (from --custom-module-dirs) that gets a spec wrong gets a FAIL line and exit code 1."""
    (tmp_path / "bad_backend.py").write_text(BAD_BACKEND_DIR)
    done = check_backend(
        "FAKE_WINDOW_OFF_BY_ONE",
        "--custom-module-dirs",
        str(tmp_path / "bad_backend.py"),
        "--spec",
        "sliding_window",
        "--spec",
        "small_decode",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    first, second, summary = done.stdout.splitlines()
    assert first.startswith("FAIL  sliding_window") and " > " in first and second.startswith("PASS  small_decode")
    assert summary == "FAKE_WINDOW_OFF_BY_ONE: DOES NOT CONFORM: 1 passed, 1 failed, 0 not claimed, 0 skipped"


def test_backend_options_reach_the_backend():
    """--backend-option KEY=VALUE (or NAME.KEY=VALUE) is parsed by the backend's Options; a wrong key is an error."""
    done = check_backend("FLEX", "--backend-option", "FLEX.compile=false", "--spec", "softcap")
    assert done.returncode == 0 and done.stdout.startswith("PASS  softcap"), done.stdout + done.stderr
    done = check_backend("FLEX", "--backend-option", "compil=false")
    assert done.returncode == 1 and "FLEX.compil is not an option; known options: compile" in done.stderr


def test_unknown_names_are_errors_listing_the_known_ones():
    """An unknown backend (exit 7, UnknownBackend) or spec (exit 1) is an error from the CLI host naming the
    known ones."""
    done = check_backend("SPDA")
    assert done.returncode == 7 and done.stdout == ""
    assert "Unknown backend: 'SPDA'. Known backends: " in done.stderr
    assert "VANILLA" in done.stderr and "Did you mean: SDPA?" in done.stderr
    done = check_backend("VANILLA", "--spec", "small_decod")
    assert done.returncode == 1 and "Unknown batch spec: 'small_decod'" in done.stderr
