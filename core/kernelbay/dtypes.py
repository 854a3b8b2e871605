"""kernelbay's one dtype vocabulary: model dtypes, KV-cache dtypes, the spellings users type, their sizes.

Config resolution, the attention protocol, the cache helpers, the engine and every backend's
declarations use these names; nothing else defines a dtype name. torch is imported only by
`torch_dtype` / `dtype_name`.
"""

from __future__ import annotations

MODEL_DTYPES = ("float32", "bfloat16", "float16")
"""What a model computes in (and a checkpoint stores its floats as)."""
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "fp8_e4m3")
"""What the paged cache can store; "auto" is the model dtype. fp8_e4m3 carries a per-layer scale."""
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1}
# What users and checkpoints write (transformers', vLLM's and torch's spellings) -> the canonical name.
ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp8": "fp8_e4m3",
    "fp8-e4m3": "fp8_e4m3",
    "fp8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "e4m3": "fp8_e4m3",
}
_TORCH_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "fp8_e4m3": "float8_e4m3fn"}


def canonical(name: object) -> str:
    """The canonical spelling of a dtype name or torch dtype (not checked against any set)."""
    text = str(name).lower().removeprefix("torch.")
    return ALIASES.get(text, text)


def normalize_dtype(name: object) -> str:
    """A model dtype ("float32", "bfloat16", "float16") from any spelling; else a ValueError naming the choices."""
    canon = canonical(name)
    if canon not in MODEL_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; use one of: {', '.join(MODEL_DTYPES)}")
    return canon


def normalize_kv_cache_dtype(name: object | None) -> str:
    """A KV-cache dtype from any spelling; None means "auto" (the model dtype)."""
    canon = "auto" if name is None else canonical(name)
    if canon not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown KV-cache dtype {name!r}; use one of: {', '.join(KV_CACHE_DTYPES)}")
    return canon


def storage_dtype(kv_cache_dtype: object | None, model_dtype: object) -> str:
    """The dtype the cache really stores: "auto" resolves to the model dtype."""
    kv = normalize_kv_cache_dtype(kv_cache_dtype)
    return normalize_dtype(model_dtype) if kv == "auto" else kv


def element_bytes(kv_cache_dtype: object | None, model_dtype: object) -> int:
    """Bytes of one cached K/V element."""
    return ELEMENT_BYTES[storage_dtype(kv_cache_dtype, model_dtype)]


def torch_dtype(name: object):
    """The torch dtype of a model or KV-cache dtype name (a torch dtype passes through if it is one of ours)."""
    import torch

    canon = canonical(name)
    if canon not in _TORCH_NAMES:
        raise ValueError(f"no torch dtype for {name!r}; use one of: {', '.join(_TORCH_NAMES)}")
    return getattr(torch, _TORCH_NAMES[canon])


def dtype_name(dtype) -> str:
    """The canonical name of a torch dtype kernelbay stores or computes in."""
    for name, torch_name in _TORCH_NAMES.items():
        if str(dtype) == f"torch.{torch_name}":
            return name
    raise ValueError(f"unsupported dtype {dtype}; use one of: {', '.join(_TORCH_NAMES)}")
