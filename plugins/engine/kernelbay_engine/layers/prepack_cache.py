"""The timings behind `prepack_weights="auto"`, kept per machine so a load times each layer shape once, not every load.

A trial times dense and each packed form of one weight shape at the engine's row counts (layers/prepack.py); what
it measured depends on the machine, not on the weights' values. The timings are stored in one JSON file,
`$KERNELBAY_CACHE_DIR/prepack-timings.json` (default `$XDG_CACHE_HOME/kernelbay`, else `~/.cache/kernelbay`), under
a key naming the CPU (model name and feature flags), torch's version, the thread count, the dtype, the shape and
bias, the row counts and the forms timed. A later load with the same key reads them and decides by the same margins;
a changed CPU, torch, thread count or shape times again. `KERNELBAY_CACHE_DIR=""` turns the cache off (every load
times). An unreadable file is ignored and rewritten; writes are atomic (a temporary file renamed over it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

FILE_NAME = "prepack-timings.json"


def cache_file() -> Path | None:
    """Where the timings live, or None when `KERNELBAY_CACHE_DIR` is set empty (no cache)."""
    folder = os.environ.get("KERNELBAY_CACHE_DIR")
    if folder == "":
        return None
    if folder is None:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = str(Path(base) / "kernelbay")
    return Path(folder) / FILE_NAME


@functools.cache
def machine() -> str:
    """The CPU (model name and a digest of its flags) and torch's version: what a timing depends on."""
    import platform

    import torch

    from kernelbay_engine.quant.kernels import cpu_flags

    name = platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        name = next(
            (line.partition(":")[2].strip() for line in info.read_text().splitlines() if "model name" in line), name
        )
    flags = hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:12]
    return f"{name} flags:{flags} torch:{torch.__version__}"


def key(dtype, shape: tuple, rows, forms) -> str:
    """The entry of one trial: machine, threads, dtype, (out, in, bias), row counts, forms timed."""
    import torch

    out, inp, bias = shape
    return (
        f"{machine()} threads:{torch.get_num_threads()} {dtype} [{out}, {inp}] bias:{bias} "
        f"rows:{','.join(map(str, sorted(set(rows))))} forms:{','.join(forms)}"
    )


def load() -> dict[str, dict[str, float]]:
    file = cache_file()
    if file is None or not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):  # a damaged file: time again and rewrite it
        return {}
    return data if isinstance(data, dict) else {}


def store(new: dict[str, dict[str, float]]) -> None:
    """Merge `new` timings into the file (re-read first: another process may have added some)."""
    file = cache_file()
    if file is None or not new:
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        merged = load() | new
        tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(merged, indent=0, sort_keys=True))
        os.replace(tmp, file)
    except OSError:  # a read-only home: the next load times again, nothing is lost
        return
