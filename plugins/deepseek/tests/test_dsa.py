"""DeepSeek-V3.2 sparse attention (DSA) against transformers, and the backends that refuse it."""

from __future__ import annotations

import pytest

from kernelbay.attention import BackendNotCapable
from kernelbay.errors import ConfigError
from kernelbay_engine.explain import explain_model, render_text
from kernelbay_engine.runner import ModelRunner, StepRequest
from tests._paths import REAL_CONFIGS
from tests.models._parity import TOLERANCE, compare_generation, reference_logits, runner

from ._tiny_v32 import INDEX_TOPK, PROMPTS, TINY_V32

NAME = "deepseek_v32"


@pytest.fixture(scope="module")
def v32(loaded):
    return loaded(NAME, TINY_V32[NAME])


def test_logits_and_greedy_tokens_match_transformers_on_vanilla(v32):
    """Prefill of four prompts of mixed lengths (most longer than index_topk) + 8 decode steps: logits within
    1e-4, same greedy tokens, with each query attending to the indexer's top-k keys only."""
    hf_model, model = v32
    assert max(map(len, PROMPTS)) > INDEX_TOPK and model.config.indexer.index_topk == INDEX_TOPK
    compare_generation(hf_model, runner(model, "VANILLA"), f"{NAME} VANILLA", prompts=PROMPTS)


def test_chunked_prefill_picks_among_cached_and_new_keys(v32):
    """A prompt prefilled in two chunks, the second beside a decode: the indexer scores the cached keys with the
    new ones, so every position's logits match transformers' on the whole sequence."""
    hf_model, model = v32
    run = runner(model, "VANILLA")
    long, short = PROMPTS[0], PROMPTS[2]
    run.step([StepRequest(0, long[:5], 0), StepRequest(1, short, 0)])
    logits = run.step([StepRequest(0, long[5:], 5), StepRequest(1, [7], len(short))])
    expected = reference_logits(hf_model, [long, [*short, 7]])
    assert (logits - expected).abs().max().item() <= TOLERANCE
    for request in (0, 1):
        run.free(request)


def test_the_engine_cache_holds_the_indexer_key_beside_the_latent(v32):
    """The runner's paged cache prices and allocates kv_lora_rank + qk_rope_head_dim + index_head_dim per token and
    layer: what ModelConfig.kv_bytes_per_token says."""
    _, model = v32
    cfg = model.config
    run = ModelRunner(model, num_blocks=8, block_size=4, attention_backend="VANILLA")
    width = cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim + cfg.indexer.index_head_dim
    assert run.cache.bytes_per_block == cfg.num_hidden_layers * width * 4 * 4 == cfg.kv_bytes_per_token() * 4
    assert {tuple(e.layer.backend.kv_cache.shape) for e in run.cache.layers} == {(1, 8, 4, 1, width)}


def test_an_fp8_kv_cache_is_refused_for_dsa(v32):
    """The indexer keys would be stored with the latent's per-tensor fp8 scale (DeepSeek keeps its own per-block
    scales): the option check refuses the combination before anything is allocated, saying what to use."""
    _, model = v32
    with pytest.raises(ConfigError, match=r"sparse attention \(dsa\) cannot be combined with a KV cache in another"):
        ModelRunner(model, num_blocks=8, block_size=4, attention_backend="VANILLA", kv_cache_dtype="fp8_e4m3")


@pytest.mark.parametrize("backend", ["SDPA", "FLEX"])
def test_backends_without_dsa_refuse_naming_the_sparse_mode(v32, backend):
    """SDPA and FLEX do not declare sparse mode "dsa": requesting them is an error that names it."""
    _, model = v32
    with pytest.raises(BackendNotCapable, match=r"sparse_mode: dsa is not supported \(supported: none\)"):
        ModelRunner(model, num_blocks=64, block_size=4, attention_backend=backend)


def test_explain_shows_the_indexer_its_cache_bytes_and_the_backend_choice():
    """`kernelbay explain deepseek-v3.2`: indexer geometry, KV bytes with the indexer key, VANILLA chosen for the
    indexed layers and SDPA/FLEX refused with the sparse mode named."""
    doc = explain_model(REAL_CONFIGS / "deepseek-v3.2", memory="4GiB")
    assert doc["config"]["indexer"] == {
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 2048,
        "cache_width": 128,
    }
    kv = doc["kv_cache"]
    assert (kv["bytes_per_token"], kv["indexer_bytes_per_token"]) == (61 * (512 + 64 + 128) * 2, 61 * 128 * 2)
    fit = doc["sections"]["kv_memory"]["tokens_that_fit"]
    assert fit == 4 * 2**30 // (kv["bytes_per_token"] * 16) * 16  # whole blocks of the VANILLA spec
    (group,) = doc["attention"]["layer_groups"]
    assert (group["kind"], group["backend"], group["requirements"]["sparse_mode"]) == (
        "indexed_attention",
        "VANILLA",
        "dsa",
    )
    refused = {c["name"]: c["failures"] for c in group["candidates"] if not c["capable"]}
    for name in ("SDPA", "FLEX"):
        assert "sparse_mode: dsa is not supported (supported: none)" in refused[name]
    text = render_text(doc)
    assert "DSA indexer (64 heads x 128, top-2048 keys per query)" in text
    assert "85,888 bytes/token (bfloat16, of which 15,616 the DSA indexer keys)" in text
