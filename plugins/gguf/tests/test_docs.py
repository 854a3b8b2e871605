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


def test_real_model_doc_says_what_quantization_gguf_does(tiny_gguf):
    """docs/real-model.md says `LLM(quantization="gguf")` builds no float copy of the linears it keeps quantized,
    and it does not: each kept linear holds the file's codes and no float weight."""
    from gguf import GGMLQuantizationType

    from kernelbay_engine import LLM

    text = " ".join(DOC.read_text().split())
    assert 'LLM(quantization="gguf")` never builds the float weights of the linears it keeps quantized' in text
    assert "still builds the float weights first" not in text
    llm = LLM(tiny_gguf("llama", GGMLQuantizationType.Q8_0), progress=False, quantization="gguf")
    kept = [m for name, m in llm.model.named_modules() if " on " in llm.quant_report.get(name, "")]
    assert kept and all("weight" not in m._parameters for m in kept), "a kept-quantized linear has a float weight"
