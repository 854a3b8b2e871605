"""`kernelbay ARGS` in a fresh interpreter: for the CLI tests here and kernelbay-engine's `kernelbay run` tests
(plugins/engine/tests/cli)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests._paths import REAL_CONFIGS as CONFIGS
from tests._paths import REPO

__all__ = ["CONFIGS", "REPO", "run_cli", "without_notices"]

# Lines a run may print on stderr whatever it is asked (a first native build on a fresh machine): a test of
# something else reads stderr without them.
NOTICES = ("kernelbay-engine: building its native CPU ops", "kernelbay-engine: removing ")


def without_notices(stderr: str) -> str:
    """stderr without the notice lines of NOTICES."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith(NOTICES))


def run_cli(*args: str, timeout: int = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`kernelbay ARGS` in a fresh interpreter (one torch thread, no KERNELBAY_* from the caller but `env`'s)."""
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "kernelbay.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
