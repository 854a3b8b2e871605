"""The CLI host under Ctrl-C and closed pipes: exit 130 / a quiet exit, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from .conftest import CONFIGS, REPO


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")}
    return env | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "KERNELBAY_TRACE": "1"}


# Trace lines of `kernelbay run` on the demo model, in order: discovery (torch and the engine import next),
# backend imports and selection, model import (before loading), weights loaded (allocation and prepacking next).
STAGES = ["discovered kernelbay ", "import kernelbay_torch.sdpa", "resolve model 'LlamaForCausalLM'", "loaded "]


def _interruptible() -> None:
    """In the child: SIGINT back to its default, as in a terminal. A suite started in the background (CI, `&`,
    nohup) inherits SIGINT ignored, and Python installs its KeyboardInterrupt handler only over the default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("stage", STAGES)
def test_sigint_during_run_exits_130_without_traceback(stage):
    """Ctrl-C at each startup stage of `kernelbay run` exits 130 with one line, never a traceback."""
    cmd = [sys.executable, "-m", "kernelbay.cli", "run", "--prompt", "hi", "--max-tokens", "400"]
    with subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=REPO,
        preexec_fn=_interruptible,
    ) as proc:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if stage in line:
                proc.send_signal(signal.SIGINT)
                break
        rest = proc.stderr.read()
        code = proc.wait(timeout=120)
    assert any(stage in line for line in seen), "".join(seen)[-2000:]
    assert code == 130, rest[-2000:]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest


@pytest.mark.parametrize(
    "args", [["plugins"], ["plugins", "--json", "--log"], ["explain", str(CONFIGS / "llama-3.2-1b")]]
)
def test_output_into_a_closed_pipe_exits_quietly(args):
    """`kernelbay plugins | head -1` (and explain) end without a BrokenPipeError traceback.

    The reader is `true`, which closes the pipe before the CLI writes, so the broken pipe is certain."""
    cli = " ".join([sys.executable, "-m", "kernelbay.cli", *args])
    out = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {cli} | true"], capture_output=True, text=True, env=_env(), cwd=REPO
    )
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr
    assert out.returncode in (0, 141)
