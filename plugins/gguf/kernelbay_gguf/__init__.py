"""kernelbay-gguf: GGUF files as kernelbay models (`LLM("x.gguf")`, `kernelbay run x.gguf`).

The `gguf` weight format (`kernelbay_gguf.format:GGUFFormat`) reads config, tokenizer and tensors
from one file with the `gguf` package; quantized tensors are dequantized as they load, and
`LLM(..., quantization="gguf")` then keeps them on kernelbay_engine.quant's kernels: Q8_0/Q4_0/Q4_1/Q4_K
as their own codes, the other quantized types requantized to int8 groups of 32 (`kernelbay_gguf.quantized`);
`GGUFFormat.load_quantized(path)` builds that model without a float copy of those weights first.
docs/real-model.md walks through a real model.
"""
