"""kernelbay-gguf: GGUF files as kernelbay models (`LLM("x.gguf")`, `kernelbay run x.gguf`).

The `gguf` weight format (`kernelbay_gguf.format:GGUFFormat`) reads config, tokenizer and tensors
from one file with the `gguf` package; quantized tensors are dequantized as they load, and
`LLM(..., quantization="gguf")` then keeps the Q8_0/Q4_0/Q4_1 ones on kernelbay_engine.quant's
kernels (`kernelbay_gguf.quantized`). docs/real-model.md walks through a real model.
"""
