"""Q8_0 / Q4_0 / Q4_1 weights kept quantized (kernelbay_engine.quant kernels) from the file's own codes."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from kernelbay_gguf.format import GGUFFormat
from kernelbay_gguf.quantized import CONSTRUCTORS, codes
from kernelbay_gguf.tensors import TensorInfo

from kernelbay_engine import LLM, AutoModelForCausalLM, SamplingParams
from kernelbay_engine.runner import StepRequest
from plugins.gguf.tests._write import transformers_from_gguf
from tests.models._parity import PROMPTS, reference_logits, runner

KEPT = [Q.Q8_0, Q.Q4_0, Q.Q4_1]
RELATIVE = 0.03  # the kernels compute in bfloat16: logits within 3% of the largest one


@pytest.mark.parametrize("qtype", KEPT, ids=lambda q: q.name)
def test_codes_stand_for_what_gguf_dequantizes(qtype):
    """The constructors' weights equal gguf's own dequantization of the same bytes."""
    values = np.random.default_rng(0).standard_normal((8, 96)).astype(np.float32)
    raw = gguf.quants.quantize(values, qtype)
    info = TensorInfo("blk.0.ffn_up.weight", qtype, values.shape, 0, raw.nbytes, raw.nbytes)
    ours = CONSTRUCTORS[qtype](*codes(info, raw)).dequantize()
    expected = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("qtype", KEPT, ids=lambda q: q.name)
@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_kept_quantized_model_matches_the_dequantized_reference(tiny_gguf, name, qtype):
    """Every linear (fused q/k/v and gate/up, Llama's permuted Q/K, the tied LM head) runs the file's codes."""
    path = tiny_gguf(name, qtype)
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
    report = GGUFFormat.keep_quantized(model, path)
    assert all(what.startswith(f"GGUF {qtype.name} on ") for what in report.values()), report
    logits = runner(model, "SDPA").step([StepRequest(i, p, 0) for i, p in enumerate(PROMPTS)])
    expected = reference_logits(transformers_from_gguf(path), [list(p) for p in PROMPTS])
    worst = (logits - expected).abs().max().item()
    assert worst <= RELATIVE * expected.abs().max().item(), f"[{name} {qtype.name}] max |logit diff| {worst:.3g}"


def test_other_types_keep_float_weights_and_say_why(tiny_gguf):
    path = tiny_gguf("llama", Q.F16)
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
    report = GGUFFormat.keep_quantized(model, path)
    assert set(report.values()) == {"stored as F16: no quantized kernel form, kept dequantized"}


@pytest.mark.slow
def test_smollm2_kept_quantized_perplexity_within_1_percent_of_dequantized(smollm2):
    """The real Q4_1 file (its embedding / LM head Q8_0): 512 tokens of a prompt scored both ways."""
    text = " ".join(f"Step {i}: the scheduler admits a request and the kernel reads its weights." for i in range(64))
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    perplexities = []
    for keep in (False, True):
        llm = LLM(smollm2, progress=False, prepack_weights="never")
        if keep:
            report = GGUFFormat.keep_quantized(llm.model, smollm2)
            assert {w.split(" on ")[0] for w in report.values()} == {"GGUF Q4_1", "GGUF Q8_0"}, report
        ids = llm.encode(text)[:512]
        out = llm.generate([ids], params)[0]
        nll = -sum(e[t] for e, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)) / (len(ids) - 1)
        perplexities.append(math.exp(nll))
    dequantized, kept = perplexities
    assert abs(kept / dequantized - 1) < 0.01, f"kept quantized {kept:.4f} vs dequantized {dequantized:.4f}"


def test_llm_quantization_gguf_keeps_the_file_codes(tiny_gguf):
    """LLM(x.gguf, quantization="gguf"): the report names each layer's kernel; generation runs."""
    llm = LLM(tiny_gguf("llama", Q.Q4_1), progress=False, quantization="gguf")
    assert set(llm.quant_report.values()) == {"GGUF Q4_1 on int4_group"}
    assert len(llm.generate([[1, 5, 9]], SamplingParams(max_tokens=4, temperature=0))[0].token_ids) == 4


def test_quantization_gguf_on_a_safetensors_folder_is_refused():
    """The embedded demo checkpoint is a safetensors folder: refused before its weights load."""
    with pytest.raises(ValueError, match=r"quantization='gguf' keeps a GGUF file's own quantized weights"):
        LLM(quantization="gguf")
