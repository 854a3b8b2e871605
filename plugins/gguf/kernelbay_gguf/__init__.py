"""kernelbay-gguf: GGUF files as kernelbay models (`LLM("x.gguf")`, `kernelbay run x.gguf`).

The `gguf` weight format (`kernelbay_gguf.format:GGUFFormat`) reads config, tokenizer and tensors
from one file with the `gguf` package; quantized tensors are dequantized as they load.
"""
