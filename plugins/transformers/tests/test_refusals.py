"""What the fallback cannot serve is refused before any weight is read, with the reason (API and explain)."""

from __future__ import annotations

import json

import pytest
import transformers

from kernelbay.errors import UnsupportedArchitecture
from kernelbay_engine.explain import explain_model
from tests.models._tiny import COMMON

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
REFUSED = {
    "T5ForConditionalGeneration": (
        lambda: transformers.T5Config(d_model=64, num_layers=2, num_heads=4, d_ff=96, vocab_size=96),
        "encoder-decoder",
    ),
    "BartForCausalLM": (lambda: transformers.BartConfig(d_model=64, vocab_size=96), "encoder-decoder"),
    "MambaForCausalLM": (
        lambda: transformers.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=96),
        "recurrent or state-space",
    ),
    "StableLmForCausalLM": (
        lambda: transformers.StableLmConfig(**SMALL, num_key_value_heads=4),
        "does not route its attention through transformers' AttentionInterface",
    ),
    "Gemma3ForConditionalGeneration": (lambda: transformers.Gemma3Config(), "multimodal"),
    "NotARealForCausalLM": (lambda: transformers.LlamaConfig(**COMMON), "does not implement NotARealForCausalLM"),
}


def _folder(tmp_path, arch: str, config, **extra) -> str:
    config.architectures = [arch]
    config.save_pretrained(tmp_path)
    if extra:
        data = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**data, **extra}))
    return str(tmp_path)


@pytest.mark.parametrize("arch", sorted(REFUSED))
def test_refused_architecture_gives_its_reason(tmp_path, arch):
    """explain (config.json only) raises the unsupported-architecture error naming why the fallback refuses."""
    build, reason = REFUSED[arch]
    with pytest.raises(UnsupportedArchitecture, match=reason) as err:
        explain_model(_folder(tmp_path, arch, build()))
    assert arch in str(err.value) and err.value.exit_code == 6


@pytest.mark.parametrize(
    "arch, config",
    [
        ("MptForCausalLM", lambda: transformers.MptConfig(d_model=64, n_heads=4, n_layers=2, vocab_size=96)),
        ("BloomForCausalLM", lambda: transformers.BloomConfig(hidden_size=64, n_head=4, n_layer=2, vocab_size=96)),
    ],
)
def test_a_refusal_says_its_reason_in_its_first_sentence(tmp_path, arch, config):
    """MPT and Bloom (transformers classes the fallback cannot plug into): the error's first sentence is the
    refusal and its reason; no complaint about config fields kernelbay does not read for them, no "?." ."""
    with pytest.raises(UnsupportedArchitecture) as err:
        explain_model(_folder(tmp_path, arch, config()))
    text = str(err.value)
    first = text.split(" (Unknown architecture")[0]
    assert first.startswith(f"architecture {arch!r} cannot be served: no installed plugin provides it, and the ")
    assert first.endswith("so kernelbay's paged attention cannot be plugged in.")
    assert "required field" not in text and "missing" not in text and "?." not in text


def test_remote_code_runs_only_when_trusted(tmp_path):
    """An architecture only the folder's own code implements (auto_map) is refused without --trust-remote-code."""
    folder = _folder(
        tmp_path,
        "MyOwnForCausalLM",
        transformers.LlamaConfig(**COMMON),
        auto_map={"AutoModelForCausalLM": "modeling_mine.MyOwnForCausalLM"},
    )
    with pytest.raises(UnsupportedArchitecture, match="only with --trust-remote-code"):
        explain_model(folder)


def test_quantized_checkpoint_is_refused(tmp_path):
    """The fallback builds transformers' float layers: a quantized checkpoint is refused, not dequantized silently."""
    quant = {"quant_method": "fp8", "weight_block_size": [16, 16], "activation_scheme": "dynamic", "fmt": "e4m3"}
    folder = _folder(tmp_path, "Olmo2ForCausalLM", transformers.Olmo2Config(**COMMON), quantization_config=quant)
    with pytest.raises(UnsupportedArchitecture, match=r"quantized checkpoints \(fp8\)"):
        explain_model(folder)
