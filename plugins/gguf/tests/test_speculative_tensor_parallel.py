"""An EAGLE-3 draft beside a GGUF target at tensor_parallel_size=2: the draft, on the driver, looks tokens up in the
target's whole token table, gathered from the ranks' quantized vocabulary rows (dequantized as lookups return them)."""

from __future__ import annotations

import torch
import transformers
from gguf import GGMLQuantizationType as Q

from kernelbay_engine import LLM, SamplingParams
from plugins.engine.tests.eagle3_drafts import draft_config, random_tensors, write_draft
from plugins.gguf.tests._write import write_gguf
from tests.models._tiny import COMMON, Tiny
from tests.models.conftest import build_reference

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [96, 95, 11], [40, 41, 42, 43, 44]]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
SIZES = {**COMMON, "hidden_size": 128, "intermediate_size": 256, "initializer_range": 0.3, "vocab_size": 97}
"""Whole Q4_0 blocks in every rank's share; 97 tokens split 49 + 49 (the last row padding); 3 layers: the default aux
layers (2, 1, 0)."""


def test_a_draft_reads_the_whole_quantized_table_gathered_from_the_ranks(tmp_path):
    """Q4_0, tied: the draft's lookups at two ranks equal one process's table lookups for every token, and a random
    draft's guesses leave one process's plain tokens."""
    tiny = Tiny("tp gguf draft", lambda: transformers.LlamaConfig(**SIZES, tie_word_embeddings=True))
    (tmp_path / "target").mkdir()
    target = write_gguf(tmp_path / "target" / "model.gguf", build_reference("llama", tiny=tiny), "llama", qtype=Q.Q4_0)
    config = draft_config(SIZES)
    draft = write_draft(tmp_path / "draft", config, random_tensors(config, seed=1))
    single = LLM(target, progress=False)
    expected = [o.token_ids for o in single.generate(PROMPTS, GREEDY)]
    with torch.inference_mode():
        table = single.model.input_embeddings()(torch.arange(97)).float()
    del single
    llm = LLM(target, progress=False, tensor_parallel_size=2, speculative=draft, num_speculative_tokens=3)
    try:
        assert llm.runner.file_codes["model.embed_tokens"].startswith("GGUF Q4_0"), llm.runner.file_codes
        with torch.inference_mode():
            assert torch.equal(llm._core.proposer.draft.embed(torch.arange(97)), table)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
        assert llm.stats().spec_draft_tokens > 0
    finally:
        llm.runner.shutdown()
