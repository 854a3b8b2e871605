"""Nothing in kernelbay touches the network unless the user asks for it: `explain` and `run` in processes whose
every socket connection ends the process loudly (a sitecustomize patches socket), on folders whose config names
remote code (DeciLM's auto_map) refused at once without --trust-remote-code, and HF_HUB_OFFLINE respected."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CONFIGS, REPO, run_cli

NETWORK_EXIT = 97
NO_NETWORK = f"""
import os, socket, sys, traceback

def _refuse(*args, **kwargs):  # a connection attempt ends the process: nothing can catch and retry it
    sys.stderr.write("NETWORK ACCESS ATTEMPTED\\n" + "".join(traceback.format_stack()))
    sys.stderr.flush()
    os._exit({NETWORK_EXIT})

socket.socket.connect = socket.socket.connect_ex = _refuse
socket.getaddrinfo = socket.create_connection = _refuse
"""
DECILM = str(CONFIGS / "llama-3-3-nemotron-super-49b-v1")
DEMO = str(REPO / "plugins/engine/kernelbay_engine/demo")


@pytest.fixture(scope="module")
def offline_env(tmp_path_factory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("no-network")
    (site / "sitecustomize.py").write_text(NO_NETWORK)
    return {"PYTHONPATH": str(site)}


@pytest.fixture(scope="module")
def own_code_folder(tmp_path_factory) -> str:
    """A Llama config whose architecture only the folder's own code would implement (auto_map, no code file)."""
    folder = tmp_path_factory.mktemp("own-code")
    config = json.loads((REPO / "plugins/engine/kernelbay_engine/demo/config.json").read_text())
    config |= {"architectures": ["MyOwnForCausalLM"], "auto_map": {"AutoModelForCausalLM": "modeling_mine.MyOwn"}}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_the_guard_fails_loudly(offline_env):
    """The harness itself: a connection attempt ends the process with its exit code and a marker."""
    code = "import socket; socket.create_connection(('example.com', 80))"
    env = {**os.environ, **offline_env}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == NETWORK_EXIT and "NETWORK ACCESS ATTEMPTED" in done.stderr


@pytest.mark.parametrize("command", ["explain", "run"])
@pytest.mark.parametrize("folder", ["decilm", "own_code"])
def test_remote_code_is_refused_at_once_naming_the_flag(command, folder, offline_env, own_code_folder):
    """Without --trust-remote-code, a model only folder code implements: exit 6 at once, --trust-remote-code
    named first, and no connection attempted (the model hub is never asked for the code)."""
    path = DECILM if folder == "decilm" else own_code_folder
    done = run_cli(command, path, *(["--prompt", "x"] if command == "run" else []), env=offline_env, timeout=120)
    assert "NETWORK ACCESS ATTEMPTED" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 6, done.stderr
    first = done.stderr.split(" (Unknown architecture")[0]  # the reason comes first, what else is known after
    arch = json.loads((Path(path) / "config.json").read_text())["architectures"][0]
    assert f"error: architecture '{arch}'" in first
    assert "cannot be served" in first and "it runs only with --trust-remote-code" in first


@pytest.mark.parametrize(
    "args",
    [
        ["explain", DECILM, "--trust-remote-code"],  # the folder has no code: a local error, no hub lookup
        ["explain", DEMO],
        ["run", "--prompt", "A", "--max-tokens", "2"],
    ],
)
def test_explain_and_run_make_no_connection(args, offline_env):
    """explain (trusting a folder without its code files, with HF_HUB_OFFLINE=1) and run of the demo: no socket."""
    done = run_cli(*args, env={**offline_env, "HF_HUB_OFFLINE": "1"}, timeout=180)
    assert "NETWORK ACCESS ATTEMPTED" not in done.stderr, done.stderr[-3000:]
    assert done.returncode in (0, 1), done.stderr
