"""Threads reading their first configs at once, in a fresh interpreter (transformers not yet imported): every one
succeeds. transformers' lazy top-level module is not thread-safe, so kernelbay's first use of it is serialised."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests._paths import REAL_CONFIGS

NAMES = ["llama-3.1-8b", "qwen3-8b", "mixtral-8x7b-v0.1", "gemma-2-2b", "deepseek-v3", "phi-3-mini-4k-instruct"]

PROBE = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path

    threads, resolve_too, folder, names = int(sys.argv[1]), sys.argv[2] == "resolve", Path(sys.argv[3]), sys.argv[4:]
    barrier, failures = threading.Barrier(threads), []

    def work(i):
        barrier.wait()
        try:
            from kernelbay_engine.config import ModelConfig

            config = ModelConfig.from_pretrained(folder / names[i % len(names)])
            if resolve_too:
                from kernelbay.registry import resolve

                resolve("model", config.architecture)
        except BaseException as err:
            failures.append(f"{type(err).__name__}: {err}")

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(f"{threads - len(failures)}/{threads}")
    print("\\n".join(failures))
    """
)


def _probe(threads: int, mode: str) -> str:
    cli = [sys.executable, "-c", PROBE, str(threads), mode, str(REAL_CONFIGS), *NAMES]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_four_threads_reading_their_first_configs_all_succeed():
    """4 threads x ModelConfig.from_pretrained at once used to fail 2/4 with `cannot import name 'CONFIG_MAPPING'`."""
    assert _probe(4, "config") == "4/4"


def test_sixteen_threads_reading_configs_and_resolving_architectures_all_succeed():
    """The registry-thread probe: 16 threads reading configs and resolving their architectures at once (was 1/16)."""
    assert _probe(16, "resolve") == "16/16"
