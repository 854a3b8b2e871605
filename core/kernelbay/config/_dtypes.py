"""The checkpoint's dtype, read with kernelbay's one dtype vocabulary (kernelbay.dtypes)."""

from __future__ import annotations

from ..dtypes import MODEL_DTYPES, canonical, element_bytes
from ..errors import ConfigError
from ._fields import Fields


def resolve_dtype(f: Fields) -> str:
    """ "float32" | "bfloat16" | "float16" from torch_dtype / dtype, else from the weights' headers, else
    float32 (HF's convention for configs that omit it)."""
    value = f.get("torch_dtype", "dtype")
    weights = f.weights()
    if value is None and weights is not None and weights.float_dtype():
        value = weights.float_dtype()
        f.notes.append(f"no torch_dtype/dtype in config.json: {value}, read from the safetensors headers")
    if value is None:
        f.notes.append("no torch_dtype/dtype in config.json: float32 assumed (transformers' convention)")
        return "float32"
    if canonical(value) not in MODEL_DTYPES:
        raise ConfigError(
            f"{f.source}: torch_dtype {value!r} is not a checkpoint dtype kernelbay knows; "
            f"use one of {', '.join(MODEL_DTYPES)}."
        )
    return canonical(value)


def kv_element_bytes(kv_cache_dtype: str | None, checkpoint_dtype: str) -> int:
    """Bytes of one cached K/V element for a kv_cache_dtype (None / "auto": the checkpoint dtype)."""
    try:
        return element_bytes(kv_cache_dtype, checkpoint_dtype)
    except ValueError as err:
        raise ConfigError(f"kv_cache_dtype: {err}") from None
