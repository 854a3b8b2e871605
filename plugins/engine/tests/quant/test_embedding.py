"""A token embedding table held as quantized codes: rows equal the codes' dequantized reference bit for bit."""

from __future__ import annotations

import functools

import pytest
import torch

from kernelbay.errors import ConfigError
from kernelbay_engine.models.base import VocabEmbedding, activation_dtype_device
from kernelbay_engine.quant import QuantizedEmbedding, from_q4_1, from_q8_0, quantize, set_quantized_embedding
from kernelbay_engine.quant.kernels import NativeDotKernel, dot_code_rows, dot_scale_rows, holds_scales
from plugins.engine.tests.quant._kernels_here import skip_unless

VOCAB, HIDDEN = 97, 64


def _weights(gen: torch.Generator) -> dict:
    scale = (torch.rand(VOCAB, HIDDEN // 32, generator=gen) * 0.02 + 1e-3).half()
    q8 = torch.randint(-128, 128, (VOCAB, HIDDEN), dtype=torch.int8, generator=gen)
    nibbles = torch.randint(0, 16, (VOCAB, HIDDEN), dtype=torch.uint8, generator=gen)
    low = -(torch.rand(VOCAB, HIDDEN // 32, generator=gen) * 0.1).half()
    return {
        "q8_0": from_q8_0(q8, scale),
        "q4_1": from_q4_1(nibbles, scale, low),
        "int8 per-channel": quantize(torch.randn(VOCAB, HIDDEN, generator=gen), 8),
    }


@pytest.mark.parametrize("kind", ["q8_0", "q4_1", "int8 per-channel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rows_equal_the_dequantized_weight_bit_for_bit(kind, dtype):
    """Any id shape, repeated ids, the first and last rows; in the model dtype."""
    gen = torch.Generator().manual_seed(0)
    weight = _weights(gen)[kind]
    table = QuantizedEmbedding(weight, dtype)
    reference = weight.dequantize(dtype)
    for ids in (torch.tensor([0]), torch.tensor([VOCAB - 1, 3, 3, 0]), torch.randint(0, VOCAB, (2, 5), generator=gen)):
        rows = table.lookup(ids)
        assert rows.dtype == dtype and rows.shape == (*ids.shape, HIDDEN)
        torch.testing.assert_close(rows, reference[ids], rtol=0, atol=0)


def test_a_vocab_embedding_holds_its_rows_as_codes():
    """The float table goes; the module's output (Gemma's scale included) and the model's activation dtype stay."""
    weight = _weights(torch.Generator().manual_seed(1))["q8_0"]
    embedding = VocabEmbedding(VOCAB, HIDDEN, scale=HIDDEN**0.5)
    embedding.weight.data.copy_(weight.dequantize())
    ids = torch.tensor([5, 0, VOCAB - 1])
    expected = embedding(ids)
    set_quantized_embedding(embedding, weight)
    assert "weight" not in embedding._parameters
    assert list(embedding.parameters()) == []
    torch.testing.assert_close(embedding(ids), expected, rtol=0, atol=0)

    class Model(torch.nn.Module):
        def input_embeddings(self):
            return embedding

    assert activation_dtype_device(Model()) == (torch.float32, torch.device("cpu"))


def test_a_table_of_another_shape_or_module_is_refused():
    weight = _weights(torch.Generator().manual_seed(2))["q8_0"]
    with pytest.raises(ConfigError, match=r"quantized table is \[97, 64\], the embedding is \[96, 64\]"):
        set_quantized_embedding(VocabEmbedding(VOCAB - 1, HIDDEN), weight)
    with pytest.raises(ConfigError, match="is not a plain VocabEmbedding table"):
        set_quantized_embedding(torch.nn.Embedding(VOCAB, HIDDEN), weight)
    held = VocabEmbedding(VOCAB, HIDDEN)
    set_quantized_embedding(held, weight)
    with pytest.raises(ConfigError, match="is not a plain VocabEmbedding table"):
        set_quantized_embedding(held, weight)


@skip_unless("int8_dot")
@pytest.mark.parametrize("kind, hidden", [("q8_0", HIDDEN), ("q4_1", HIDDEN), ("q8_0", 96), ("q4_1", 96)])
def test_a_table_reading_the_tied_heads_codes_holds_no_copy(kind, hidden):
    """Rows read back from the LM head's int8_dot layout (an odd block count padded, for 96) equal the codes' own
    dequantized rows bit for bit; the table then holds only the scales (and zeros)."""
    gen = torch.Generator().manual_seed(3)
    weight = quantize(torch.randn(VOCAB, hidden, generator=gen), 8 if kind == "q8_0" else 4, 32)
    native = NativeDotKernel.pack(weight).native
    ids = torch.tensor([0, VOCAB - 1, 7, 7, 40])
    assert torch.equal(dot_code_rows(native, ids), weight.q[ids])
    table = QuantizedEmbedding(weight, torch.float32, functools.partial(dot_code_rows, native))
    torch.testing.assert_close(table.lookup(ids), weight.dequantize()[ids], rtol=0, atol=0)
    own = QuantizedEmbedding(weight, torch.float32)
    assert own.nbytes - table.nbytes == VOCAB * hidden  # the codes, one per byte: held by the head alone


@skip_unless("int8_dot")
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_table_reads_a_file_blocks_scales_from_the_tied_head(kind):
    """A file's blocks (float16 scales per 32): the head's float16 d is the table's scales exactly, so the table reads
    them there too, rows still bit for bit; scales float16 would round (quantize's float32 ones) stay the table's."""
    gen = torch.Generator().manual_seed(5)
    weight = _weights(gen)[kind]
    native = NativeDotKernel.pack(weight).native
    assert holds_scales(native, weight.scale)
    ids = torch.tensor([0, VOCAB - 1, 7, 7, 40])
    table = QuantizedEmbedding(
        weight, torch.float32, functools.partial(dot_code_rows, native), functools.partial(dot_scale_rows, native)
    )
    torch.testing.assert_close(table.lookup(ids), weight.dequantize()[ids], rtol=0, atol=0)
    assert table.scale is None and table.nbytes == (weight.zero.nbytes if weight.zero is not None else 0)
    rounded = quantize(torch.randn(VOCAB, HIDDEN, generator=gen), 8, 32)
    assert not holds_scales(NativeDotKernel.pack(rounded).native, rounded.scale)
