"""Quantized linear layers on CPU: weights held as integer codes, run by selectable kernels.

Public interface (stable; the GGUF loader builds on it):

    from kernelbay_engine.quant import from_q8_0, from_q4_0, from_q4_1, quantize, set_quantized_weight

    w = from_q8_0(q, scale)        # q int8 [N, K], scale [N, K // 32]       value = q * scale
    w = from_q4_0(q, scale)        # q uint8 0..15 [N, K], scale [N, K // 32] value = (q - 8) * scale
    w = from_q4_1(q, scale, min)   # same q, scale and min [N, K // 32]       value = q * scale + min
    w = quantize(dense, 8, 32, source="GGUF Q6_K, requantized to int8 groups of 32")  # K-quants:
                                   # dequantize, then requantize to the nearest supported form
    choice = set_quantized_weight(linear_layer, w)   # the layer now runs `choice.kernel`
    set_quantized_embedding(model.input_embeddings(), w)   # the table's rows from the codes (embedding.py)
    w.dequantize()                 # float32 [N, K]: the reference the kernels are tested against

Scales may be fp16 or fp32 (held as fp32; the kernels compute in bf16). K must be a multiple of 32.
`quantize_model(model, "int8" | "int8-channel" | "int4")` (int8: groups of 32) quantizes a loaded float model
(`LLM(quantization=...)`, `kernelbay run --quantization ...`); `linear_kernels_section` is what `kernelbay explain`
shows.

Kernels (kernels.py), in order of preference: int8_channel (aten._weight_int8pack_mm, per-channel
int8), int4_group (aten._weight_int4pack_mm_for_cpu, groups of 32-256), int8_group (groupwise int8
such as Q8_0, exactly, as two nibble planes on the int4 kernel), dense (dequantized to the model dtype).
"""

from kernelbay_engine.quant.embedding import QuantizedEmbedding, set_quantized_embedding
from kernelbay_engine.quant.kernels import KERNEL_NAMES, KERNELS, LinearKernel, LinearRequirements
from kernelbay_engine.quant.method import (
    MODES,
    QuantizedLinearMethod,
    QuantReport,
    quantize_model,
    set_quantized_weight,
)
from kernelbay_engine.quant.select import KernelChoice, select_kernel
from kernelbay_engine.quant.weights import QuantizedWeight, from_q4_0, from_q4_1, from_q8_0, quantize

__all__ = [
    "KERNELS",
    "KERNEL_NAMES",
    "MODES",
    "KernelChoice",
    "LinearKernel",
    "LinearRequirements",
    "QuantizedEmbedding",
    "QuantReport",
    "QuantizedLinearMethod",
    "QuantizedWeight",
    "from_q4_0",
    "from_q4_1",
    "from_q8_0",
    "quantize",
    "quantize_model",
    "select_kernel",
    "set_quantized_embedding",
    "set_quantized_weight",
]
