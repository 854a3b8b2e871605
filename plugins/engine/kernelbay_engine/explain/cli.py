"""`kernelbay explain MODEL`: config -> architecture -> provider -> per-layer backend, with reasons.

Contributed to the `kernelbay` CLI host through the `kernelbay.commands` entry point `explain`."""

from __future__ import annotations

import json
import math

from kernelbay.cli import COMMAND_SUMMARIES


def add_explain_command(parser):
    """The `kernelbay.commands` hook: add `explain`'s arguments to its parser, return its handler."""
    parser.description = COMMAND_SUMMARIES["explain"]
    add_arguments(parser)
    return run


def add_arguments(parser) -> None:
    from kernelbay.registry import MODEL_IMPLS

    parser.add_argument(
        "model", metavar="MODEL", help="model folder (only config.json is needed) or .gguf file (its header is read)"
    )
    parser.add_argument("--backend", metavar="NAME", help="attention backend to explain as requested")
    parser.add_argument(
        "--quantization",
        metavar="NAME",
        help="explain the linear kernels of this quantization (int8, int4; a .gguf file's own codes are shown by "
        "default, none: dequantized)",
    )
    parser.add_argument("--moe-backend", metavar="NAME", help="MoE expert kernel to explain as requested")
    parser.add_argument(
        "--kv-dtype",
        default="auto",
        metavar="DTYPE",
        help="KV-cache dtype: auto (the checkpoint's), bfloat16, float16, float32, fp8, ...",
    )
    parser.add_argument(
        "--memory", metavar="GIB", help="KV-cache memory to size: GiB as a number (4, 0.5) or with a unit (512MiB)"
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="show what each of N ranks holds: per-rank geometry, weight bytes, KV bytes per token",
    )
    parser.add_argument("--json", action="store_true", help="print the document (docs/explain-schema.md)")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow the folder's own config code to run (off by default)"
    )
    parser.add_argument(
        "--model-impl",
        choices=MODEL_IMPLS,
        default="auto",
        help="which provider to explain: auto (native if installed, else the transformers fallback), native, "
        "transformers",
    )


def memory_argument(value: str | None) -> str | None:
    """A bare number means GiB ("nan" and "inf" are left as written, for the section reading it to refuse)."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return value
    return f"{number}GiB" if math.isfinite(number) else value


def kv_dtype_argument(value: str) -> str:
    """The canonical KV-cache dtype, or an InputError listing the choices (before any config is read)."""
    from kernelbay.dtypes import normalize_kv_cache_dtype
    from kernelbay.errors import InputError

    try:
        return normalize_kv_cache_dtype(value)
    except ValueError as err:
        raise InputError(f"--kv-dtype: {err}") from None


def run(args) -> int:
    from .document import explain_model, render_text

    kv_dtype = kv_dtype_argument(args.kv_dtype)
    doc = explain_model(
        args.model,
        backend=args.backend,
        kv_cache_dtype=kv_dtype,
        memory=memory_argument(args.memory),
        trust_remote_code=args.trust_remote_code,
        model_impl=args.model_impl,
        moe_backend=args.moe_backend,
        quantization=args.quantization,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    print(json.dumps(doc, indent=2) if args.json else render_text(doc))
    return 0
