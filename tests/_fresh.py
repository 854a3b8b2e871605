"""Code run in a fresh interpreter: what a process imports can only be read from a clean `sys.modules`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable

_CHECK = """
import sys as _sys
_loaded = sorted(m for m in _sys.modules if any(m == name or m.startswith(name + ".") for name in {absent!r}))
assert not _loaded, f"imported: {{_loaded}}"
"""


def run_fresh(code: str, *args: str, absent: Iterable[str] = (), timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the statements `code` in a fresh interpreter (`args` its sys.argv[1:]); assert that it exits 0 and that no
    module named in `absent`, nor one under it, was imported by its end. The result, for its output."""
    script = code + _CHECK.format(absent=tuple(absent))
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result
