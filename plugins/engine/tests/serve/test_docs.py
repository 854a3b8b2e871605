"""Every curl and Python example of docs/serving.md runs as written against a server like the page's."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ThreadServer

DOC = Path(__file__).resolve().parents[4] / "docs" / "serving.md"
DOC_URL = "http://127.0.0.1:8000"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _json_documents(text: str) -> list[dict]:
    decoder, documents, position = json.JSONDecoder(), [], 0
    while position < len(text.rstrip()):
        document, position = decoder.raw_decode(text, position)
        documents.append(document)
        position = len(text) - len(text[position:].lstrip())
    return documents


@pytest.fixture(scope="module")
def doc_server(serve_llm):
    """The page's server: the tests' chat model as `my-model`, no API key."""
    from kernelbay_engine.serve import ServeConfig, build_app

    with ThreadServer(build_app(serve_llm, ServeConfig(model_name="my-model"), max_num_seqs=16)) as url:
        yield url


@pytest.mark.skipif(shutil.which("curl") is None, reason="the page's shell examples use curl")
def test_curl_examples(doc_server):
    """The curl blocks answer JSON completions and a stream ending in `data: [DONE]`, never an error."""
    blocks = [b for b in _blocks("bash") if b.lstrip().startswith("curl")]
    assert len(blocks) == 2
    outputs = [
        subprocess.run(
            ["bash", "-e", "-c", b.replace(DOC_URL, doc_server)], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        for b in blocks
    ]
    completion, scored = _json_documents(outputs[0])
    assert completion["choices"][0]["text"] and completion["usage"]["completion_tokens"] == 12
    assert scored["choices"][0]["text"] == "The quick brown fox" and scored["usage"]["completion_tokens"] == 0
    events = [line for line in outputs[1].splitlines() if line]
    assert events[-1] == "data: [DONE]" and '"role":"assistant"' in events[0]


def test_python_example(doc_server):
    """The openai-client block runs and prints a completion, a log-likelihood, a streamed reply and logprobs."""
    (block,) = _blocks("python")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.replace(DOC_URL, doc_server), str(DOC), "exec"), {})
    lines = out.getvalue().splitlines()
    assert "CompletionUsage(" in lines[0]
    assert float(lines[1]) < 0
    assert any("completion_tokens=16" in line for line in lines)
    assert len(lines) >= 8
