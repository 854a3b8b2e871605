"""Checkpoint dtype and KV-cache element sizes."""

from __future__ import annotations

from ..errors import ConfigError
from ._fields import Fields

DTYPES = {"float32": "float32", "float": "float32", "fp32": "float32",
          "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "half": "float16"}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# kv_cache_dtype spellings (vLLM's) -> bytes per element; "auto" means the checkpoint dtype.
KV_CACHE_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
                        "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "int8": 1}


def resolve_dtype(f: Fields) -> str:
    """"float32" | "bfloat16" | "float16" from torch_dtype / dtype, else from the weights' headers, else
    float32 (HF's convention for configs that omit it)."""
    value = f.get("torch_dtype", "dtype")
    if value is None and f.weights() is not None and f.weights().float_dtype():
        value = f.weights().float_dtype()
        f.notes.append(f"no torch_dtype/dtype in config.json: {value}, read from the safetensors headers")
    if value is None:
        f.notes.append("no torch_dtype/dtype in config.json: float32 assumed (transformers' convention)")
        return "float32"
    name = str(value).removeprefix("torch.")
    if name not in DTYPES:
        raise ConfigError(f"{f.source}: torch_dtype {value!r} is not a checkpoint dtype kernelbay knows; "
                          f"use one of {', '.join(sorted(set(DTYPES.values())))}.")
    return DTYPES[name]


def kv_element_bytes(kv_cache_dtype: str | None, checkpoint_dtype: str) -> int:
    """Bytes of one cached K/V element for a kv_cache_dtype (None / "auto": the checkpoint dtype)."""
    if kv_cache_dtype in (None, "auto"):
        return DTYPE_BYTES[checkpoint_dtype]
    name = str(kv_cache_dtype).removeprefix("torch.")
    if name not in KV_CACHE_DTYPE_BYTES:
        raise ConfigError(f"Unknown kv_cache_dtype {kv_cache_dtype!r}; use 'auto' or one of "
                          f"{', '.join(sorted(KV_CACHE_DTYPE_BYTES))}.")
    return KV_CACHE_DTYPE_BYTES[name]
