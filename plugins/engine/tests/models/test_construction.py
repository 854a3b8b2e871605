"""Resolution (unknown names, NoTarget fallback) and meta-device construction."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from kernelbay.errors import ConfigError, NoTarget, UnknownNameError
from kernelbay_engine import AutoModelForCausalLM
from kernelbay_engine.config import ModelConfig
from kernelbay_engine.models.meta import MetaInitMode, MetaInitUnsupported, build_module
from tests._paths import REAL_CONFIGS

from ._files import copy_config

SHARED = str(REAL_CONFIGS)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_llama2_7b_geometry_on_meta_allocates_no_weight_memory():
    """Building Llama-2-7B (6.7e9 parameters) on meta leaves every weight on meta and RSS flat."""
    config = ModelConfig.from_pretrained(f"{SHARED}/llama-2-7b-hf")
    before = _rss_bytes()
    model = AutoModelForCausalLM.from_config(config)
    grown = _rss_bytes() - before
    assert model.built_on_meta
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 6_738_415_616
    assert grown < 64 * 2**20, f"RSS grew by {grown / 2**20:.0f} MiB while building on meta"
    assert len(model.attention_layers()) == 32


class _ComputesInInit(nn.Module):
    """A third-party module that does arithmetic in __init__: meaningless on meta."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))


def test_meta_mode_allows_factories_and_random_init():
    """nn.Linear / nn.Embedding (empty + kaiming/normal init + padding fill) build on meta."""
    with MetaInitMode() as mode:
        layers = nn.Sequential(nn.Linear(4096, 4096), nn.Embedding(1000, 64, padding_idx=0))
    assert all(p.is_meta for p in layers.parameters()) and mode.created >= 3


def test_unsupported_op_on_meta_raises_and_build_falls_back(caplog):
    """Arithmetic on a meta tensor raises MetaInitUnsupported; build_module rebuilds for real and logs why."""
    with pytest.raises(MetaInitUnsupported, match="needs tensor values"):
        with MetaInitMode():
            _ComputesInInit()
    with caplog.at_level(logging.INFO, logger="kernelbay.models"):
        module, on_meta = build_module(_ComputesInInit)
    assert not on_meta and not module.inv_freq.is_meta
    assert torch.allclose(module.inv_freq, torch.tensor([1.0, 0.1, 0.01, 0.001]))
    assert "meta-device init not possible" in caplog.text


def _with_architecture(tiny_checkpoints, tmp_path, arch: str):
    folder = tiny_checkpoints.get("llama3")[0]
    return copy_config(folder, tmp_path / arch, architectures=[arch])


def test_unknown_architecture_lists_installed_and_close_matches(tiny_checkpoints, tmp_path):
    """A misspelt architecture names the installed ones and suggests the close match."""
    with pytest.raises(UnknownNameError) as err:
        AutoModelForCausalLM.from_pretrained(_with_architecture(tiny_checkpoints, tmp_path, "LlamaForCausalLm"))
    message = str(err.value)
    assert "'LlamaForCausalLm'" in message and "Qwen3ForCausalLM" in message
    assert "Did you mean: LlamaForCausalLM" in message


@pytest.fixture
def fresh_registry():
    """A registry of its own for the test; the process registry comes back afterwards."""
    from kernelbay import registry

    previous = registry.default_registry()

    def make(environ=None):
        return registry.reset_registry(registry.Registry(environ=environ))

    yield make
    registry.reset_registry(previous)


def test_unknown_architecture_names_the_first_party_plugin(fresh_registry):
    """With kernelbay-deepseek disabled, asking for DeepSeek-V3 says which plugin provides it."""
    fresh_registry({"KERNELBAY_DISABLE_PLUGINS": "kernelbay-deepseek"})
    config = ModelConfig.from_pretrained(f"{SHARED}/deepseek-v3")
    with pytest.raises(UnknownNameError, match="kernelbay-deepseek"):
        AutoModelForCausalLM.from_config(config)


def test_unsupported_quantization_is_refused_before_loading():
    """compressed-tensors per-tensor FP8 is a ConfigError naming the quant method."""
    config = ModelConfig.from_pretrained(f"{SHARED}/qwen3-32b-fp8-static-pertensor")
    with pytest.raises(ConfigError, match="only 'fp8' \\(block-scaled e4m3\\) is supported"):
        AutoModelForCausalLM.from_config(config)


@pytest.fixture
def declining_llama():
    """An external LlamaForCausalLM that always declines; unregistered after the test."""
    from kernelbay import register_model, registry, resolve

    resolve("model", "LlamaForCausalLM")  # the built-in is registered first, as in real use
    from kernelbay_llama.modeling import LlamaForCausalLM

    @register_model("LlamaForCausalLM")
    class PickyLlama(LlamaForCausalLM):
        def __init__(self, config):
            raise NoTarget("needs a device this test machine lacks")

    yield PickyLlama
    registry.unregister_provider(__name__)


def test_no_target_in_auto_mode_falls_back_with_a_log_line(declining_llama, tiny_checkpoints, caplog):
    """An external implementation that declines: AUTO builds the built-in one and logs the reason."""
    from kernelbay import resolve

    assert resolve("model", "LlamaForCausalLM") is declining_llama
    folder = tiny_checkpoints.get("llama3")[0]
    with caplog.at_level(logging.WARNING, logger="kernelbay.models"):
        model = AutoModelForCausalLM.from_pretrained(folder, progress=False)
    assert type(model) is not declining_llama and type(model).__name__ == "LlamaForCausalLM"
    assert "declined LlamaForCausalLM: needs a device this test machine lacks" in caplog.text
    assert "falling back to the default implementation kernelbay_llama.modeling (kernelbay-llama" in caplog.text


def test_no_target_in_require_mode_reraises(declining_llama, tiny_checkpoints):
    """implementation='require' surfaces the alternative's NoTarget instead of falling back."""
    with pytest.raises(NoTarget, match="needs a device this test machine lacks"):
        AutoModelForCausalLM.from_pretrained(tiny_checkpoints.get("llama3")[0], implementation="require")


def test_attention_layers_registered_by_index(tiny_checkpoints):
    """Each attention layer is reachable by its layer index (weak references, built with the model)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoints.get("gemma2")[0], progress=False)
    layers = model.attention_layers()
    assert list(layers) == ["0", "1", "2"]
    assert [layers[k].attn_type.value for k in layers] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert layers["1"] is model.model.layers[1].self_attn.attn


def test_lazy_architecture_access_through_the_registry():
    """`from kernelbay.models import Qwen3ForCausalLM` resolves the registered class; unknown names fail."""
    from kernelbay import models, resolve
    from kernelbay.models import Qwen3ForCausalLM

    assert Qwen3ForCausalLM is resolve("model", "Qwen3ForCausalLM")
    with pytest.raises(AttributeError, match="Did you mean: Qwen3ForCausalLM"):
        models.Qwen3ForCausalLm  # noqa: B018 - the attribute access is the test


def _shared_configs_of_supported_architectures() -> list[str]:
    import json
    from pathlib import Path

    from kernelbay.registry import first_party_names

    supported = set(first_party_names("model"))  # every architecture a first-party plugin ships
    found = []
    for path in sorted(Path(SHARED).glob("*/config.json")):
        archs = json.loads(path.read_text()).get("architectures") or []
        if archs and archs[0] in supported:
            found.append(path.parent.name)
    return found


@pytest.mark.parametrize("name", _shared_configs_of_supported_architectures())
def test_every_real_config_of_a_supported_architecture_builds_on_meta(name):
    """Each real config of a shipped architecture builds on meta with one attention layer per decoder layer,
    or is refused with a ConfigError (a quantization format that is not supported)."""
    try:
        config = ModelConfig.from_pretrained(f"{SHARED}/{name}")
    except ConfigError as err:
        pytest.skip(f"kernelbay_engine.config refuses this config.json: {err}")
    try:
        model = AutoModelForCausalLM.from_config(config)
    except ConfigError as err:
        assert config.quantization is not None, err
        return
    assert model.built_on_meta and all(p.is_meta for p in model.parameters())
    assert len(model.attention_layers()) == config.num_hidden_layers


@pytest.fixture
def runtime_registrations():
    """Registrations this test makes at runtime are removed afterwards."""
    from kernelbay import registry

    yield
    registry.unregister_provider(__name__)


class _Probe(nn.Module):
    """Stands in for a vision encoder or a draft model: records the config it was built from."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.proj = nn.Linear(4, 4)


def test_encoder_only_resolves_the_vision_encoder_slot(runtime_registrations):
    """encoder_only: the same architecture name resolves in the vision_encoder slot, not the model slot."""
    from kernelbay import register_vision_encoder

    register_vision_encoder("LlamaForCausalLM", target=_Probe)
    config = ModelConfig.from_pretrained(f"{SHARED}/llama-3.2-1b", encoder_only=True)
    model = AutoModelForCausalLM.from_config(config)
    assert type(model) is _Probe and model.built_on_meta


def test_draft_checkpoint_resolves_eagle3_target_name(runtime_registrations):
    """A config with draft_vocab_size resolves the draft_model slot EAGLE3<TargetArch>: kernelbay-llama's EAGLE-3
    head fills it, and an external registration takes it over."""
    from kernelbay import register_draft_model
    from kernelbay_llama.eagle3 import EAGLE3LlamaForCausalLM

    config = ModelConfig.from_pretrained(f"{SHARED}/eagle3-draft-llama3-8b-eagle3")
    assert type(AutoModelForCausalLM.from_config(config)) is EAGLE3LlamaForCausalLM
    register_draft_model("EAGLE3LlamaForCausalLM", target=_Probe)
    assert type(AutoModelForCausalLM.from_config(config)) is _Probe
