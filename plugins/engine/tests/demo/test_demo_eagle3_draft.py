"""The EAGLE-3 draft shipped beside the demo checkpoint: a well-formed draft folder for exactly that target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import kernelbay_engine

DEMO_DIR = Path(kernelbay_engine.__file__).parent / "demo"
DRAFT_DIR = DEMO_DIR / "eagle3"
REBUILD = "python examples/train_eagle3_demo.py --out plugins/engine/kernelbay_engine/demo/eagle3"
MAX_FOLDER_BYTES = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((DRAFT_DIR / "config.json").read_text())


@pytest.fixture(scope="module")
def target_config() -> dict:
    return json.loads((DEMO_DIR / "config.json").read_text())


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return load_file(DRAFT_DIR / "model.safetensors")


def expected_shapes(config: dict, aux_layers: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of the EAGLE-3 format (no embed_tokens: the target's is used) and its shape."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    layer = "midlayer."
    return {
        "fc.weight": (hidden, aux_layers * config["target_hidden_size"]),
        f"{layer}input_layernorm.weight": (hidden,),
        f"{layer}hidden_norm.weight": (hidden,),
        f"{layer}self_attn.q_proj.weight": (q, 2 * hidden),
        f"{layer}self_attn.k_proj.weight": (kv, 2 * hidden),
        f"{layer}self_attn.v_proj.weight": (kv, 2 * hidden),
        f"{layer}self_attn.o_proj.weight": (hidden, q),
        f"{layer}post_attention_layernorm.weight": (hidden,),
        f"{layer}mlp.gate_proj.weight": (inter, hidden),
        f"{layer}mlp.up_proj.weight": (inter, hidden),
        f"{layer}mlp.down_proj.weight": (hidden, inter),
        "norm.weight": (hidden,),
        "lm_head.weight": (config["draft_vocab_size"], hidden),
        "d2t": (config["draft_vocab_size"],),
        "t2d": (config["vocab_size"],),
    }


def test_folder_ships_config_weights_readme_and_licence_and_stays_small():
    """The draft folder is inside the package, complete, and under 4 MiB."""
    names = {p.name for p in DRAFT_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "README.md", "LICENSE.fortunes"} <= names, names
    total = sum(p.stat().st_size for p in DRAFT_DIR.iterdir())
    assert total <= MAX_FOLDER_BYTES, f"draft folder is {total / 2**20:.1f} MiB, over 4 MiB"


def test_config_is_an_eagle3_llama_draft_for_the_demo(config, target_config):
    """One Llama layer as wide as the demo, over the demo's vocabulary, reading three explicit target layers."""
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["hidden_act"] == "silu"
    assert config["tie_word_embeddings"] is False
    assert config["vocab_size"] == target_config["vocab_size"]
    assert config["target_hidden_size"] == config["hidden_size"] == target_config["hidden_size"]
    assert 0 < config["draft_vocab_size"] < config["vocab_size"], "a smaller draft vocabulary exercises d2t/t2d"
    layers = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert len(set(layers)) == 3 and all(0 <= layer < target_config["num_hidden_layers"] for layer in layers)
    assert config["rope_theta"] == target_config["rope_parameters"]["rope_theta"]


def test_weights_are_exactly_the_format_tensors_with_their_shapes(config, weights):
    """model.safetensors holds every EAGLE-3 tensor under SpecForge's names, with the config's shapes."""
    stored = {name: tuple(t.shape) for name, t in weights.items()}
    assert stored == expected_shapes(config, aux_layers=3)
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    floats = [t for name, t in weights.items() if name not in ("d2t", "t2d")]
    assert all(t.dtype in (torch.bfloat16, torch.float32) and torch.isfinite(t.float()).all() for t in floats)


def test_vocabulary_maps_agree(config, weights):
    """d2t sends each draft id to a distinct in-range target id, and t2d marks exactly those target ids."""
    draft_ids = torch.arange(config["draft_vocab_size"])
    target_ids = draft_ids + weights["d2t"]
    assert int(target_ids.min()) >= 0 and int(target_ids.max()) < config["vocab_size"]
    assert bool((target_ids[1:] > target_ids[:-1]).all()), "target ids must be distinct (sorted, as SpecForge)"
    t2d = weights["t2d"]
    assert int(t2d.sum()) == config["draft_vocab_size"]
    assert bool(t2d[target_ids].all())
    assert bool(t2d[config["eos_token_id"]]), "the draft vocabulary should hold <|eos|>"


def test_readme_names_corpus_licence_acceptance_and_rebuild_command():
    """README.md says how the draft was made, under which licence, what acceptance it reaches, how to rebuild."""
    readme = (DRAFT_DIR / "README.md").read_text(encoding="utf-8")
    for needle in ("LlamaForCausalLMEagle3", "fortunes", "BSD", "LICENSE.fortunes", "acceptance", REBUILD):
        assert needle in readme, f"README.md no longer mentions {needle!r}"
    assert "Regents of the University of California" in (DRAFT_DIR / "LICENSE.fortunes").read_text()


@pytest.fixture(scope="module")
def demo_llms():
    """The demo model with plain decoding and with the shipped draft proposing 4 tokens a step."""
    from kernelbay_engine import LLM

    plain = LLM(progress=False, dtype="float32", max_num_seqs=4)
    speculative = LLM(
        progress=False, dtype="float32", max_num_seqs=4, speculative=str(DRAFT_DIR), num_speculative_tokens=4
    )
    return plain, speculative


def test_shipped_draft_keeps_greedy_tokens_and_gets_most_guesses_accepted(demo_llms):
    """Greedy decoding with the shipped draft equals plain decoding, and over half its guesses are accepted.

    Measured on these prompts: 0.68 (0.58 and 0.80 per pair); examples/train_eagle3_demo.py --evaluate gives 0.65
    on held-out fortunes; a random draft gets almost none.
    """
    from kernelbay_engine import SamplingParams

    plain, speculative = demo_llms
    prompts = ["A computer is", "Love is", "You will", "A banker is a fellow who"]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    before = speculative.stats()
    expected = [out.token_ids for out in plain.generate(prompts, params)]
    assert [out.token_ids for out in speculative.generate(prompts, params)] == expected
    after = speculative.stats()
    proposed = after.spec_draft_tokens - before.spec_draft_tokens
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    assert proposed > 0 and accepted / proposed > 0.5, f"acceptance {accepted}/{proposed}"
