"""What the `kernelbay` host says about its commands: a description for each runtime command in `--help`, and a
command whose distribution is installed but left out (allow-list, deny-list) named with the way back."""

from __future__ import annotations

import pytest

from .conftest import run_cli


def test_help_describes_the_runtime_commands():
    """`kernelbay --help` says what `run` and `explain` do (from metadata alone: no plugin imported)."""
    done = run_cli("--help")
    text = " ".join(done.stdout.split())  # argparse wraps the help column
    assert done.returncode == 0, done.stderr
    assert "run generate text from a model folder or .gguf file" in text
    assert "explain config -> architecture -> provider -> per-layer backend" in text


@pytest.mark.parametrize(
    "env, why, fix",
    [
        ({"KERNELBAY_PLUGINS": "nonexistent"}, "left out by KERNELBAY_PLUGINS", "add kernelbay-engine to"),
        ({"KERNELBAY_PLUGINS": "kernelbay-llama"}, "left out by KERNELBAY_PLUGINS", "add kernelbay-engine to"),
        ({"KERNELBAY_DISABLE_PLUGINS": "kernelbay-engine"}, "disabled by KERNELBAY_DISABLE_PLUGINS", "remove"),
    ],
)
def test_a_command_whose_distribution_is_left_out_says_so(env, why, fix):
    """`kernelbay run` with kernelbay-engine filtered out: not argparse's "invalid choice", not "not installed",
    but that `run` comes from kernelbay-engine, which the filter leaves out, and how to bring it back."""
    done = run_cli("run", "--prompt", "hi", env=env)
    assert done.returncode == 1, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("kernelbay run: error: `kernelbay run` comes from kernelbay-engine, which is " + why)
    assert fix in first and "invalid choice" not in done.stderr and "not installed" not in done.stderr
    listed = " ".join(run_cli("--help", env=env).stdout.split())
    assert f"(needs kernelbay-engine: {why})" in listed
