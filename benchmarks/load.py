"""Peak memory and time to load a ~1 GB float32 checkpoint: kernelbay vs transformers, same folder, same run.

    .venv/bin/python benchmarks/load.py [--dir /tmp/kernelbay-load-bench] [--layers 12] [--repeat 2]
                                        [--write benchmarks/RESULTS-load.md]

Writes (once, reused afterwards) a random Llama checkpoint of `--layers` layers at hidden 1024 /
intermediate 4096 / vocab 32000 (12 layers: 1.07 GB of float32 weights) as a single safetensors
file. Then, alternating, loads it `--repeat` times with each loader -- kernelbay (reads every tensor
into place), kernelbay with `mmap=True` (maps 1:1 tensors, reads fused ones) and transformers -- every
load in a fresh subprocess that reports:

- baseline: resident memory once everything but the weights is in place (libraries imported, config
  parsed, the model's code imported), so lazily imported modules do not count as loading cost;
- peak after load: the process's high-water mark (VmHWM) when `from_pretrained` returns, anonymous and
  file-backed pages alike;
- peak after first use: the high-water mark once every weight has been read (a first forward pass
  does that); it differs from the above when weights are memory-mapped and paged in lazily;
- load time: wall time of the `from_pretrained` call alone, and until every weight has been read once.

The target (for the default, copying kernelbay load) is peak <= baseline + 1.3 x weight bytes, and not
above transformers. Reported: medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import torch, transformers
torch.set_num_threads(1)

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

which, folder = sys.argv[1], sys.argv[2]
# Baseline: libraries imported, config parsed, model code imported -- everything but the weights.
if which.startswith("kernelbay"):
    from kernelbay import resolve
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine import AutoModelForCausalLM
    import kernelbay.attention
    resolve("model", ModelConfig.from_pretrained(folder).architecture)
else:
    transformers.AutoConfig.from_pretrained(folder)
    transformers.LlamaForCausalLM
baseline = status("VmRSS")
start = time.perf_counter()
if which.startswith("kernelbay"):
    model = AutoModelForCausalLM.from_pretrained(folder, progress=False, mmap=which == "kernelbay-mmap")
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
seconds = time.perf_counter() - start
peak_load = status("VmHWM")
start = time.perf_counter()
with torch.no_grad():  # first use: every weight read once (maps in lazily loaded pages)
    touched = [float(p.sum()) for p in model.parameters()]  # reduces in place, no copy
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"baseline": baseline, "peak": peak_load, "peak_used": status("VmHWM"), "seconds": seconds,
                  "seconds_used": seconds + time.perf_counter() - start, "weights": weights}))
"""


def make_checkpoint(folder: Path, layers: int) -> None:
    """A random Llama checkpoint, written by transformers in a subprocess (the parent stays small)."""
    if (folder / "model.safetensors").exists():
        return
    script = (
        "import sys, torch, transformers\n"
        "torch.manual_seed(0)\n"
        f"cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=4096,"
        f" num_hidden_layers={layers}, num_attention_heads=16, num_key_value_heads=16)\n"
        "model = transformers.LlamaForCausalLM(cfg).to(torch.float32)\n"
        "model.save_pretrained(sys.argv[1], max_shard_size='100GB')\n"
    )
    subprocess.run([sys.executable, "-c", script, str(folder)], check=True, env=_env())


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def warm_page_cache(folder: Path) -> None:
    """Both loaders then read from the page cache, so neither pays the first disk read."""
    for path in folder.glob("*.safetensors"):
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def measure(which: str, folder: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, which, str(folder)], check=True, capture_output=True, text=True, env=_env()
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def report(results: dict[str, dict], command: str) -> str:
    gib = 2**30
    weights = results["kernelbay"]["weights"]
    rows = [
        "| loader | baseline RSS | peak after load | (peak - baseline) / weights | peak after first use "
        "| (peak - baseline) / weights | load time | load + first use |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        over = [(r[k] - r["baseline"]) / weights for k in ("peak", "peak_used")]
        rows.append(
            f"| {name} | {r['baseline'] / gib:.2f} GiB | {r['peak'] / gib:.2f} GiB | {over[0]:.2f}x "
            f"| {r['peak_used'] / gib:.2f} GiB | {over[1]:.2f}x "
            f"| {r['seconds']:.2f} s | {r['seconds_used']:.2f} s |"
        )
    kb, tf = results["kernelbay"], results["transformers"]
    verdict = (kb["peak_used"] - kb["baseline"]) <= 1.3 * weights and kb["peak_used"] <= tf["peak_used"]
    return "\n".join(
        [
            f"Weights: {weights / gib:.2f} GiB of float32 ({weights / 1e9:.2f} GB).",
            "",
            *rows,
            "",
            f"Load time, kernelbay / transformers: {kb['seconds'] / tf['seconds']:.2f}x "
            f"(load + first use: {kb['seconds_used'] / tf['seconds_used']:.2f}x).",
            f"Peak after first use, kernelbay / transformers: {kb['peak_used'] / tf['peak_used']:.2f}x.",
            f"Target (peak after first use <= baseline + 1.3 x weights, and not above transformers): "
            f"{'met' if verdict else 'NOT met'}.",
            "",
            f"Command: `{command}`",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/kernelbay-load-bench"))
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--write", type=Path, help="also write the report (markdown) to this file")
    args = parser.parse_args()
    make_checkpoint(args.dir, args.layers)
    warm_page_cache(args.dir)
    runs: dict[str, list[dict]] = {"kernelbay": [], "kernelbay-mmap": [], "transformers": []}
    for _ in range(args.repeat):
        for which in runs:
            runs[which].append(measure(which, args.dir))
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    text = report({k: summarize(v) for k, v in runs.items()}, command)
    print(text)
    if args.write:
        args.write.write_text(f"# Checkpoint load: kernelbay vs transformers\n\n{text}\n")


if __name__ == "__main__":
    main()
