"""Checkpoint loading: sharded files, dtype cast, tied embeddings, progress bar, and every load error."""

from __future__ import annotations

import pytest
import torch

from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.loading import CheckpointError

from ._files import tensors, write_pickle, write_sharded, write_variant


@pytest.fixture(scope="module")
def llama(tiny_checkpoints):
    return tiny_checkpoints.get("llama3")[0]


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sharded_checkpoint_loads_the_same_weights(llama, tmp_path):
    """model.safetensors.index.json with three shards gives the same parameters as one file."""
    single = AutoModelForCausalLM.from_pretrained(llama, progress=False)
    sharded = AutoModelForCausalLM.from_pretrained(write_sharded(llama, tmp_path / "sharded"), progress=False)
    a, b = _state(single), _state(sharded)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_index_naming_an_absent_shard_is_an_error(llama, tmp_path):
    """A shard listed in the index but not on disk is named."""
    folder = write_sharded(llama, tmp_path / "sharded")
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00003.safetensors"):
        AutoModelForCausalLM.from_pretrained(folder, progress=False)


def test_loaded_values_are_the_checkpoint_values(llama):
    """Fused q/k/v and gate/up rows hold exactly the checkpoint's separate tensors."""
    model = AutoModelForCausalLM.from_pretrained(llama, progress=False)
    state = tensors(llama)
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    _q, k, v = attn.qkv_proj.split(attn.qkv_proj.weight.T)
    assert torch.equal(k.T, state["model.layers.1.self_attn.k_proj.weight"])
    assert torch.equal(v.T, state["model.layers.1.self_attn.v_proj.weight"])
    _gate, up = mlp.gate_up_proj.split(mlp.gate_up_proj.weight.T)
    assert torch.equal(up.T, state["model.layers.1.mlp.up_proj.weight"])
    assert torch.equal(model.lm_head.weight, state["lm_head.weight"])


def test_dtype_cast_on_load(llama):
    """dtype='bfloat16' loads a float32 checkpoint as bfloat16 (norms and embeddings included)."""
    model = AutoModelForCausalLM.from_pretrained(llama, dtype="bfloat16", progress=False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    expected = tensors(llama)["model.norm.weight"].to(torch.bfloat16)
    assert torch.equal(model.model.norm.weight, expected)


def test_bfloat16_checkpoint_into_float32_model(llama, tmp_path):
    """A bf16 checkpoint loads into a float32 model by casting each tensor as it is read."""
    state = {k: v.to(torch.bfloat16) for k, v in tensors(llama).items()}
    folder = write_variant(llama, tmp_path / "bf16", state, dtype="bfloat16")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32", progress=False)
    assert torch.equal(model.model.embed_tokens.weight, state["model.embed_tokens.weight"].float())


def test_tied_embeddings_share_one_tensor(tiny_checkpoints):
    """tie_word_embeddings: the LM head is the embedding table (one tensor, not a copy)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoints.get("qwen2")[0], progress=False)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_progress_bar_goes_to_stderr(llama, capsys):
    """progress=True shows a 'Loading weights' bar on stderr."""
    AutoModelForCausalLM.from_pretrained(llama, progress=True)
    assert "Loading weights" in capsys.readouterr().err


def test_missing_tensors_are_named(llama, tmp_path):
    """A checkpoint without some tensors fails before loading, naming each missing one."""
    state = tensors(llama)
    del state["model.layers.2.self_attn.v_proj.weight"], state["model.norm.weight"]
    folder = write_variant(llama, tmp_path / "missing", state)
    with pytest.raises(CheckpointError) as err:
        AutoModelForCausalLM.from_pretrained(folder, progress=False)
    assert "missing tensors (2)" in str(err.value)
    assert "model.layers.2.self_attn.v_proj.weight" in str(err.value)
    assert "model.norm.weight" in str(err.value)


def test_unexpected_tensors_are_named(llama, tmp_path):
    """Tensors the model has no place for are listed by name."""
    state = tensors(llama)
    state["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    folder = write_variant(llama, tmp_path / "unexpected", state)
    with pytest.raises(CheckpointError, match=r"unexpected tensors \(1\): model\.layers\.0\.mlp\.extra_proj\.weight"):
        AutoModelForCausalLM.from_pretrained(folder, progress=False)


def test_shape_mismatch_names_the_tensor(llama, tmp_path):
    """A tensor of the wrong shape is a CheckpointError (exit 9) naming it and both shapes."""
    state = tensors(llama)
    state["model.norm.weight"] = torch.ones(3)
    folder = write_variant(llama, tmp_path / "shape", state)
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight: checkpoint shape \[3\] != model shape \[64\]"):
        AutoModelForCausalLM.from_pretrained(folder, progress=False)


def test_pickle_weights_refused_unless_opted_in(llama, tmp_path):
    """pytorch_model.bin is refused (pickle runs code); allow_pickle=True loads the same values."""
    folder = write_pickle(llama, tmp_path / "pickle")
    how = r"AutoModelForCausalLM\.from_pretrained\(path, allow_pickle=True\)"  # how to opt in, not only that one can
    with pytest.raises(CheckpointError, match=r"refuses it.*" + how):
        AutoModelForCausalLM.from_pretrained(folder, progress=False)
    model = AutoModelForCausalLM.from_pretrained(folder, allow_pickle=True, progress=False)
    assert torch.equal(model.model.norm.weight, tensors(llama)["model.norm.weight"])


def test_folder_without_weights(llama, tmp_path):
    """A folder with only config.json says which weight files it expected."""
    from ._files import copy_config

    how = r"pytorch_model\.bin \(pickle: load it in Python: .*from_pretrained\(path, allow_pickle=True\)\)"
    with pytest.raises(CheckpointError, match=r"has no weights: expected model.safetensors.*" + how):
        AutoModelForCausalLM.from_pretrained(copy_config(llama, tmp_path / "empty"), progress=False)


def test_family_name_rules_skip_tensors_with_no_place(llama, tiny_checkpoints, tmp_path):
    """Old Llama checkpoints' rotary_emb.inv_freq and DeepSeek-V3's multi-token-prediction layer are skipped."""
    state = tensors(llama)
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    AutoModelForCausalLM.from_pretrained(write_variant(llama, tmp_path / "inv_freq", state), progress=False)
    v3 = tiny_checkpoints.get("deepseek_v3")[0]
    state = tensors(v3)
    state["model.layers.3.eh_proj.weight"] = torch.zeros(64, 128)  # layer 3 of 3: the MTP module
    folder = write_variant(v3, tmp_path / "mtp", state, num_nextn_predict_layers=1)
    AutoModelForCausalLM.from_pretrained(folder, progress=False)
    state["model.layers.4.eh_proj.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"unexpected tensors \(1\): model\.layers\.4\.eh_proj\.weight"):
        AutoModelForCausalLM.from_pretrained(
            write_variant(v3, tmp_path / "mtp2", state, num_nextn_predict_layers=1), progress=False
        )


def test_deepseek_experts_load_from_stacked_tensors(tiny_checkpoints, tmp_path):
    """transformers' stacked expert format (experts.gate_up_proj [E, 2I, H]) loads like per-expert tensors."""
    folder = tiny_checkpoints.get("deepseek_v3")[0]
    state, experts = tensors(folder), 8
    for layer in (1, 2):
        prefix = f"model.layers.{layer}.mlp.experts"
        per = {
            p: [state.pop(f"{prefix}.{e}.{p}.weight") for e in range(experts)]
            for p in ("gate_proj", "up_proj", "down_proj")
        }
        state[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([g, u]) for g, u in zip(per["gate_proj"], per["up_proj"], strict=True)]
        )
        state[f"{prefix}.down_proj"] = torch.stack(per["down_proj"])
    # TORCH_MOE computes with the loaded tensors (a repacking kernel would release them)
    variant = write_variant(folder, tmp_path / "stacked", state)
    stacked = AutoModelForCausalLM.from_pretrained(variant, progress=False, moe_backend="TORCH_MOE")
    reference = AutoModelForCausalLM.from_pretrained(folder, progress=False, moe_backend="TORCH_MOE")
    assert torch.equal(
        stacked.model.layers[2].mlp.experts.gate_up_proj.weight,
        reference.model.layers[2].mlp.experts.gate_up_proj.weight,
    )
    assert torch.equal(
        stacked.model.layers[1].mlp.experts.down_proj.weight, reference.model.layers[1].mlp.experts.down_proj.weight
    )


def test_loading_into_a_model_built_without_meta(llama):
    """When meta init is off (or fell back), weights load in place into the real parameters."""
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.loading import load_weights, open_checkpoint

    model = AutoModelForCausalLM.from_config(ModelConfig.from_pretrained(llama), meta=False)
    assert not model.built_on_meta and not any(p.is_meta for p in model.parameters())
    load_weights(model, open_checkpoint(llama), model.checkpoint_rules(), progress=False)
    reference = AutoModelForCausalLM.from_pretrained(llama, progress=False)
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values(), strict=True)
    )


def _backing_file(address: int) -> str:
    """The file mapped at `address` in this process ('' for anonymous memory), from /proc/self/maps."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= address < high:
                return fields[5] if len(fields) > 5 else ""
    raise AssertionError(f"address {address:#x} is not mapped")


def test_mmap_mode_maps_whole_tensors_and_reads_fused_ones(llama, tiny_checkpoints):
    """mmap=True: 1:1 tensors are file-backed views, fused q/k/v are read; logits equal the copying load."""
    from kernelbay_engine.runner import ModelRunner, StepRequest

    copied = AutoModelForCausalLM.from_pretrained(llama, progress=False)
    mapped = AutoModelForCausalLM.from_pretrained(llama, progress=False, mmap=True)
    assert all(
        torch.equal(a, b) for a, b in zip(copied.state_dict().values(), mapped.state_dict().values(), strict=True)
    )
    embed, qkv = mapped.model.embed_tokens.weight, mapped.model.layers[0].self_attn.qkv_proj.weight
    assert _backing_file(embed.data_ptr()).endswith("llama3/model.safetensors")
    assert not _backing_file(qkv.data_ptr()).endswith(".safetensors")  # fused: read into anonymous memory
    mapped.model.norm.weight.mul_(1.0)  # copy-on-write: writable, the file is untouched
    step = [StepRequest("a", [1, 2, 3], 0)]
    logits = [ModelRunner(m, num_blocks=4, block_size=4).step(step) for m in (copied, mapped)]
    assert torch.equal(*logits)
