"""The quantized linear kernels alone, on SmolLM2-135M's shapes: what each candidate form costs (issue #15).

    .venv/bin/python benchmarks/quant_kernels.py [--threads 2] [--rows 1 8]
        [--sections dtype groups head kernels fp32 embedding]

Sections (each a markdown table; "% of bw" is the bytes a pass reads over its time, against the read bandwidth
measured as benchmarks/cpu_decode.py measures it: torch sum over 1 GiB with the same threads):

- dtype: torch's int4 (`_weight_int4pack_mm_for_cpu`, groups of 32) and int8 (`_weight_int8pack_mm`) CPU ops
  with bf16, fp16 and fp32 activations (scales in the same dtype), one pass over the layers; "bf16 + casts"
  is the engine's `QuantizedLinearMethod` (fp32 in and out, cast to bf16 and back around the kernel).
- groups: one pass over the 30 layers' linears (no LM head) on int4 at groups of 32 (Q4_1's, the only exact
  one for the file) and 64 (for the cost of the scale loads only; the kernel's 128 / 256 do not divide K = 576),
  int8 per-channel, and torch's `_dyn_quant_matmul_4bit` (int8 activations) on one layer.
- head: the tied LM head [49152, 576] in each form a mode gives it: Q8_0 on int8_group (the file's codes),
  int8 per-channel (`--quantization int8`), int4 groups of 32, bf16 oneDNN-packed, fp32 oneDNN-packed and fdot.
- kernels: the engine's layers on each kernel that runs them, requested by name: int8_dot (int8 activations,
  AVX-512 VNNI, kernelbay_engine.native) against torch's op for the same codes (int4_group, int8_group,
  int8_channel), one pass over the 30 layers' linears and the LM head.
- fp32: the float32 model's forms of one weight, as `layers/prepack.py` chooses among them: dense (MKL's
  `F.linear`), oneDNN-packed and fdot's panels (AVX-512 FMA, kernelbay_engine.native), one pass over the 30
  layers' linears and the LM head.
- embedding: the token lookup from the fp32 table against the Q8_0 codes (`kernelbay_engine.quant`'s
  quantized table: rows dequantized as gathered), for 1, 8 and 256 tokens.

Weights are random (the costs do not depend on values); every pass reads weights far beyond the caches.
Best of --repeat passes after warm-up; the machine is shared, so compare rows of one run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode import LINEARS, read_bandwidth

from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.layers.prepack import prepack_linear_weights
from kernelbay_engine.models.quant import UnquantizedLinearMethod
from kernelbay_engine.quant import from_q8_0, quantize, set_quantized_weight

LAYERS = LINEARS[:-1]  # 30 x (qkv, o, gate_up, down)
HEAD = LINEARS[-1]
HEADER = ["| form | rows | ms per pass | MiB read | GB/s | % of bw |", "|---|---:|---:|---:|---:|---:|"]


def best_of(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def row(label: str, rows: int, seconds: float, nbytes: int, bandwidth: float) -> str:
    gbs = nbytes / seconds / 1e9
    return f"| {label} | {rows} | {seconds * 1e3:.3f} | {nbytes / 2**20:.1f} | {gbs:.1f} | {gbs / bandwidth:.0%} |"


# -- raw ops -------------------------------------------------------------------------------------------
def int4_raw(n: int, k: int, group: int, dtype: torch.dtype):
    """(run(x), bytes read) on torch's int4 CPU op, codes random, scales/zeros in `dtype`."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (n, k), dtype=torch.int32), 1)
    sz = (torch.rand(k // group, n, 2) * 0.01).to(dtype)
    return (lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)), packed.numel() + sz.nbytes


def int8_raw(n: int, k: int, dtype: torch.dtype):
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    s = (torch.rand(n) * 0.01).to(dtype)
    return (lambda x: torch.ops.aten._weight_int8pack_mm(x, q, s)), q.numel() + s.nbytes


def dyn_quant_raw(n: int, k: int, group: int):
    """torch's int8-activation int4 op: symmetric int4 codes, fp32 activations quantized per row inside."""
    codes = torch.randint(0, 16, (n, k // 2), dtype=torch.uint8)
    scales = torch.rand(n, k // group) * 0.01
    packed = torch.ops.aten._dyn_quant_pack_4bit_weight(codes, scales, None, group, k, n)
    return (lambda x: torch.ops.aten._dyn_quant_matmul_4bit(x, packed, group, k, n)), codes.numel() + scales.nbytes


# -- engine layers -------------------------------------------------------------------------------------
TORCH_KERNEL = {"Q8_0 int8_group": "int8_group", "int8 per-channel": "int8_channel", "int4 g32": "int4_group"}
FLOAT_FORMS = {"fp32 dense": None, "fp32 oneDNN": "onednn", "fp32 fdot": "fdot", "bf16 oneDNN": "onednn"}


def engine_layer(n: int, k: int, form: str, kernel: str | None = None) -> tuple[Linear, int]:
    """A `Linear` in one of the forms the engine gives a layer (on `kernel`, default the form's torch kernel), and
    the bytes one product reads."""
    layer = Linear(k, n)
    dtype = torch.bfloat16 if form.startswith("bf16") else torch.float32
    layer.create_weights(UnquantizedLinearMethod(), dtype)
    torch.nn.init.normal_(layer.weight, std=0.02)
    if form in FLOAT_FORMS:
        nbytes = layer.weight.nbytes
        holder = torch.nn.Module()
        holder.add_module("l", layer)
        if FLOAT_FORMS[form] is not None:
            report = prepack_linear_weights(holder, policy="always", forms=(FLOAT_FORMS[form],))
            assert report.packed, report.skipped
        return layer, nbytes
    weight = {
        "Q8_0 int8_group": lambda w: _q8_0_of(w),
        "int8 per-channel": lambda w: quantize(w, 8),
        "int4 g32": lambda w: quantize(w, 4, 32),
    }[form](layer.weight)
    set_quantized_weight(layer, weight, kernel=kernel or TORCH_KERNEL[form])
    return layer, layer.method.nbytes


def _q8_0_of(w: torch.Tensor):
    g = quantize(w, 8, 32)
    return from_q8_0(g.q, g.scale.half())


# -- sections ------------------------------------------------------------------------------------------
def section_dtype(rows: int, repeat: int, bandwidth: float) -> list[str]:
    lines = ["", f"activation dtype: one pass over the 30 layers' linears ({rows} rows)", *HEADER]
    for kernel in ("int4 g32", "int8 per-channel"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            int4 = kernel.startswith("int4")
            built = [(int4_raw(n, k, 32, dtype) if int4 else int8_raw(n, k, dtype), k) for n, k in LAYERS]
            tries = repeat if dtype == torch.bfloat16 else 2  # the other dtypes run 20-50x slower
            seconds = _pass([(run, k) for (run, _), k in built], rows, tries, dtype)
            name = str(dtype).removeprefix("torch.")
            lines.append(
                row(
                    f"{kernel}, {name} activations (kernel alone)",
                    rows,
                    seconds,
                    sum(b for (_, b), _ in built),
                    bandwidth,
                )
            )
        layers = [(engine_layer(n, k, kernel), k) for n, k in LAYERS]
        seconds = _pass([(lay, k) for (lay, _), k in layers], rows, repeat)
        lines.append(
            row(f"{kernel}, bf16 + casts (fp32 in/out)", rows, seconds, sum(b for (_, b), _ in layers), bandwidth)
        )
    return lines


def _pass(layers, rows: int, repeat: int, dtype: torch.dtype = torch.float32) -> float:
    xs = {k: torch.randn(rows, k, dtype=dtype) for k in (576, 1536)}
    return best_of(lambda: [run(xs[k]) for run, k in layers], repeat)


def section_groups(rows: int, repeat: int, bandwidth: float) -> list[str]:
    lines = ["", f"one pass over the 30 layers' linears ({rows} rows, kernel alone, bf16 activations)", *HEADER]
    for group in (32, 64):  # 128 and 256 do not divide K = 576
        built = [(int4_raw(n, k, group, torch.bfloat16), k) for n, k in LAYERS]
        nbytes = sum(b for (_, b), _ in built)
        seconds = _pass([(run, k) for (run, _), k in built], rows, repeat, torch.bfloat16)
        exact = " (Q4_1's groups: exact)" if group == 32 else " (not the file's groups)"
        lines.append(row(f"int4 g{group}{exact}", rows, seconds, nbytes, bandwidth))
    built = [(int8_raw(n, k, torch.bfloat16), k) for n, k in LAYERS]
    seconds = _pass([(run, k) for (run, _), k in built], rows, repeat, torch.bfloat16)
    lines.append(row("int8 per-channel", rows, seconds, sum(b for (_, b), _ in built), bandwidth))
    n, k = LAYERS[2]
    run, nbytes = dyn_quant_raw(n, k, 32)
    x = torch.randn(rows, k)
    lines.append(
        row(f"_dyn_quant_matmul_4bit g32, one [{n}, {k}] layer", rows, best_of(lambda: run(x), 3), nbytes, bandwidth)
    )
    run, nbytes = int4_raw(n, k, 32, torch.bfloat16)
    xb = x.bfloat16()
    lines.append(row("int4 g32, the same one layer", rows, best_of(lambda: run(xb), repeat), nbytes, bandwidth))
    return lines


def section_head(rows: int, repeat: int, bandwidth: float) -> list[str]:
    n, k = HEAD
    lines = ["", f"LM head [{n}, {k}] ({rows} rows, fp32 in and out, as the engine calls it)", *HEADER]
    for form in ("Q8_0 int8_group", "int8 per-channel", "int4 g32", "bf16 oneDNN", "fp32 oneDNN", "fp32 fdot"):
        layer, nbytes = engine_layer(n, k, form)
        x = torch.randn(rows, k, dtype=torch.bfloat16 if form.startswith("bf16") else torch.float32)
        lines.append(row(form, rows, best_of(lambda layer=layer, x=x: layer(x), repeat), nbytes, bandwidth))
        del layer
    return lines


def section_kernels(rows: int, repeat: int, bandwidth: float) -> list[str]:
    lines = ["", f"each kernel on the same codes ({rows} rows, fp32 in and out, as the engine calls it)", *HEADER]
    for form, torch_kernel in TORCH_KERNEL.items():
        for kernel in ("int8_dot", torch_kernel):
            layers = [(engine_layer(n, k, form, kernel), k) for n, k in LAYERS]
            seconds = _pass([(lay, k) for (lay, _), k in layers], rows, repeat)
            nbytes = sum(b for (_, b), _ in layers)
            lines.append(row(f"{form} codes on {kernel}, 30 layers", rows, seconds, nbytes, bandwidth))
            del layers
            head, nbytes = engine_layer(*HEAD, form, kernel)
            x = torch.randn(rows, HEAD[1])
            seconds = best_of(lambda head=head, x=x: head(x), repeat)
            lines.append(row(f"{form} codes on {kernel}, LM head", rows, seconds, nbytes, bandwidth))
    return lines


def section_fp32(rows: int, repeat: int, bandwidth: float) -> list[str]:
    lines = ["", f"float32 weights in each form ({rows} rows, fp32 in and out, as the engine calls it)", *HEADER]
    for form in ("fp32 dense", "fp32 oneDNN", "fp32 fdot"):
        layers = [(engine_layer(n, k, form), k) for n, k in LAYERS]
        seconds = _pass([(lay, k) for (lay, _), k in layers], rows, repeat)
        lines.append(row(f"{form}, 30 layers", rows, seconds, sum(b for (_, b), _ in layers), bandwidth))
        del layers
        head, nbytes = engine_layer(*HEAD, form)
        x = torch.randn(rows, HEAD[1])
        lines.append(row(f"{form}, LM head", rows, best_of(lambda head=head, x=x: head(x), repeat), nbytes, bandwidth))
        del head
    return lines


def section_embedding(rows: int, repeat: int, bandwidth: float) -> list[str]:
    from kernelbay_engine.quant import QuantizedEmbedding

    n, k = HEAD
    table = torch.randn(n, k) * 0.02
    q8 = _q8_0_of(table)
    quantized = QuantizedEmbedding(q8, torch.float32)
    head = ["| table | tokens | us per lookup | table MiB |", "|---|---:|---:|---:|"]
    lines = ["", "embedding lookup (fp32 rows out)", *head]
    for tokens in (1, 8, 256):
        ids = torch.randint(0, n, (tokens,))
        dense_s = best_of(lambda ids=ids: torch.nn.functional.embedding(ids, table), repeat * 10)
        quant_s = best_of(lambda ids=ids: quantized.lookup(ids), repeat * 10)
        lines.append(f"| fp32 | {tokens} | {dense_s * 1e6:.1f} | {table.nbytes / 2**20:.1f} |")
        lines.append(f"| Q8_0 codes | {tokens} | {quant_s * 1e6:.1f} | {quantized.nbytes / 2**20:.1f} |")
    return lines


SECTIONS = {
    "dtype": section_dtype,
    "groups": section_groups,
    "head": section_head,
    "kernels": section_kernels,
    "fp32": section_fp32,
    "embedding": section_embedding,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    args = parser.parse_args()
    bandwidth = read_bandwidth(args.threads)
    torch.set_num_threads(args.threads)
    print(f"read bandwidth ({args.threads} threads, torch sum over 1 GiB): {bandwidth:.1f} GB/s", flush=True)
    with torch.inference_mode():
        for name in args.sections:
            for rows in args.rows if name != "embedding" else args.rows[:1]:
                print("\n".join(SECTIONS[name](rows, args.repeat, bandwidth)), flush=True)


if __name__ == "__main__":
    main()
