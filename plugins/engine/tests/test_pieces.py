"""Small engine pieces: lazy exports, memory sizes, incremental text with stop strings, request bookkeeping."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kernelbay_engine.detokenize import TextTracker
from kernelbay_engine.memory import parse_memory, plan_num_blocks
from kernelbay_engine.request import Request
from kernelbay_engine.sampling import SamplingParams


def test_engine_names_are_lazy_and_light():
    """`kernelbay_engine.LLM` resolves to the engine's class; SamplingParams alone does not import torch."""
    code = (
        "import sys, kernelbay_engine; from kernelbay_engine import SamplingParams; SamplingParams(max_tokens=2); "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "from kernelbay_engine.llm import LLM; assert kernelbay_engine.LLM is LLM"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "text, expected",
    [
        (4096, 4096),
        ("512MiB", 512 * 2**20),
        ("2GiB", 2 * 2**30),
        ("1.5GB", 1_500_000_000),
        ("10 kb", 10_000),
    ],
)
def test_parse_memory(text, expected):
    """Bytes or a number with a unit; binary and decimal units."""
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["lots", "2XB", -1, 0, True])
def test_parse_memory_rejects_nonsense(bad):
    """Unknown units, non-positive sizes and booleans are errors saying what is accepted."""
    with pytest.raises(ValueError, match="memory"):
        parse_memory(bad)


def test_block_planning():
    """An explicit budget is divided into blocks of bytes_per_block; the default covers max_num_seqs full
    contexts (a partial last block included), capped at 512 MiB even below one full context (test_memory.py)."""
    assert (
        plan_num_blocks(bytes_per_block=1600, block_size=16, kv_cache_memory=16_000, max_num_seqs=4, max_model_len=64)
        == 10
    )
    assert (
        plan_num_blocks(bytes_per_block=1600, block_size=16, kv_cache_memory=None, max_num_seqs=4, max_model_len=64)
        == 16
    )
    assert (
        plan_num_blocks(bytes_per_block=1600, block_size=16, kv_cache_memory=None, max_num_seqs=2, max_model_len=65)
        == 10
    )
    assert (
        plan_num_blocks(bytes_per_block=2**28, block_size=16, kv_cache_memory=None, max_num_seqs=8, max_model_len=64)
        == 2
    )
    with pytest.raises(ValueError, match="holds no KV-cache block"):
        plan_num_blocks(bytes_per_block=1600, block_size=16, kv_cache_memory=100, max_num_seqs=1, max_model_len=8)
    block = 16 * 2**17  # 16 tokens of 128 KiB
    blocks = plan_num_blocks(
        bytes_per_block=block, block_size=16, kv_cache_memory="1GiB", max_num_seqs=1, max_model_len=8
    )
    assert blocks * 16 == 8192


def _decoder(pieces: dict[int, str]):
    return lambda ids: "".join(pieces[i] for i in ids)


def test_text_tracker_holds_back_partial_characters():
    """A trailing replacement character (half a UTF-8 character) is not streamed until it resolves."""
    tracker = TextTracker(_decoder({1: "ab", 2: "\ufffd", 3: "é"}), stop=())
    tracker.update([1, 2])
    assert tracker.delta(final=False) == "ab"
    decode_fixed = _decoder({1: "ab", 2: "", 3: "é"})
    tracker.decode = decode_fixed
    tracker.update([1, 2, 3])
    assert tracker.delta(final=False) == "é"


def test_text_tracker_never_streams_a_stop_string():
    """Text that could start a stop string waits; once the stop appears the text is cut before it."""
    tracker = TextTracker(_decoder({1: "hello ", 2: "wor", 3: "ld!"}), stop=("world",))
    assert not tracker.update([1, 2])
    streamed = tracker.delta(final=False)
    assert tracker.update([1, 2, 3])
    streamed += tracker.delta(final=True)
    assert streamed == tracker.text == "hello "


def test_request_uncached_tokens():
    """After a preemption the whole sequence is recomputed; otherwise only the uncached tail is fed."""
    request = Request(0, [1, 2, 3], SamplingParams(max_tokens=5, temperature=0), max_model_len=100)
    assert request.uncached_token_ids() == [1, 2, 3]
    request.output_token_ids += [7, 8]
    request.num_cached = 4
    assert request.uncached_token_ids() == [8]
    request.num_cached = 0
    assert request.uncached_token_ids() == [1, 2, 3, 7, 8]
    assert Request(1, [1] * 90, SamplingParams(max_tokens=50), 100).max_total_tokens == 100
