"""Tensor parallelism on this machine's CPUs: per-rank peak RSS and weight bytes, and step times, at TP=1 and TP=2.

    .venv/bin/python benchmarks/tensor_parallel.py [--folder DIR] [--new-tokens 32] [--write FILE] [--gguf Q8_0]

Builds (once, in --folder) a random-weight fp32 Llama of ~207M parameters (vocab 32000, hidden 1024, 12 layers, GQA
16/8 heads, MLP 2816), then runs each configuration in a fresh process, so every peak RSS is that configuration's
alone: TP=1 on 2 threads (the whole machine), TP=1 on 1 thread, and TP=2 (two ranks, one thread each, gloo). Each
loads the model, prefills one 256-token prompt, then decodes --new-tokens greedy tokens for 1 and for 8 prompts of
32 tokens; the tokens of every configuration must be identical. Peak RSS: the driver's own (getrusage SELF) and the
worker's (getrusage CHILDREN once it has exited).

`--gguf TYPE` (Q8_0 or Q4_0: blocks of 32, which every share of this model keeps whole) runs the same model written
as a GGUF file of that type (once, in --folder, with the converter's layout: tests' `write_gguf`), on its own codes.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MODEL = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=8,
    max_position_embeddings=1024,
    initializer_range=0.05,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
CONFIGS = [("TP=1, 2 threads", 1, 2), ("TP=1, 1 thread", 1, 1), ("TP=2, 1 thread per rank", 2, 1)]


def build(folder: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (folder / "model.safetensors").exists():
        return folder
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**MODEL)).to(torch.float32).save_pretrained(str(folder))
    return folder


def build_gguf(folder: Path, qtype: str) -> Path:
    """The model of `folder` as a GGUF file of `qtype`, written once beside it."""
    path = folder / f"model-{qtype}.gguf"
    if path.exists():
        return path
    import torch
    from gguf import GGMLQuantizationType
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(ROOT))
    from plugins.gguf.tests._write import write_gguf

    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return write_gguf(path, model, "llama", qtype=GGMLQuantizationType[qtype])


def child(folder: str, tp: int, threads: int, new_tokens: int) -> dict:
    """One configuration, measured in this (fresh) process."""
    import torch

    from kernelbay_engine import LLM, SamplingParams
    from kernelbay_engine.distributed.sharding import weight_bytes
    from kernelbay_engine.models.auto import AutoModelForCausalLM

    torch.set_num_threads(threads)
    start = time.perf_counter()
    llm = LLM(folder, tensor_parallel_size=tp, progress=False, max_num_seqs=8, kv_cache_memory="256MiB")
    load_s = time.perf_counter() - start
    if tp > 1:
        ranks = [(r.weight_bytes, r.sharded_weight_bytes) for r in llm.runner.reports]
    elif folder.endswith(".gguf"):  # the file's codes, as the kernels hold them
        ranks = [(weight_bytes(llm.model), 0)]
    else:  # counted on meta: prepacked layers hold their weights outside the parameters
        ranks = [(weight_bytes(AutoModelForCausalLM.from_config(llm.config), meta=True), 0)]
    prefill = _timed(llm, [list(range(3, 259))], SamplingParams(max_tokens=1, temperature=0))
    greedy = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    decode = {}
    tokens = {}
    for batch in (1, 8):
        prompts = [[3 + (7 * i + j) % 1000 for j in range(32)] for i in range(batch)]
        _timed(llm, prompts, greedy)  # warm-up
        seconds, steps, out = _steps(llm, prompts, greedy)
        decode[batch] = 1000 * seconds / steps
        tokens[batch] = [o.token_ids for o in out]
    if tp > 1:
        llm.runner.shutdown()
    return {
        "load_s": load_s,
        "ranks": ranks,
        "prefill_ms": 1000 * prefill,
        "step_ms": decode,
        "tokens": tokens,
        "driver_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "worker_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 if tp > 1 else None,
    }


def _timed(llm, prompts, params) -> float:
    start = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - start


def _steps(llm, prompts, params):
    """(seconds, engine steps, outputs) of one generate call (its prefill step included)."""
    steps = llm.runner.steps
    start = time.perf_counter()
    out = llm.generate(prompts, params)
    return time.perf_counter() - start, llm.runner.steps - steps, out


def table(results: dict) -> str:
    mib = 2**20
    lines = [
        "| configuration | load s | weights per rank (sharded) MiB | peak RSS per rank MiB | prefill 256 tok ms "
        "| step ms, batch 1 | step ms, batch 8 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        weights = " / ".join(f"{w / mib:.0f} ({s / mib:.0f})" if s else f"{w / mib:.0f}" for w, s in r["ranks"])
        rss = f"{r['driver_rss'] / mib:.0f}" + (f" / {r['worker_rss'] / mib:.0f}" if r["worker_rss"] else "")
        lines.append(
            f"| {name} | {r['load_s']:.1f} | {weights} | {rss} | {r['prefill_ms']:.0f} "
            f"| {r['step_ms']['1']:.1f} | {r['step_ms']['8']:.1f} |"
        )
    return "\n".join(lines)


def agreement(results: dict) -> str:
    """Per configuration, the greedy tokens equal to the first configuration's before their first difference."""
    reference = next(iter(results.values()))["tokens"]
    lines = []
    for name, r in results.items():
        for batch, sequences in r["tokens"].items():
            same = [_common_prefix(a, b) for a, b in zip(sequences, reference[batch], strict=True)]
            lines.append(f"{name}, batch {batch}: tokens equal before the first difference: {same}")
    return "\n".join(lines)


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=Path(tempfile.gettempdir()) / "kernelbay-tp-bench-207m")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--write", type=Path)
    parser.add_argument("--gguf", choices=["Q8_0", "Q4_0"], help="run the model written as a GGUF file of this type")
    parser.add_argument("--child", nargs=2, type=int, metavar=("TP", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = build(args.folder) if args.child is None else args.folder
    if args.gguf:
        model = build_gguf(args.folder, args.gguf)
    if args.child:
        print(json.dumps(child(str(model), *args.child, args.new_tokens)))
        return
    results = {}
    for name, tp, threads in CONFIGS:
        command = [sys.executable, __file__, "--folder", str(args.folder), "--new-tokens", str(args.new_tokens)]
        command += ["--gguf", args.gguf] if args.gguf else []
        done = subprocess.run([*command, "--child", str(tp), str(threads)], capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name}: done", file=sys.stderr)
    reference = next(iter(results.values()))["tokens"]
    if any(r["tokens"] != reference for r in results.values()):
        if not args.gguf:  # float32: the same products, in another order only across ranks
            sys.exit("the configurations generated different tokens")
        print(agreement(results), file=sys.stderr)
    text = table(results)
    print(text)
    if args.write:
        args.write.write_text(text + "\n")


if __name__ == "__main__":
    main()
