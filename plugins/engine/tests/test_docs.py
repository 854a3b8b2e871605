"""The Python example in docs/engine.md runs as written (on the embedded demo checkpoint)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "engine.md"


def test_engine_doc_python_example_runs():
    """Every ```python block of docs/engine.md executes and prints what it promises."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, str(DOC), "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("0 ") and lines[1].startswith("1 ")
    assert "full_attention" in lines[-1]
