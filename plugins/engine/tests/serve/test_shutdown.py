"""`kernelbay serve` as a process: SIGTERM stops accepting, lets running requests finish, and exits 0."""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from .test_errors import _open_stream


def _start(folder, *options) -> tuple[subprocess.Popen, str]:
    """A `kernelbay serve` process on a free port; its URL once /health answers."""
    command = [sys.executable, "-m", "kernelbay.cli", "serve", str(folder), "--port", "0", *options]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stderr is not None
    said = []
    while not (found := re.search(r" on (http://\S+)/v1$", said[-1] if said else "")):
        line = process.stderr.readline().decode()  # other notices (a native build) may come first
        assert line, f"the server exited without announcing its address: {''.join(said)}"
        said.append(line.rstrip("\n"))
    url = found.group(1)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return process, url
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline and process.poll() is None, "the server did not come up"
            time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_finishes_running_requests_and_exits_0(chat_llama):
    """A stream running at SIGTERM completes (to `[DONE]`), new connections are refused, the exit code is 0."""
    process, url = _start(chat_llama, "--shutdown-timeout", "30")
    try:
        body = {"prompt": "the", "max_tokens": 300, "ignore_eos": True, "stream_options": {"include_usage": True}}
        connection, response = _open_stream(url, body, None)
        process.send_signal(signal.SIGTERM)
        events = [e for e in response.read().decode().split("\n\n") if e]
        connection.close()
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2].removeprefix("data: "))["usage"]["completion_tokens"] == 300
        assert process.wait(30) == 0
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{url}/health", timeout=5)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-queued", "-1"], "--max-queued must be at least 0, got -1"),
        (["--port", "70000"], "--port must be at most 65535, got 70000"),
        (["--shutdown-timeout", "nan"], "--shutdown-timeout must be a number of seconds >= 0"),
    ],
)
def test_bad_options_are_one_line_errors(capsys, options, message):
    """A bad serve option is exit 1 with one line naming it, before anything loads."""
    from kernelbay.cli import main

    assert main(["serve", *options]) == 1
    assert f"kernelbay serve: error: {message}" in capsys.readouterr().err


def test_a_taken_port_fails_before_the_model_loads(capsys):
    """Listening comes first: a port in use is exit 1 naming it, without loading the model."""
    import socket

    from kernelbay.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--max-model-len", "1"]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_past_the_grace_period_aborts_and_exits_0(chat_llama):
    """A request still running when --shutdown-timeout ends is cut off (no `[DONE]`), and the exit code is 0."""
    process, url = _start(chat_llama, "--shutdown-timeout", "0")
    try:
        body = {"prompt": "the", "max_tokens": 500, "ignore_eos": True}
        connection, response = _open_stream(url, body, None)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            received = response.read()
        except http.client.IncompleteRead as cut:
            received = cut.partial
        connection.close()
        assert b"data: [DONE]" not in received
        assert process.wait(30) == 0
        assert time.monotonic() - signalled < 20
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
