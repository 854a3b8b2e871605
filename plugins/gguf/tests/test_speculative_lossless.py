"""Speculation is lossless on a GGUF model run on its file's codes: a verify row (the request's last token and its
guesses, attended over the cached context) gets decoding's bits, which int8 activations would otherwise amplify
into flipped greedy tokens."""

from __future__ import annotations

import pytest
import transformers
from gguf import GGMLQuantizationType as Q

from kernelbay_engine import LLM, SamplingParams
from plugins.engine.tests.eagle3_drafts import draft_config, random_tensors, write_draft
from plugins.gguf.tests._write import write_gguf
from tests.models._tiny import COMMON, Tiny
from tests.models.conftest import build_reference

SIZES = {**COMMON, "hidden_size": 128, "intermediate_size": 256, "initializer_range": 0.05, "vocab_size": 97}
"""Flat enough logits for near ties: with the verify row attending in one SDPA call, n-gram's tokens left plain
decoding's at token 175 of this prompt."""
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7]
GREEDY = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True, logprobs=3)


@pytest.mark.parametrize("backend", ["CPU_PAGED", "SDPA"])
def test_greedy_speculation_on_q4_1_codes_keeps_plain_tokens_and_logprobs(tmp_path, backend):
    """Q4_1 on its codes, one request: n-gram and a random EAGLE-3 draft give plain decoding's 200 tokens, and every
    token's logprobs (from a verify row's logits) equal plain decoding's bit for bit, on either CPU backend."""
    tiny = Tiny("lossless gguf", lambda: transformers.LlamaConfig(**SIZES))
    (tmp_path / "target").mkdir()
    target = write_gguf(tmp_path / "target" / "model.gguf", build_reference("llama", tiny=tiny), "llama", qtype=Q.Q4_1)
    config = draft_config(SIZES)
    draft = write_draft(tmp_path / "draft", config, random_tensors(config, seed=1))
    plain = LLM(target, progress=False, max_num_seqs=1, attention_backend=backend)
    assert plain.quant_report["model.layers.0.mlp.down_proj"].startswith("GGUF Q4_1 on "), plain.quant_report
    want = plain.generate([PROMPT], GREEDY)[0]
    for speculative in ("ngram", draft):
        llm = LLM(
            target,
            progress=False,
            max_num_seqs=1,
            speculative=speculative,
            num_speculative_tokens=4,
            attention_backend=backend,
        )
        got = llm.generate([PROMPT], GREEDY)[0]
        first = next((i for i, (a, b) in enumerate(zip(got.token_ids, want.token_ids, strict=True)) if a != b), None)
        assert got.token_ids == want.token_ids, f"{speculative}: tokens leave plain decoding's at {first}"
        assert got.logprobs == want.logprobs, f"{speculative}: logprobs differ from plain decoding's"
        assert llm.stats().spec_accepted_tokens > 0
