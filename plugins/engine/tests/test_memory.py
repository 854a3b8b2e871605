"""The default KV cache is capped at 512 MiB whatever the context, and its untouched pages cost no memory."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernelbay_engine.errors import RequestTooLarge
from kernelbay_engine.memory import DEFAULT_KV_CACHE_MEMORY, plan_num_blocks
from kernelbay_engine.sampling import SamplingParams
from tests.cli.conftest import run_cli, without_notices

LLAMA_8B_BLOCK = 32 * 2 * 8 * 128 * 2 * 16  # 32 layers, k and v, 8 kv heads x 128, bf16, 16 tokens: 2 MiB


def _rss_mib() -> int:
    """This process's resident memory (psutil may not be installed)."""
    with open("/proc/self/status") as status:
        line = next(row for row in status if row.startswith("VmRSS:"))
    return int(line.split()[1]) // 1024


@pytest.fixture(scope="module")
def huge_context(tiny_llama, tmp_path_factory) -> Path:
    """The tiny Llama with a 10^9-token context: one full context would take 512 GB of cache."""
    folder = tmp_path_factory.mktemp("huge-context") / "model"
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 10**9
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("max_model_len", [131072, 10**9])
def test_default_cache_is_capped_at_512mib(max_model_len):
    """A Llama-3.1-8B geometry gets 512 MiB by default, not 64 full contexts (16 GiB) nor one 10^9-token one."""
    blocks = plan_num_blocks(
        bytes_per_block=LLAMA_8B_BLOCK,
        block_size=16,
        kv_cache_memory=None,
        max_num_seqs=64,
        max_model_len=max_model_len,
    )
    assert blocks * LLAMA_8B_BLOCK == DEFAULT_KV_CACHE_MEMORY == 512 * 2**20


def test_default_cache_smaller_than_the_cap_when_contexts_fit():
    """Below the cap the default is exactly max_num_seqs full contexts (a partial last block included)."""
    assert (
        plan_num_blocks(bytes_per_block=1600, block_size=16, kv_cache_memory=None, max_num_seqs=2, max_model_len=65)
        == 10
    )


def test_a_budget_without_one_block_is_a_request_too_large_error():
    """kv_cache_memory (or a default cap) below one block: RequestTooLarge (exit 12) that is also a ValueError."""
    with pytest.raises(RequestTooLarge, match="holds no KV-cache block") as caught:
        plan_num_blocks(bytes_per_block=1600, block_size=16, kv_cache_memory=100, max_num_seqs=1, max_model_len=8)
    assert isinstance(caught.value, ValueError) and caught.value.exit_code == 12
    with pytest.raises(RequestTooLarge, match="default KV cache"):
        plan_num_blocks(bytes_per_block=2**30, block_size=16, kv_cache_memory=None, max_num_seqs=1, max_model_len=8)


def test_huge_context_gets_the_cap_and_untouched_pages_stay_unresident(huge_context):
    """LLM() on a 10^9-token context allocates the 512 MiB cap (not 512 GB), resident only as it fills, and runs;
    a request needing more than the whole cache is refused at submission with RequestTooLarge."""
    from kernelbay_engine import LLM

    before = _rss_mib()
    llm = LLM(huge_context, progress=False, max_num_seqs=1)
    grown = _rss_mib() - before
    cache_bytes = llm.runner.num_blocks * llm.runner.bytes_per_block
    assert cache_bytes == DEFAULT_KV_CACHE_MEMORY // llm.runner.bytes_per_block * llm.runner.bytes_per_block
    assert cache_bytes > DEFAULT_KV_CACHE_MEMORY - llm.runner.bytes_per_block
    assert grown < 128, f"constructing the LLM made {grown} MiB resident; the 512 MiB cache must stay lazy"
    out = llm.generate([[1, 5, 9]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    too_many = llm.runner.num_blocks * 16 + 1
    with pytest.raises(RequestTooLarge, match="whole cache has"):
        llm.generate([[1, 5, 9]], SamplingParams(max_tokens=too_many, temperature=0, ignore_eos=True))


def test_cli_exit_codes_for_cache_sizes(tiny_llama, huge_context):
    """`kernelbay run`: a --kv-cache-memory that holds no block, and a request larger than the capped default
    cache, are each one `error:` line with exit code 12, not a traceback."""
    runs = {
        "tiny budget": ("run", str(tiny_llama), "--prompt", "the", "--kv-cache-memory", "100"),
        "over the cap": ("run", str(huge_context), "--prompt", "the", "--raw", "--max-tokens", str(10**8)),
    }
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(runs, pool.map(lambda args: run_cli(*args), runs.values()), strict=True))
    for name, fragment in (("tiny budget", "holds no KV-cache block"), ("over the cap", "whole cache has")):
        result, stderr = results[name], without_notices(results[name].stderr)
        assert result.returncode == 12, (name, result.returncode, result.stderr)
        assert stderr.startswith("kernelbay run: error: ") and fragment in stderr, (name, result.stderr)
        assert "Traceback" not in stderr and len(stderr.splitlines()) == 1, (name, result.stderr)
