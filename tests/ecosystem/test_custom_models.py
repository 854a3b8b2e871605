"""The example custom module dirs: a new architecture (OLMo, checked against transformers) and an override of
the built-in LlamaForCausalLM, with provenance "custom-dir". `kernelbay explain` and `kernelbay run` with
--custom-module-dirs are exercised by docs/guides/model-family-plugin.md (test_guides.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from kernelbay import RegistrationConflict, load_custom_module_dirs, resolve
from kernelbay.registry import slot_info
from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.runner import ModelRunner

from ..models._parity import compare_generation
from .conftest import REPO

OLMO_DIR = REPO / "examples/custom_models/olmo"
OVERRIDE_DIR = REPO / "examples/custom_models/llama_override"
DEMO = REPO / "plugins/engine/kernelbay_engine/demo"


@pytest.fixture(scope="module")
def olmo_checkpoint(tmp_path_factory):
    """A tiny random OLMo saved by transformers (safetensors), with q/k/v clipping switched on."""
    config = transformers.OlmoConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        clip_qkv=0.5,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.OlmoForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("olmo")
    model.save_pretrained(folder)
    return model, folder


def test_new_architecture_matches_transformers(make_registry, olmo_checkpoint):
    """OlmoForCausalLM from the custom dir generates transformers' logits, prefill and decode."""
    hf_model, folder = olmo_checkpoint
    make_registry(with_acme=False)
    load_custom_module_dirs([OLMO_DIR])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32", progress=False)
    assert type(model).__module__ == "olmo.modeling"
    runner = ModelRunner(model, num_blocks=64, block_size=4, attention_backend="VANILLA")
    compare_generation(hf_model, runner, "olmo", steps=3)


def test_new_architecture_provenance_is_custom_dir(make_registry):
    """The added architecture's slot says where it came from: the custom dir's path, origin custom-dir."""
    make_registry(with_acme=False)
    load_custom_module_dirs([OLMO_DIR])
    winner = slot_info("model", "OlmoForCausalLM")["winner"]
    assert winner["target"] == "olmo.modeling:OlmoForCausalLM"
    assert (winner["provider"]["origin"], winner["provider"]["path"]) == ("custom-dir", str(OLMO_DIR))


def _demo_with(tmp_path, **changes):
    folder = tmp_path / "demo"
    shutil.copytree(DEMO, folder)
    config = json.loads((folder / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_override_takes_the_builtin_slot(make_registry, tmp_path):
    """The override wins LlamaForCausalLM over kernelbay-llama; its logits are the built-in's except the
    banned tokens, which are -inf."""
    make_registry(with_acme=False)
    load_custom_module_dirs([OVERRIDE_DIR])
    slot = slot_info("model", "LlamaForCausalLM")
    assert slot["winner"]["provider"]["origin"] == "custom-dir"
    assert [d["provider"]["distribution"] for d in slot["displaced"]] == ["kernelbay-llama"]
    model = AutoModelForCausalLM.from_pretrained(
        _demo_with(tmp_path, banned_token_ids=[5, 7]), dtype="float32", progress=False
    )
    hidden = torch.randn(3, model.config.hidden_size)
    builtin = type(model).__mro__[1]
    assert f"{builtin.__module__}:{builtin.__qualname__}" == "kernelbay_llama.modeling:LlamaForCausalLM"
    with torch.no_grad():
        got, want = model.compute_logits(hidden), builtin.compute_logits(model, hidden)
    assert torch.isneginf(got[:, [5, 7]]).all()
    keep = [i for i in range(model.config.vocab_size) if i not in (5, 7)]
    torch.testing.assert_close(got[:, keep], want[:, keep])


def test_override_and_acme_conflict_until_preferred(make_registry):
    """Two external providers of LlamaForCausalLM (acme and the custom dir) are a conflict naming both and how
    to choose; KERNELBAY_PREFER picks one."""
    make_registry()
    load_custom_module_dirs([OVERRIDE_DIR])
    with pytest.raises(RegistrationConflict, match=r"kernelbay_acme_llama\.modeling.*llama_override.*KERNELBAY_PREFER"):
        resolve("model", "LlamaForCausalLM")
    make_registry(KERNELBAY_PREFER="LlamaForCausalLM=kernelbay-acme-llama")
    load_custom_module_dirs([OVERRIDE_DIR])
    assert resolve("model", "LlamaForCausalLM").__module__ == "kernelbay_acme_llama.modeling"


def test_override_refusing_its_config_names_the_provider_and_its_custom_dir(make_registry, tmp_path):
    """banned_token_ids outside the vocabulary: the override's ValueError comes as a ModelConstructionError naming
    the class, the custom dir's path and origin, and the override's own message."""
    from kernelbay_engine.errors import ModelConstructionError

    make_registry(with_acme=False)
    load_custom_module_dirs([OVERRIDE_DIR])
    with pytest.raises(ModelConstructionError) as err:
        AutoModelForCausalLM.from_pretrained(_demo_with(tmp_path, banned_token_ids=[99999]), progress=False)
    message = str(err.value)
    assert message.startswith("LlamaForCausalLM could not be built: llama_override.modeling.LlamaForCausalLM from ")
    assert f"({OVERRIDE_DIR}, custom-dir)" in message
    assert "ValueError: banned_token_ids [99999] are outside the vocabulary" in message


def test_a_custom_model_whose_constructor_raises_is_one_error_line(sites, tmp_path):
    """`kernelbay run --custom-module-dirs` with a class whose constructor raises: exit 1, one line naming the
    provider and its path, no traceback."""
    from .conftest import run_kernelbay

    custom = tmp_path / "my_broken_llama.py"
    custom.write_text(
        "from kernelbay import register_model\n"
        "from kernelbay_llama.modeling import LlamaForCausalLM as Builtin\n\n\n"
        '@register_model("LlamaForCausalLM")\n'
        "class LlamaForCausalLM(Builtin):\n"
        "    def __init__(self, config):\n"
        '        raise KeyError("rope_scaling")\n'
    )
    done = run_kernelbay(
        sites, "run", "--prompt", "hi", "--max-tokens", "2", "--custom-module-dirs", str(custom), with_acme=False
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("kernelbay run: error: LlamaForCausalLM could not be built: "), line
    assert f"from my_broken_llama ({custom}, custom-dir) raised KeyError: 'rope_scaling'" in line


def test_plugins_shows_the_conflict_run_and_explain_meet(sites):
    """A custom dir and kernelbay-acme-llama both claim LlamaForCausalLM: `plugins` shows the CONFLICT (naming
    both) that `explain` and `run` raise, not the custom dir holding the slot."""
    from .conftest import run_kernelbay

    listed = run_kernelbay(sites, "plugins", "--json", "--custom-module-dirs", str(OVERRIDE_DIR))
    assert listed.returncode == 0, listed.stderr
    slot = next(s for s in json.loads(listed.stdout)["slots"] if s["name"] == "LlamaForCausalLM")
    assert slot["winner"] is None, slot
    assert sorted(c["provider"]["origin"] for c in slot["conflict"]) == ["custom-dir", "external"]
    assert {c["provider"]["distribution"] for c in slot["conflict"]} == {None, "kernelbay-acme-llama"}
    text = run_kernelbay(sites, "plugins", "--custom-module-dirs", str(OVERRIDE_DIR)).stdout
    assert any(line.split()[:3] == ["model", "LlamaForCausalLM", "CONFLICT:"] for line in text.splitlines()), text
    explained = run_kernelbay(sites, "explain", str(DEMO), "--custom-module-dirs", str(OVERRIDE_DIR))
    assert explained.returncode == 1 and "is claimed by two providers" in explained.stderr, explained.stderr


def test_masked_logits_are_not_mistaken_for_a_failing_kernel(make_registry, tmp_path):
    """The override's banned tokens are -inf logits, a mask: generation runs (the per-step NaN/+inf check lets -inf
    through) and never samples them."""
    from kernelbay_engine import LLM, SamplingParams

    make_registry(with_acme=False)
    load_custom_module_dirs([OVERRIDE_DIR])
    llm = LLM(_demo_with(tmp_path, banned_token_ids=[5, 7]), progress=False, max_num_seqs=1)
    out = llm.generate([[1, 5, 7, 9]], SamplingParams(max_tokens=6, temperature=0))[0]
    assert len(out.token_ids) == 6 and not {5, 7} & set(out.token_ids)
