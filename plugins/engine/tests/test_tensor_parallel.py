"""Tensor (and expert) parallelism over gloo with two ranks: tokens, weight shares, registry hand-off, failures.

One spawned engine per model for the whole module (ranks take seconds to start); every engine is shut down at the
module's end, and the failure test checks that no rank process outlives it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from kernelbay_engine import LLM, SamplingParams
from kernelbay_engine.args import EngineArgumentError
from kernelbay_engine.distributed import TensorParallelFailure
from kernelbay_engine.distributed.handoff import registry_summary
from kernelbay_engine.distributed.sharding import weight_bytes

from .checkpoints import build_tiny_llama, build_tiny_model

CONFIGS = Path(__file__).parents[3] / "tests" / "data" / "configs"
PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [3, 40, 17, 22, 8, 9, 10]]
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128)
SIZES |= dict(initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _qwen3():
    """Tied embeddings over an odd vocabulary: the last rank's rows are padded."""
    return transformers.Qwen3Config(
        **SIZES, vocab_size=97, intermediate_size=96, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True
    )


def _deepseek_v2():
    """MLA (per-head projections split, the latent replicated), a dense layer, then 4 experts split 2 + 2 with a
    shared expert."""
    return transformers.DeepseekV2Config(
        **SIZES,
        vocab_size=96,
        intermediate_size=96,
        num_key_value_heads=4,
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        q_lora_rank=None,
        n_shared_experts=1,
        topk_method="greedy",
    )


def _deepseek_v32():
    """DeepSeek-V3.2: MLA over a query latent, 4 experts split 2 + 2, and DSA's lightning indexer (replicated: every
    rank picks the same top-4 keys for its heads); prompts and decodes run past the 4 keys, so attention is sparse."""
    return transformers.DeepseekV32Config(
        **SIZES,
        vocab_size=96,
        intermediate_size=96,
        num_key_value_heads=4,
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        n_shared_experts=1,
        index_n_heads=4,
        index_head_dim=16,
        index_topk=4,
    )


def _gpt_oss():
    """GPT-OSS: q/k/v/o biases and a sink per head (split with their heads), sliding and full layers, 4 experts with
    biases and interleaved gate/up split 2 + 2, the biased router replicated; widths multiples of 32 (MXFP4)."""
    return transformers.GptOssConfig(
        **SIZES,
        vocab_size=96,
        intermediate_size=32,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={**GPT_OSS_YARN, "truncate": False},
        attention_bias=True,
        swiglu_limit=0.3,
    )


GPT_OSS_YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32)
GPT_OSS_YARN |= dict(beta_fast=32, beta_slow=1)


def _mixtral():
    return transformers.MixtralConfig(
        **SIZES, vocab_size=96, intermediate_size=32, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2
    )


def _gpt2():
    """Biases everywhere, the fused c_attn stored transposed (Conv1D)."""
    return transformers.GPT2Config(
        vocab_size=96,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=128,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
    )


FAMILIES = {"llama": None, "qwen3": _qwen3, "deepseek_v2": _deepseek_v2, "mixtral": _mixtral, "gpt2": _gpt2}
FAMILIES |= {"deepseek_v32": _deepseek_v32, "gpt_oss": _gpt_oss}
_ENGINES: dict[str, tuple[list, LLM, int]] = {}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    made = {}
    for name, config in FAMILIES.items():
        folder = tmp_path_factory.mktemp(f"tp-{name}")
        made[name] = build_tiny_llama(folder) if config is None else build_tiny_model(folder, config())
    return made


@pytest.fixture(scope="module")
def engines(folders):
    """family -> (greedy tokens at TP=1, the TP=2 LLM, the TP=1 model's weight bytes); built on first use."""

    def get(name: str):
        if name not in _ENGINES:
            single = LLM(folders[name], progress=False)
            expected = [o.token_ids for o in single.generate(PROMPTS, GREEDY)]
            whole = weight_bytes(single.model)
            del single
            _ENGINES[name] = (expected, LLM(folders[name], progress=False, tensor_parallel_size=2), whole)
        return _ENGINES[name]

    yield get
    for _expected, llm, _bytes in _ENGINES.values():
        llm.runner.shutdown()
    _ENGINES.clear()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_tokens_at_two_ranks_equal_one_rank(engines, family):
    """[family] sharded over two gloo ranks, greedy decoding gives the single-process tokens."""
    expected, llm, _ = engines(family)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected


@pytest.mark.parametrize("family", ["llama", "deepseek_v2", "gpt2"])
def test_each_rank_holds_half_of_the_sharded_weights(engines, family):
    """Every sharded tensor is split in two equal shares; together with the replicas they are the whole model."""
    _, llm, whole = engines(family)
    first, second = llm.runner.reports
    assert first.sharded_weight_bytes == second.sharded_weight_bytes > 0
    replicated = first.weight_bytes - first.sharded_weight_bytes
    assert 2 * first.sharded_weight_bytes + replicated == whole
    assert first.sharded_weight_bytes > 0.8 * whole / 2  # most of the model is sharded, not replicated


def test_dsa_indexer_is_replicated_while_mla_heads_split(engines):
    """DeepSeek-V3.2 at two ranks: each rank runs 2 of the 4 MLA heads, and the whole lightning indexer (its 4 heads,
    key and weights projections) on the replicated query latent, so every rank picks the same keys."""
    _, llm, _ = engines("deepseek_v32")
    attention = llm.model.model.layers[1].self_attn
    assert attention.indexer.wq_b.weight.shape == (4 * 16, 24)  # [index heads x index_head_dim, q_lora_rank]
    assert attention.indexer.weights_proj.weight.shape == (4, 64)
    assert attention.q_b_proj.out_features == 2 * (8 + 4)  # 2 heads x (qk_nope + qk_rope)
    assert [r.geometry[0] for r in llm.runner.reports] == [2, 2]


def test_each_rank_quantizes_its_own_shard(folders):
    """int4 at two ranks: each rank quantizes its shard once loaded, in groups of 32 that the split keeps whole, and
    greedy decoding gives the tokens of int4 on one rank."""
    expected = [
        o.token_ids for o in LLM(folders["llama"], progress=False, quantization="int4").generate(PROMPTS, GREEDY)
    ]
    llm = LLM(folders["llama"], progress=False, tensor_parallel_size=2, quantization="int4")
    try:
        assert set(llm.quant_report.chosen) >= {"model.layers.0.self_attn.o_proj", "lm_head"}
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    finally:
        llm.runner.shutdown()


FP8_PROJECTION = re.compile(r".*proj(_with_mqa)?\.weight")  # what DeepSeek-V3 / Qwen3-FP8 exports quantize


def _fp8_checkpoint(src: Path, dst: Path, block: tuple[int, int]) -> Path:
    """`src` with every projection (attention, MLP, experts; not the embedding or LM head) as FP8-e4m3 in blocks."""
    import torch

    from kernelbay_engine.models.quant import quantize_fp8_blocks

    from .models._files import tensors, write_variant

    state: dict[str, torch.Tensor] = {}
    for name, tensor in tensors(src).items():
        if FP8_PROJECTION.fullmatch(name):
            state[name], state[name.removesuffix("weight") + "weight_scale_inv"] = quantize_fp8_blocks(tensor, block)
        else:
            state[name] = tensor
    quant = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    return write_variant(src, dst, state, quantization_config=quant)


@pytest.mark.parametrize(("family", "block"), [("llama", 16), ("deepseek_v2", 8)])
def test_fp8_checkpoints_at_two_ranks_equal_one_rank(tmp_path, folders, family, block):
    """[family] FP8 block-scaled (Llama: fused q/k/v and gate/up; DeepSeek-V2: MLA's per-head projections, the
    latent's replicated, experts split 2 + 2, a shared expert): each rank reads its share of every weight and of its
    block scales, and greedy decoding gives the single-process tokens."""
    from kernelbay_engine.models.quant import FP8_DTYPE, Fp8BlockLinearMethod

    fp8 = _fp8_checkpoint(folders[family], tmp_path / "fp8", (block, block))
    expected = [o.token_ids for o in LLM(fp8, progress=False).generate(PROMPTS, GREEDY)]
    llm = LLM(fp8, progress=False, tensor_parallel_size=2)
    try:
        layer = llm.model.model.layers[1]
        o_proj = layer.self_attn.o_proj  # row-parallel: half of the inputs, and of the scales' columns
        assert isinstance(o_proj.method, Fp8BlockLinearMethod) and o_proj.weight.dtype == FP8_DTYPE
        assert o_proj.in_features * 2 == _whole_in_features(fp8)
        assert o_proj.weight_scale_inv.shape[1] == o_proj.in_features // block
        if family == "deepseek_v2":  # the rank's two of the four experts, FP8 as stored
            assert isinstance(layer.mlp.experts.gate_up_proj.method, Fp8BlockLinearMethod)
            assert layer.mlp.expert_parallel.count == 2
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
        first, second = llm.runner.reports
        assert first.sharded_weight_bytes == second.sharded_weight_bytes > 0
    finally:
        llm.runner.shutdown()


GPT_OSS_EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


def _mxfp4_checkpoint(src: Path, dst: Path) -> Path:
    """`src` (GPT-OSS) with its experts MXFP4 as GPT-OSS ships them: `*_blocks` [E, out, in/32, 16] and `*_scales`
    [E, out, in/32], each expert's rows its output features."""
    from plugins.llama.tests._tiny_gpt_oss import quantize_mxfp4

    from .models._files import tensors, write_variant

    state = tensors(src)
    for name in [n for n in state if n.endswith(GPT_OSS_EXPERTS)]:
        state[f"{name}_blocks"], state[f"{name}_scales"] = quantize_mxfp4(state.pop(name).transpose(1, 2))
    not_converted = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "lm_head"]
    quant = {"quant_method": "mxfp4", "modules_to_not_convert": not_converted}
    return write_variant(src, dst, state, quantization_config=quant)


def test_mxfp4_gpt_oss_at_two_ranks_equals_one_rank(tmp_path, folders):
    """GPT-OSS with MXFP4 experts: each rank reads the packed blocks and scales of its two experts (whole experts, so
    no block is cut) with their biases, and greedy decoding gives the single-process tokens."""
    mxfp4 = _mxfp4_checkpoint(folders["gpt_oss"], tmp_path / "mxfp4")
    expected = [o.token_ids for o in LLM(mxfp4, progress=False).generate(PROMPTS, GREEDY)]
    llm = LLM(mxfp4, progress=False, tensor_parallel_size=2)
    try:
        layer = llm.model.model.layers[1].mlp
        assert layer.experts.stored_format() == ("mxfp4", None) and layer.expert_parallel.count == 2
        assert layer.experts.gate_up_proj_bias.shape == (2, 64)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    finally:
        llm.runner.shutdown()


@pytest.mark.parametrize("form", ["float", "mxfp4"])
def test_each_gpt_oss_rank_reads_half_of_the_expert_bytes(tmp_path, folders, form):
    """[form] GPT-OSS experts at two ranks: rank r reads experts [2r, 2r + 2) of every expert tensor (weights or
    packed blocks and scales, and biases): half of the expert bytes; the router and the sinks' heads as planned."""
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.distributed.sharding import rank_on_meta
    from kernelbay_engine.loading.plan import SourcePiece

    folder = folders["gpt_oss"] if form == "float" else _mxfp4_checkpoint(folders["gpt_oss"], tmp_path / "mxfp4")
    config = ModelConfig.from_pretrained(folder)
    whole, _, _ = rank_on_meta(config, 1)
    whole_experts = _expert_bytes(whole)
    for rank in (0, 1):
        _, model, shards = rank_on_meta(config, 2, rank=rank)
        assert 2 * _expert_bytes(model) == whole_experts > 0
        experts = {n: s for n, s in shards.sources.items() if ".mlp.experts." in n}
        assert len(experts) == 2 * (6 if form == "mxfp4" else 4)  # per layer: weights (or blocks, scales) + biases
        assert set(experts.values()) == {(SourcePiece(0, 2 * rank, 2),)}
        assert "model.layers.0.mlp.gate.weight" not in shards.sharded  # the router is replicated
        assert shards.sources["model.layers.0.self_attn.sinks"] == (SourcePiece(0, 2 * rank, 2),)


def test_an_experts_module_that_cannot_split_is_refused_naming_it(monkeypatch, folders):
    """A family's own experts module without `for_experts` is refused on meta, before any rank starts, naming it and
    what to add (GPT-OSS's, with the method taken away)."""
    from kernelbay.errors import ConfigError
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.distributed.sharding import plan_rank_share
    from kernelbay_llama.gpt_oss import GptOssExperts

    monkeypatch.delattr(GptOssExperts, "for_experts")
    with pytest.raises(ConfigError, match=r"experts module GptOssExperts cannot be split .* for_experts\(geometry\)"):
        plan_rank_share(ModelConfig.from_pretrained(folders["gpt_oss"]), 2)


def _expert_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".mlp.experts." in n)


def _whole_in_features(folder: Path) -> int:
    """Layer 1's o_proj input width in the checkpoint."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return f.get_slice("model.layers.1.self_attn.o_proj.weight").get_shape()[1]


def test_an_fp8_share_that_cuts_scale_blocks_is_refused_before_any_rank_starts(tmp_path, folders):
    """32x32 scale blocks over a rank's 16 K (and V) rows: refused with the reason before any rank starts, and
    `explain --tensor-parallel-size 2` says the same; a quantization method with no rule to split it is refused."""
    from kernelbay.errors import ConfigError
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.distributed.sizes import size_problems
    from kernelbay_engine.explain.document import explain_model

    fp8 = _fp8_checkpoint(folders["llama"], tmp_path / "fp8", (32, 32))
    cut = r"qkv_proj holds FP8 weights with 32x32 scale blocks, and a rank's share would cut them: .*32 \+ 16 \+ 16"
    with pytest.raises(ConfigError, match=cut):
        LLM(fp8, progress=False, tensor_parallel_size=2)
    refused = explain_model(fp8, tensor_parallel_size=2)["sections"]["tensor_parallel"]["refused"]
    assert re.search(cut, refused[0])
    modelopt = ModelConfig.from_pretrained(CONFIGS / "qwen3-32b-fp8-static-pertensor")
    assert "modelopt checkpoints are not sharded yet: no rule splits their weights" in size_problems(modelopt, 2)


def test_layers_with_different_kv_head_counts_are_refused(tmp_path):
    """Nemotron-NAS groups each layer's heads on its own (8 heads over 4 and 2 KV heads here): refused with the
    reason; no family kernelbay builds has such layers (Nemotron-NAS is a config only)."""
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.distributed.sizes import size_problems

    attention = {"n_heads_in_group": 2, "no_op": False, "replace_with_linear": False, "window_length": None}
    blocks = [{"attention": {**attention, "n_heads_in_group": group}, "ffn": {"ffn_mult": 1.0}} for group in (2, 4)]
    config = dict(model_type="nemotron-nas", architectures=["DeciLMForCausalLM"], hidden_size=64, vocab_size=96)
    config |= dict(num_hidden_layers=2, num_attention_heads=8, block_configs=blocks, max_position_embeddings=128)
    (tmp_path / "config.json").write_text(json.dumps(config))
    nas = ModelConfig.from_pretrained(tmp_path)
    assert nas.layer_num_kv_heads == (4, 2)
    assert "layers with different KV head counts are not sharded yet" in size_problems(nas, 2)


def test_ranks_report_per_rank_geometry(engines):
    """Each rank runs half the heads (GQA: one of the two KV heads) and half the FFN, and caches half the KV bytes."""
    _, llm, _ = engines("llama")
    assert [r.geometry for r in llm.runner.reports] == [(2, 1, 64), (2, 1, 64)]
    single_block = 2 * 2 * 2 * 16 * 16 * 4  # layers x (K, V) x KV heads x head_dim x block x float32
    assert [r.bytes_per_block for r in llm.runner.reports] == [single_block // 2] * 2


class _CountingFile:
    """A file that counts the bytes read from it."""

    def __init__(self, f):
        self.f, self.read = f, 0

    def seek(self, offset):
        return self.f.seek(offset)

    def readinto(self, view):
        got = self.f.readinto(view)
        self.read += got
        return got


@pytest.mark.parametrize(("dim", "start", "length"), [(0, 4, 4), (1, 3, 3), (1, 0, 2)])
def test_a_rank_reads_only_its_slice_of_a_tensor(tmp_path, dim, start, length):
    """A slice along either axis is read from the file's bytes of that slice alone (never the whole tensor)."""
    import torch
    from safetensors.torch import save_file

    from kernelbay_engine.loading.safetensors_file import read_index, read_slice_into

    whole = torch.arange(48, dtype=torch.float32).reshape(8, 6)
    save_file({"w": whole}, str(tmp_path / "model.safetensors"))
    entry = read_index(tmp_path / "model.safetensors")["w"]
    dest = torch.empty(whole.narrow(dim, start, length).shape)
    with open(tmp_path / "model.safetensors", "rb", buffering=0) as raw:
        counting = _CountingFile(raw)
        read_slice_into(counting, entry, dest, dim, start)
    assert torch.equal(dest, whole.narrow(dim, start, length))
    assert counting.read == dest.numel() * 4


def test_sizes_that_do_not_split_are_refused_before_loading(folders):
    """N not dividing the heads, or more ranks than the machine has cores, is refused with the reason."""
    with pytest.raises(EngineArgumentError, match=r"num_attention_heads=4 is not divisible by 3"):
        LLM(folders["llama"], progress=False, tensor_parallel_size=3)
    with pytest.raises(EngineArgumentError, match=r"runs at most \d+ ranks"):
        LLM(folders["llama"], progress=False, tensor_parallel_size=64)
    with pytest.raises(EngineArgumentError, match="tensor_parallel_size must be an integer"):
        LLM(folders["llama"], progress=False, tensor_parallel_size=0)
    with pytest.raises(EngineArgumentError, match=r"groups of 32 inputs, but the attention output's input share .* 48"):
        LLM(folders["qwen3"], progress=False, tensor_parallel_size=2, quantization="int4")


CUSTOM_MODEL = """
import multiprocessing

from kernelbay import register_model
from kernelbay_llama.modeling import LlamaForCausalLM


@register_model("TinyTPForCausalLM")
class TinyTPForCausalLM(LlamaForCausalLM):
    pass


@register_model("FailingTPForCausalLM")
class FailingTPForCausalLM(LlamaForCausalLM):
    def forward(self, input_ids, positions, metadata):
        if multiprocessing.parent_process() is not None and int(positions.max()) >= 7:  # a spawned rank, mid-way
            raise RuntimeError("rank-local failure for the test")
        return super().forward(input_ids, positions, metadata)
"""
RUNTIME_BACKEND = """
from kernelbay import register_attention_backend
from kernelbay_torch.sdpa import SdpaBackend


@register_attention_backend("TP_SDPA")
class TpSdpa(SdpaBackend):
    name = "TP_SDPA"
"""


@pytest.fixture(scope="module")
def custom_registry(tmp_path_factory, folders):
    """`checkpoint(arch)`: the llama weights under a custom-dir architecture; a runtime-registered attention backend;
    both in a registry of their own (the session's is restored afterwards)."""
    from kernelbay.registry import default_registry, load_custom_module_dirs, reset_registry

    tmp_path = tmp_path_factory.mktemp("tp-custom")
    models, runtime = tmp_path / "models", tmp_path / "runtime"
    models.mkdir(), runtime.mkdir()
    (models / "tiny_tp.py").write_text(CUSTOM_MODEL)
    (runtime / "tp_backend.py").write_text(RUNTIME_BACKEND)

    def checkpoint(architecture: str) -> Path:
        folder = tmp_path / architecture
        folder.mkdir()
        for item in folders["llama"].iterdir():
            if item.name != "config.json":
                (folder / item.name).symlink_to(item)
        config = json.loads((folders["llama"] / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "architectures": [architecture]}))
        return folder

    sys.path.insert(0, str(runtime))
    previous = default_registry()
    reset_registry()
    load_custom_module_dirs([str(models / "tiny_tp.py")])
    import tp_backend  # noqa: F401 - registers TP_SDPA at runtime (an external provider)

    yield checkpoint
    reset_registry(previous)
    sys.path.remove(str(runtime))
    for module in ("tp_backend", "tiny_tp"):
        sys.modules.pop(module, None)


def test_custom_dir_model_and_runtime_backend_reach_the_worker_lazily(custom_registry, engines):
    """The worker rebuilds the parent's registry from its exported providers: the custom-dir model and the runtime
    backend resolve there too, nothing exported is imported before it is resolved, and its slots and provenance equal
    the parent's."""
    expected, _, _ = engines("llama")
    folder = custom_registry("TinyTPForCausalLM")
    llm = LLM(folder, progress=False, tensor_parallel_size=2, attention_backend="TP_SDPA")
    try:
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
        driver, worker = llm.runner.reports
        assert worker.attention_backends == (("full_attention", "TP_SDPA"),)
        assert worker.imported_at_start == ()
        assert list(driver.registry) == registry_summary()
        # every slot of the parent's, with the same winner and provenance (a fresh worker process may also hold the
        # built-in slots of a module the custom one imports, which the parent's registry has not resolved yet)
        worker_slots = {(s["kind"], s["name"]): s for s in worker.registry}
        assert {(s["kind"], s["name"]): s for s in driver.registry}.items() <= worker_slots.items()
        external = {key: s["winner"]["provider"]["origin"] for key, s in worker_slots.items() if _external(s)}
        assert external == {
            ("model", "TinyTPForCausalLM"): "custom-dir",
            ("model", "FailingTPForCausalLM"): "custom-dir",
            ("attention_backend", "TP_SDPA"): "external",
        }
    finally:
        llm.runner.shutdown()


ADOPT = """
import json, sys
from kernelbay.registry import default_registry
from kernelbay_engine.distributed.handoff import adopt_registry

adopt_registry(json.loads(sys.stdin.read()))
try:
    print(default_registry().resolve("model", "GPT2LMHeadModel").__module__)
except Exception as err:
    print(type(err).__name__)
"""


@pytest.mark.parametrize(
    ("parent", "worker", "resolved"),
    [(None, "kernelbay-gpt", "kernelbay_gpt.gpt2"), ("kernelbay-gpt", None, "UnknownNameError")],
)
def test_the_parents_plugin_filters_win_in_a_worker(monkeypatch, parent, worker, resolved):
    """KERNELBAY_DISABLE_PLUGINS as the parent read it travels with the hand-off and replaces the worker's own."""
    from kernelbay_engine.distributed.handoff import registry_handoff

    if parent is not None:
        monkeypatch.setenv("KERNELBAY_DISABLE_PLUGINS", parent)
    handoff = registry_handoff()
    env = {k: v for k, v in os.environ.items() if k != "KERNELBAY_DISABLE_PLUGINS"}
    if worker is not None:
        env["KERNELBAY_DISABLE_PLUGINS"] = worker
    done = subprocess.run(
        [sys.executable, "-c", ADOPT], input=json.dumps(handoff), capture_output=True, text=True, env=env, timeout=120
    )
    assert done.stdout.strip() == resolved, done.stderr[-2000:]


def test_killed_worker_fails_the_requests_naming_the_rank_and_leaves_no_process(folders):
    """A rank killed mid-generation: the stream raises naming rank 1 and the signal, and no rank process remains."""
    llm = LLM(folders["llama"], progress=False, tensor_parallel_size=2)
    (pid,) = llm.runner.engine.worker_pids()
    stream = llm.stream([PROMPTS[0]], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    next(stream)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(TensorParallelFailure, match=r"rank 1 failed while .*killed by SIGKILL"):
        list(stream)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie or an orphan
    with pytest.raises(TensorParallelFailure, match="rank 1"):
        llm.generate([PROMPTS[0]], GREEDY)  # the engine stays shut down, saying why


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _external(slot: dict) -> bool:
    return slot["winner"]["provider"]["origin"] not in ("built-in", "fallback")


def test_a_rank_that_raises_fails_the_requests_naming_it_and_its_cause(custom_registry):
    """Rank 1's forward raises mid-generation: the call fails naming rank 1, the step and the exception; no rank
    process remains."""
    llm = LLM(custom_registry("FailingTPForCausalLM"), progress=False, tensor_parallel_size=2)
    (pid,) = llm.runner.engine.worker_pids()
    with pytest.raises(
        TensorParallelFailure, match=r"rank 1 failed while running engine step \d+: RuntimeError: rank-local failure"
    ):
        llm.generate([PROMPTS[0]], GREEDY)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_an_engine_shut_down_says_so(folders):
    """After runner.shutdown() the ranks are gone and a call says the engine was shut down."""
    llm = LLM(folders["llama"], progress=False, tensor_parallel_size=2)
    (pid,) = llm.runner.engine.worker_pids()
    llm.runner.shutdown()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(TensorParallelFailure, match="was shut down"):
        llm.generate([PROMPTS[0]], GREEDY)


def test_explain_shows_one_ranks_share(folders, engines):
    """`explain --tensor-parallel-size 2` works out, on meta, the per-rank geometry, weight bytes and KV bytes per
    token that the running ranks report."""
    from kernelbay_engine.explain.document import explain_model

    _, llm, whole = engines("llama")
    section = explain_model(folders["llama"], tensor_parallel_size=2)["sections"]["tensor_parallel"]
    report = llm.runner.reports[1]
    assert section["whole_weight_bytes"] == whole
    assert section["per_rank"] == {
        "attention_heads": 2,
        "kv_heads": 1,
        "intermediate_size": 64,
        "experts": 0,
        "weight_bytes": report.weight_bytes,
        "sharded_weight_bytes": report.sharded_weight_bytes,
        "kv_bytes_per_token": report.bytes_per_block // 16,
    }
    refused = explain_model(folders["llama"], tensor_parallel_size=3)["sections"]["tensor_parallel"]
    assert "num_attention_heads=4 is not divisible by 3" in refused["refused"][0]


def test_a_tensor_that_cannot_split_is_refused_before_any_rank_starts():
    """Falcon-7B's multi-query fused query_key_value (4 query heads + one K and one V head) has no even split in two:
    the dry run on meta names it."""
    from kernelbay.errors import ConfigError
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.distributed.sharding import plan_rank_share

    falcon = transformers.FalconConfig(
        vocab_size=96,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        multi_query=True,
        new_decoder_architecture=False,
        parallel_attn=True,
        bias=False,
    )
    with pytest.raises(ConfigError, match=r"query_key_value\.weight cannot be split"):
        plan_rank_share(ModelConfig.from_hf_config(falcon), 2)


def test_run_refuses_a_size_that_does_not_split_before_loading(folders):
    """`kernelbay run --tensor-parallel-size 3` on a 4-head model exits 1 naming the reason."""
    kernelbay = Path(sys.executable).parent / "kernelbay"
    done = subprocess.run(
        [str(kernelbay), "run", str(folders["llama"]), "--prompt", "hi", "--tensor-parallel-size", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "tensor_parallel_size=3 cannot run LlamaForCausalLM" in done.stderr
    assert "num_attention_heads=4 is not divisible by 3" in done.stderr


TORCHRUN_SCRIPT = """
import json, sys
from kernelbay_engine import LLM, SamplingParams

llm = LLM(sys.argv[1], progress=False, tensor_parallel_size=2)
out = llm.generate(json.loads(sys.argv[2]), SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
print("TOKENS", json.dumps([o.token_ids for o in out]))
llm.runner.shutdown()
"""


def test_the_same_engine_under_torchrun(tmp_path, folders, engines):
    """`torchrun --nproc-per-node 2`: rank 0 drives, rank 1 serves its steps and exits; the tokens are TP=1's."""
    expected, _, _ = engines("llama")
    script = tmp_path / "tp_script.py"
    script.write_text(TORCHRUN_SCRIPT)
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run(
        [
            str(torchrun),
            "--nproc-per-node",
            "2",
            "--master-port",
            str(_free_port()),
            str(script),
            str(folders["llama"]),
            json.dumps(PROMPTS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("TOKENS ")]
    assert [json.loads(line.removeprefix("TOKENS ")) for line in lines] == [expected]
