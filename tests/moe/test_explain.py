"""`kernelbay explain` on MoE models: an "moe" section with the geometry and the expert kernel, with reasons."""

from __future__ import annotations

from kernelbay_engine.explain import explain_model, render_text
from tests._explain_schema import validate
from tests._paths import REAL_CONFIGS as CONFIGS
from tests.cli.test_explain import explain_in_process


def test_the_moe_section_names_the_kernel_and_every_candidate():
    doc = explain_model(CONFIGS / "qwen3-30b-a3b")
    assert validate(doc) == []
    moe = doc["moe"]
    assert (moe["num_experts"], moe["top_k"], moe["backend"], moe["runnable"]) == (128, 8, moe["backend"], True)
    assert moe["backend"] in {c["name"] for c in moe["candidates"] if c["chosen"]}
    assert doc["config"]["parameters"]["active_per_token"] < doc["config"]["parameters"]["total"] / 8
    text = render_text(doc)
    assert "moe          128 experts, top-8 (softmax_topk, renormalised), expert width 768" in text
    assert f"  kernel     {moe['backend']}" in text


def test_a_dense_model_has_no_moe_section():
    doc = explain_model(CONFIGS / "llama-3.1-8b")
    assert doc["moe"] is None and "moe    " not in render_text(doc)


def test_mxfp4_experts_are_read_packed_by_a_kernel_that_declares_the_format():
    """GPT-OSS stores MXFP4 experts: TORCH_MOE declares mxfp4, so nothing is dequantized at load; it is said."""
    doc = explain_model(CONFIGS / "gpt-oss-20b", moe_backend="TORCH_MOE")
    assert (doc["moe"]["stored_format"], doc["moe"]["dequantized"]) == ("mxfp4", False)
    assert doc["moe"]["requirements"]["expert_format"] == "mxfp4"


def test_an_unknown_moe_backend_is_exit_7_naming_the_known_ones():
    code, out, err = explain_in_process(str(CONFIGS / "qwen3-30b-a3b"), "--moe-backend", "TORCH_MEO")
    assert code == 7 and out == ""
    assert "Unknown MoE backend: 'TORCH_MEO'" in err and "Did you mean: TORCH_MOE" in err


def test_an_incapable_kernel_named_by_the_variable_is_exit_8_like_the_flag(monkeypatch, fresh_registry):
    """KERNELBAY_MOE_BACKEND is a request like --moe-backend: an incapable kernel is an error, not a quiet
    "not runnable" document."""
    from kernelbay import register_moe_backend

    from . import _fakes

    register_moe_backend("FAKE_DECLARES_NOTHING", target=_fakes.DeclaresNothing)
    monkeypatch.setenv("KERNELBAY_MOE_BACKEND", "FAKE_DECLARES_NOTHING")
    code, out, err = explain_in_process(str(CONFIGS / "qwen3-30b-a3b"))
    assert code == 8 and out == ""
    assert "requested MoE backend FAKE_DECLARES_NOTHING cannot run" in err
