"""The Python example of docs/real-model.md runs as written on the SmolLM2 GGUF and prints what it shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[3] / "docs" / "real-model.md"


@pytest.mark.slow
def test_real_model_doc_python_example_prints_what_the_doc_shows(smollm2):
    text = DOC.read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    shown = re.search(r"prints\n\n```\n(.*?)```", text, flags=re.S).group(1).splitlines()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, str(DOC), "exec"), {})
    assert out.getvalue().splitlines() == shown
