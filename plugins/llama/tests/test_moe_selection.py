"""Choosing the MoE kernel of a loaded MoE model: LLM(moe_backend=...), KERNELBAY_MOE_BACKEND, `kernelbay run
--moe-backend`, and the selector's errors (unknown name, incapable kernel, a kernel named for a dense model)."""

from __future__ import annotations

import pytest

from kernelbay import register_moe_backend
from kernelbay.attention import BackendNotCapable
from kernelbay.errors import IncapableBackend, UnknownBackend, UnknownNameError
from kernelbay_engine import LLM, AutoModelForCausalLM, SamplingParams
from kernelbay_engine.layers.moe import bind_moe_backends, moe_layers
from plugins.engine.tests.checkpoints import train_tokenizer
from plugins.llama.tests._tiny_moe import TINY_MOE
from tests.cli.conftest import run_cli
from tests.moe import _fakes
from tests.testing.conftest import fresh_registry  # noqa: F401  (fixture)

GREEDY = SamplingParams(max_tokens=4, temperature=0)


@pytest.fixture(scope="module")
def mixtral(tiny_checkpoints):
    folder, _ = tiny_checkpoints.get("mixtral", TINY_MOE["mixtral"])
    return folder


@pytest.fixture(scope="module")
def mixtral_with_tokenizer(tmp_path_factory):
    """A tiny Mixtral with a trained byte-level tokenizer (vocab 320), for `kernelbay run`."""
    import torch
    import transformers

    folder = tmp_path_factory.mktemp("mixtral-run")
    torch.manual_seed(0)
    config = TINY_MOE["mixtral"].build()
    config.vocab_size = 320
    transformers.MixtralForCausalLM(config).eval().save_pretrained(folder)
    train_tokenizer(folder)
    return folder


def _backends(model) -> set[str]:
    return {layer.backend.name for layer in moe_layers(model)}


def test_llm_binds_the_requested_kernel_and_both_kernels_generate_the_same(mixtral):
    outputs = {}
    for name in ("TORCH_MOE", "TORCH_GROUPED_MOE"):
        llm = LLM(mixtral, moe_backend=name, progress=False, max_num_seqs=2)
        assert llm.model.moe_selection.backend_name == name and _backends(llm.model) == {name}
        outputs[name] = [o.token_ids for o in llm.generate([[1, 5, 9], [4]], GREEDY)]
    assert outputs["TORCH_MOE"] == outputs["TORCH_GROUPED_MOE"]


def test_default_is_the_platform_priority_and_the_variable_overrides_it(mixtral, monkeypatch):
    monkeypatch.delenv("KERNELBAY_MOE_BACKEND", raising=False)
    model = AutoModelForCausalLM.from_pretrained(mixtral, progress=False)
    assert model.moe_selection.backend_name == "TORCH_GROUPED_MOE" and model.moe_selection.requested is None
    monkeypatch.setenv("KERNELBAY_MOE_BACKEND", "TORCH_MOE")
    model = AutoModelForCausalLM.from_pretrained(mixtral, progress=False)
    assert _backends(model) == {"TORCH_MOE"} and model.moe_selection.requested == "TORCH_MOE"
    monkeypatch.setenv("KERNELBAY_MOE_BACKEND", "TORCH_MEO")
    with pytest.raises(UnknownNameError, match="Unknown MoE backend: 'TORCH_MEO'"):
        AutoModelForCausalLM.from_pretrained(mixtral, progress=False)


def test_an_unknown_kernel_fails_before_loading_naming_the_known_ones(mixtral):
    with pytest.raises(UnknownBackend) as err:
        LLM(mixtral, moe_backend="TORCH_GROUPED", progress=False)
    assert "Unknown MoE backend: 'TORCH_GROUPED'" in str(err.value) and "TORCH_GROUPED_MOE" in str(err.value)


def test_an_incapable_kernel_lists_its_failed_capabilities(mixtral, fresh_registry):  # noqa: F811
    register_moe_backend("FAKE_DECLARES_NOTHING", target=_fakes.DeclaresNothing)
    with pytest.raises(IncapableBackend, match="FAKE_DECLARES_NOTHING cannot run MoE layers") as err:
        LLM(mixtral, moe_backend="FAKE_DECLARES_NOTHING", progress=False)
    assert "activation: silu is not supported" in str(err.value)
    model = AutoModelForCausalLM.from_pretrained(mixtral, progress=False)
    with pytest.raises(BackendNotCapable, match="FAKE_DECLARES_NOTHING cannot run MoE layers"):
        bind_moe_backends(model, "FAKE_DECLARES_NOTHING")
    assert _backends(model) == {"TORCH_GROUPED_MOE"}, "a refused kernel leaves the bound one in place"


def test_naming_a_kernel_for_a_dense_model_is_an_error(tiny_checkpoints):
    folder, _ = tiny_checkpoints.get("llama3")
    with pytest.raises(IncapableBackend, match="LlamaForCausalLM has no MoE layers"):
        LLM(folder, moe_backend="TORCH_MOE", progress=False)


def test_run_takes_moe_backend(mixtral_with_tokenizer):
    args = ("run", str(mixtral_with_tokenizer), "--prompt", "ab", "--max-tokens", "3")
    good = run_cli(*args, "--moe-backend", "TORCH_MOE")
    assert good.returncode == 0, good.stderr
    assert run_cli(*args).stdout == good.stdout, "the default kernel (TORCH_GROUPED_MOE) writes the same text"
    bad = run_cli(*args, "--moe-backend", "TORCH_MEO")
    assert bad.returncode == 7 and "Unknown MoE backend: 'TORCH_MEO'" in bad.stderr and "Traceback" not in bad.stderr


def test_llm_selects_attention_once_and_moe_once(mixtral, monkeypatch):
    """Constructing an LLM runs the selector once per kernel kind (before any weight is read); the runner and
    the MoE layers take those selections rather than asking again."""
    import kernelbay_engine.selection as selection

    calls = {"attention": 0, "moe": 0}

    def counting(kind, select):
        def call(*args, **kwargs):
            calls[kind] += 1
            return select(*args, **kwargs)

        return call

    monkeypatch.setattr(selection, "select_for_layer_groups", counting("attention", selection.select_for_layer_groups))
    monkeypatch.setattr(selection, "select_moe_backend", counting("moe", selection.select_moe_backend))
    llm = LLM(mixtral, progress=False, max_num_seqs=2)
    assert calls == {"attention": 1, "moe": 1}
    assert llm.model.moe_selection.backend_name in {"TORCH_MOE", "TORCH_GROUPED_MOE"}
    assert llm.generate([[1, 5, 9]], GREEDY)[0].token_ids
