"""`kernelbay explain --quantization`: the engine's linear_kernels section names each linear's kernel and why."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from kernelbay.errors import ConfigError
from kernelbay_engine.explain import explain_model, render_text
from plugins.engine.tests.quant._kernels_here import (
    DOT,
    INT4,
    INT8_CHANNEL,
    assert_unavailable_say_why,
    available,
    not_available,
)
from tests._explain_schema import validate


def test_int4_section_lists_every_distinct_linear_with_reasons(tiny_llama):
    """int4: projections on int8_dot (where it runs) or int4_group, the LM head on int8_dot or int8_channel (each
    on dense where neither runs); every candidate carries a reason, an unavailable kernel its own."""
    doc = explain_model(tiny_llama, quantization="int4")
    assert validate(doc) == []
    section = doc["sections"]["linear_kernels"]
    kernels = {g["name"]: (g["kernel"], g["bits"], g["count"]) for g in section["groups"]}
    assert kernels == {
        "qkv_proj": (INT4, 4, 2),
        "o_proj": (INT4, 4, 2),
        "gate_up_proj": (INT4, 4, 2),
        "down_proj": (INT4, 4, 2),
        "lm_head": (INT8_CHANNEL, 8, 1),
    }
    head = next(g for g in section["groups"] if g["name"] == "lm_head")
    reasons = {c["name"]: (c["reason"], c["failures"]) for c in head["candidates"]}
    assert reasons["int4_group"] == ("not capable", ["8-bit weights: it runs 4-bit ones", *not_available("int4_group")])
    if DOT:
        assert reasons["int8_dot"][0].startswith("chosen: int8 activations per block of 32 on AVX-512 VNNI")
        if available("int8_channel"):
            assert reasons["int8_channel"][0] == "capable, a preferred kernel was chosen"
    elif INT8_CHANNEL == "int8_channel":
        assert reasons["int8_channel"][0].startswith("chosen: bf16 activations on ")
    else:
        assert reasons["dense"] == ("chosen: plain weights in the model dtype", [])
    for group in section["groups"]:
        assert_unavailable_say_why(group["candidates"])
    text = render_text(doc)
    assert f"lm_head              x1   [320, 64] 8-bit per-channel -> {INT8_CHANNEL}" in text
    shown = [f"        - {f}" for c in head["candidates"] for f in c["failures"]]  # unavailability reasons included
    assert shown and all(line in text.splitlines() for line in shown)


def test_plain_weights_get_the_prepack_rule_not_a_kernel_section(tiny_llama):
    """Plain weights: no quantized kernel to choose, so no linear_kernels section; the prepack section says which form
    `prepack_weights="auto"` packs them in, by rule (the same answer `planned_form` gives the load)."""
    from kernelbay_engine.layers import prepack

    sections = explain_model(tiny_llama)["sections"]
    assert list(sections) == ["prepack"]
    section = sections["prepack"]
    form = prepack.planned_form(torch.float32, prepack.MIN_AUTO_NUMEL, "auto")[0]
    assert section["policy"] == "auto" and section["dtype"] == "float32" and section["form"] == form
    assert section["min_elements"] == prepack.MIN_AUTO_NUMEL
    assert section["lines"][0].startswith(f"prepack      float32 linears of {prepack.MIN_AUTO_NUMEL:,} elements")
    assert "prepack" not in explain_model(tiny_llama, quantization="int8")["sections"]


def test_an_unknown_quantization_is_named(tiny_llama):
    """A misspelt mode lists the valid ones; 'gguf' (a file's own codes) on a safetensors folder asks for a .gguf."""
    with pytest.raises(ConfigError, match="unknown quantization 'int2': valid values are int8, int8-channel, int4"):
        explain_model(tiny_llama, quantization="int2")
    with pytest.raises(ConfigError, match=r"--quantization gguf keeps a \.gguf file's own quantized weights, but"):
        explain_model(tiny_llama, quantization="gguf")


def test_the_cli_option_reaches_the_section(tiny_llama):
    """`kernelbay explain --quantization int8 --json` through the CLI host."""
    out = subprocess.run(
        [sys.executable, "-m", "kernelbay.cli", "explain", str(tiny_llama), "--quantization", "int8", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    groups = json.loads(out.stdout)["sections"]["linear_kernels"]["groups"]
    assert {g["kernel"] for g in groups} == {INT8_CHANNEL}
    for group in groups:
        assert_unavailable_say_why(group["candidates"])
