"""`kernelbay run --help` and `kernelbay explain --help` say that MODEL may be a .gguf file (and explain's
--quantization that gguf is one), and a .gguf path that does not exist is reported as a missing file."""

from __future__ import annotations

import pytest

from tests.cli.conftest import run_cli, without_notices


def _help(command: str) -> str:
    done = run_cli(command, "--help")
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())  # argparse wraps the help column


@pytest.mark.parametrize("command", ["run", "explain"])
def test_model_help_names_gguf_files(command):
    """MODEL: a folder or a .gguf file."""
    assert "MODEL model folder (" in _help(command) and ") or .gguf file" in _help(command)


def test_explain_quantization_help_lists_gguf():
    """explain's --quantization help names int8, int4 and what happens to a .gguf file's own codes."""
    text = _help("explain")
    quantization = text.split("--quantization NAME ")[-1].split(" --")[0]  # the help column, not the usage line
    assert all(word in quantization for word in ("int8", "int4", ".gguf")), quantization


@pytest.mark.parametrize("command", ["run", "explain"])
def test_a_missing_gguf_file_is_a_missing_file(command, tmp_path):
    """`nope.gguf` that does not exist: "Model file ... does not exist" (exit 3), not a folder holding config.json."""
    extra = ["--prompt", "x"] if command == "run" else []
    done = run_cli(command, str(tmp_path / "nope.gguf"), *extra)
    stderr = without_notices(done.stderr)
    assert done.returncode == 3, done.stderr
    assert stderr.startswith(f"kernelbay {command}: error: Model file '{tmp_path / 'nope.gguf'}' does not exist")
    assert "config.json" not in stderr and "folder that holds" not in stderr
