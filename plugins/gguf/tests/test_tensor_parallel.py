"""GGUF files at tensor_parallel_size=2 (two gloo ranks): on the file's own codes and dequantized, each rank reading
only its share of every tensor (rows, or whole blocks of each row's columns)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from kernelbay_gguf import slices
from kernelbay_gguf.slices import unpermute_rows
from kernelbay_gguf.tensors import TensorInfo

from kernelbay_engine import LLM, SamplingParams
from kernelbay_engine.args import EngineArgumentError
from kernelbay_engine.distributed.sharding import weight_bytes
from kernelbay_engine.explain.document import explain_model
from kernelbay_engine.loading import CheckpointError
from plugins.gguf.tests._write import permute, write_gguf, write_random_k_quants
from tests.models._tiny import COMMON, Tiny
from tests.models.conftest import build_reference

PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [3, 40, 17, 22, 8, 9, 10]]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
# 4 heads of 32 and an FFN of 256: every share a rank takes of a row-parallel layer's inputs (64, 128) is whole
# blocks of 32; large weights, so that greedy choices are not near-ties
WIDE = dict(hidden_size=128, intermediate_size=256, initializer_range=0.3)


def _write(folder: Path, qtype: Q, **sizes) -> Path:
    config = {**COMMON, **sizes}
    tiny = Tiny("tp gguf", lambda: transformers.LlamaConfig(**config))
    folder.mkdir()
    return write_gguf(folder / "model.gguf", build_reference("llama", tiny=tiny), "llama", qtype=qtype)


def _parameter_counts(path: Path) -> list[int]:
    """Values of every tensor in the file."""
    return [math.prod(t.shape) for t in gguf.GGUFReader(path).tensors]


def _tokens(llm: LLM) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize(
    ("qtype", "vocab", "tied"),
    [(Q.Q8_0, 96, False), (Q.Q4_0, 97, True)],
    ids=["Q8_0", "Q4_0 tied, odd vocabulary (padded rows)"],
)
def test_greedy_tokens_on_the_files_codes_at_two_ranks_equal_one_rank(tmp_path, qtype, vocab, tied):
    """Every linear and the table run the file's own codes on both ranks (Llama's permuted Q/K rows, fused q/k/v and
    gate/up, row-parallel o_proj/down_proj split on whole blocks, a tied head's vocabulary rows held once for both),
    and greedy decoding gives the tokens of one process; each rank holds half of the sharded codes, which with the
    replicated norms are the whole model's."""
    path = _write(tmp_path / "model", qtype, **WIDE, vocab_size=vocab, tie_word_embeddings=tied)
    single = LLM(path, progress=False)
    expected, whole = _tokens(single), weight_bytes(single.model)
    llm = LLM(path, progress=False, tensor_parallel_size=2)
    try:
        assert llm.quant_report.keys() == single.quant_report.keys()
        assert all(what.startswith(f"GGUF {qtype.name} on ") for what in llm.quant_report.values()), llm.quant_report
        assert _tokens(llm) == expected
        if tied and llm.quant_report["lm_head"].endswith(" on int8_dot"):  # the table reads the head's codes
            assert not llm.model.model.embed_tokens.method.owns_codes
        first, second = llm.runner.reports
        assert first.sharded_weight_bytes == second.sharded_weight_bytes > 0
        replicated = first.weight_bytes - first.sharded_weight_bytes
        assert replicated == 4 * 128 * (2 * 3 + 1)  # the float32 norms, nothing else
        if vocab % 2 == 0:  # an odd vocabulary pads the last rank's rows
            assert 2 * first.sharded_weight_bytes + replicated == whole
        planned = explain_model(path, tensor_parallel_size=2)["sections"]["tensor_parallel"]
        share = planned["per_rank"]  # counted from the header: codes at their bits, float32 scales (and zeros)
        assert share["weight_bytes"] - share["sharded_weight_bytes"] == replicated
        # the kernels' packed forms hold the scales (and zeros) in 16 bits: Q4_0 0.625 bytes a weight, not 0.75
        assert share["sharded_weight_bytes"] == pytest.approx(first.sharded_weight_bytes, rel=0.25)
        assert planned["whole_weight_bytes"] < 0.4 * 4 * sum(_parameter_counts(path))  # codes, not float32
    finally:
        llm.runner.shutdown()


def test_a_gguf_moe_model_splits_its_experts_over_the_ranks(tmp_path):
    """Qwen3-MoE in Q8_0: attention on the codes of each rank's heads, the four experts split 2 + 2 (each rank reads
    only its experts' tensors, which its MoE kernel runs as in one process), the router replicated; greedy tokens
    equal one process's."""
    config = {**COMMON, **WIDE}
    tiny = Tiny(
        "tp gguf moe",
        lambda: transformers.Qwen3MoeConfig(
            **config, num_experts=4, num_experts_per_tok=2, head_dim=32, moe_intermediate_size=64, norm_topk_prob=True
        ),
    )
    (tmp_path / "moe").mkdir()
    path = write_gguf(tmp_path / "moe" / "model.gguf", build_reference("qwen3moe", tiny=tiny), "qwen3moe", qtype=Q.Q8_0)
    expected = _tokens(LLM(path, progress=False))
    llm = LLM(path, progress=False, tensor_parallel_size=2)
    try:
        assert llm.quant_report["model.layers.0.self_attn.o_proj"].startswith("GGUF Q8_0 on ")
        experts = llm.quant_report["model.layers.0.mlp.experts.down_proj"]
        assert experts == "per-expert weights: the MoE kernel runs them"
        assert llm.model.model.layers[0].mlp.expert_parallel.count == 2
        assert _tokens(llm) == expected
    finally:
        llm.runner.shutdown()


def test_a_dequantized_file_at_two_ranks_equals_one_rank(tmp_path):
    """quantization="none": each rank dequantizes its share as it loads, also where the share cuts blocks (an FFN
    of 96 splits each row of down_proj's Q8_0 blocks of 32 at column 48: the covering blocks are read, then cut)."""
    path = _write(tmp_path / "model", Q.Q8_0, initializer_range=0.3)
    expected = _tokens(LLM(path, progress=False, quantization="none"))
    llm = LLM(path, progress=False, tensor_parallel_size=2, quantization="none")
    try:
        assert llm.quant_report is None
        assert _tokens(llm) == expected
        first, second = llm.runner.reports
        assert first.sharded_weight_bytes == second.sharded_weight_bytes > 0.8 * first.weight_bytes
    finally:
        llm.runner.shutdown()


def test_codes_a_share_would_cut_are_refused_before_loading(tmp_path):
    """Q8_0 with an FFN of 96 (down_proj's share, 48 inputs, is not whole blocks of 32) and Q4_K 256 wide (shares
    of 128 inputs, not whole super-blocks of 256): refused on their codes, naming the tensors, before any rank
    starts; quantization='none' is the way out the message gives."""
    q8 = _write(tmp_path / "q8", Q.Q8_0)
    cut = (
        r"blk\.N\.ffn_down\.weight is Q8_0, in blocks of 32 values along a row, but a rank's share of its 96 inputs "
        r"is 48 .*quantization='none'"
    )
    with pytest.raises(EngineArgumentError, match=cut):
        LLM(q8, progress=False, tensor_parallel_size=2)
    (refused,) = explain_model(q8, tensor_parallel_size=2)["sections"]["tensor_parallel"]["refused"]
    assert re.search(cut, refused)
    dequantized = explain_model(q8, tensor_parallel_size=2, quantization="none")["sections"]["tensor_parallel"]
    assert "refused" not in dequantized
    (tmp_path / "k").mkdir()
    k_quants = write_random_k_quants(tmp_path / "k" / "model.gguf", lambda name: Q.Q4_K)
    with pytest.raises(EngineArgumentError, match=r"blk\.N\.attn_output\.weight is Q4_K, in blocks of 256") as refused:
        LLM(k_quants, progress=False, tensor_parallel_size=2)
    assert "blk.N.ffn_down.weight is Q4_K" in str(refused.value)


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0, Q.Q4_1], ids=lambda q: q.name)
@pytest.mark.parametrize(("dim", "start", "length"), [(0, 8, 8), (1, 32, 64), (1, 48, 40)])
def test_a_slice_is_read_from_its_own_bytes(qtype, dim, start, length):
    """Rows, or columns (whole blocks, or the blocks covering a cut), of a stored tensor dequantize to the same slice
    of the whole tensor; the codes of a column range are that range of each row's bytes."""
    rng = np.random.default_rng(0)
    whole = rng.standard_normal((16, 128)).astype(np.float32)
    stored = whole if qtype == Q.F32 else gguf.quants.quantize(whole, qtype)
    tensor = stored.view(np.uint8).reshape(16, -1)
    info = TensorInfo("blk.0.ffn_down.weight", qtype, (16, 128), 0, tensor.nbytes, tensor.nbytes)
    expected = torch.from_numpy(gguf.quants.dequantize(stored, qtype)).narrow(dim, start, length)
    assert torch.equal(slices.values(tensor, info, dim, start, length), expected)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if dim == 1 and start % block == 0 and length % block == 0:
        raw = slices.raw(tensor, info, dim, start, length)
        assert raw.shape == (16, length // block * size)
        assert np.shares_memory(raw, tensor)  # a view of the mapped bytes: nothing else is touched


def test_a_row_slice_of_permuted_q_rows_is_its_own_heads():
    """Llama's Q rows are stored permuted per head: a share of whole heads un-permutes on its own; one that cuts a
    head is refused."""
    whole = np.arange(8 * 4 * 32, dtype=np.float32).reshape(8 * 4, 32)  # 4 heads of 8 rows
    stored = permute(whole, 4)
    info = TensorInfo("blk.0.attn_q.weight", Q.F32, (32, 32), 0, stored.nbytes, stored.nbytes, permute_heads=4)
    tensor = stored.view(np.uint8).reshape(32, -1)
    got = slices.values(tensor, info, 0, 16, 16)
    assert torch.equal(got, torch.from_numpy(whole[16:32]))
    assert torch.equal(unpermute_rows(torch.from_numpy(stored), 4)[16:32], got)
    with pytest.raises(CheckpointError, match=r"rows \[4, 20\) cut its heads of 8 rows"):
        slices.values(tensor, info, 0, 4, 16)
