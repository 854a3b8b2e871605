"""Installing real distributions for the tests: built from source and put in a --target site, offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def install_into(target: Path, *sources: Path | str) -> Path:
    """`pip install --no-deps --no-build-isolation --no-index --target TARGET SOURCES...`; returns the site."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run([*cmd, "--target", str(target), *map(str, sources)], capture_output=True, text=True)
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    return target
