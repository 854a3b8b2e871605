"""kernelbay `LLM.generate` against transformers' `generate()` on one ~50M-parameter fp32 Llama (CPU).

    .venv/bin/python benchmarks/generate.py [--batches 1 8] [--prompt-len 32] [--new-tokens 128] [--repeat 3]
                                            [--threads N] [--backend NAME] [--write FILE] [--model SHAPE]

Builds a random-weight Llama with transformers (vocab 32000, hidden 512, 6 layers, GQA 8/4 heads,
MLP 1536: 51.7M parameters), saves it as safetensors, loads it in both libraries, and for each batch
size runs greedy decoding of `--new-tokens` tokens after `--prompt-len`-token prompts (end-of-sequence
ignored, so every row generates them all). Runs alternate between the two libraries and the best
of `--repeat` is kept; tokens must be identical. Prints tokens/s and the ratio; `--write FILE`
also writes the table as Markdown. `--model SHAPE` builds another family's shape instead (SHAPES).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

MODEL = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    initializer_range=0.05,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
# --model NAME -> (transformers config class, its arguments): one ~50M random model per family shape.
SHAPES = {
    "llama": ("LlamaConfig", MODEL),
    # Mixtral's layout (every layer MoE, 8 experts, top-2 renormalised) at hidden 512, 7 layers, GQA 8/4 heads,
    # expert width 768, vocab 32000: 104.4M parameters (54.8M active per token).
    "mixtral": (
        "MixtralConfig",
        {**MODEL, "num_hidden_layers": 7, "intermediate_size": 768, "num_local_experts": 8, "num_experts_per_tok": 2},
    ),
    # gemma-3-1b-it's layout scaled down: 12 layers (5 sliding : 1 global, window shorter than the sequences),
    # 4 query heads / 1 KV head of 128, tied embeddings, local/global RoPE bases 1e4 / 1e6: 52.6M parameters.
    "gemma3": (
        "Gemma3TextConfig",
        {
            **MODEL,
            "hidden_size": 512,
            "num_hidden_layers": 12,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 128,
            "query_pre_attn_scalar": 128,
            "sliding_window": 64,
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "tie_word_embeddings": True,
        },
    ),
    # GPT-2's layout (Conv1D projections, learned positions, LayerNorm, gelu_new, tied embeddings) at
    # hidden 512, 10 layers, 8 heads, MLP 4 x 512, vocab 32000: 48.4M parameters.
    "gpt2": (
        "GPT2Config",
        dict(vocab_size=32000, n_embd=512, n_layer=10, n_head=8, n_positions=1024, bos_token_id=1, eos_token_id=2),
    ),
}


def build_checkpoint(folder: Path, shape: str = "llama") -> int:
    """Save the random fp32 model of SHAPES[shape] in `folder`; returns its parameter count."""
    import transformers

    config_class, kwargs = SHAPES[shape]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**kwargs))
    model = model.float().eval()
    model.save_pretrained(str(folder))
    return sum(p.numel() for p in model.parameters())


def make_prompts(batch: int, length: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(3, MODEL["vocab_size"], (batch, length), generator=gen).tolist()


class HFRunner:
    name = "transformers"

    def __init__(self, folder: Path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        ids = torch.tensor(prompts)
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        return out[:, ids.shape[1] :].tolist()


class KernelbayRunner:
    name = "kernelbay"

    def __init__(self, folder: Path, backend: str | None, prepack: str):
        from kernelbay_engine import LLM

        self.llm = LLM(
            folder,
            attention_backend=backend,
            max_num_seqs=8,
            kv_cache_memory="256MiB",
            progress=False,
            prepack_weights=prepack,
        )

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        from kernelbay_engine import SamplingParams

        params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
        return [o.token_ids for o in self.llm.generate(prompts, params)]


@dataclass
class Result:
    batch: int
    seconds: dict[str, float]
    new_tokens: int

    def tokens_per_s(self, name: str) -> float:
        return self.batch * self.new_tokens / self.seconds[name]

    @property
    def ratio(self) -> float:
        return self.tokens_per_s("kernelbay") / self.tokens_per_s("transformers")


def timed(runner, prompts, new_tokens) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    tokens = runner.generate(prompts, new_tokens)
    return time.perf_counter() - start, tokens


def measure(runners, batch: int, args) -> Result:
    prompts = make_prompts(batch, args.prompt_len)
    best = {r.name: float("inf") for r in runners}
    outputs = {}
    for _ in range(args.repeat):
        for runner in runners:  # alternate, so both see the same machine load
            seconds, outputs[runner.name] = timed(runner, prompts, args.new_tokens)
            best[runner.name] = min(best[runner.name], seconds)
    check_same(outputs["transformers"], outputs["kernelbay"], batch)
    return Result(batch, best, args.new_tokens)


def check_same(reference: list[list[int]], ours: list[list[int]], batch: int) -> None:
    for row, (a, b) in enumerate(zip(reference, ours, strict=True)):
        if a != b:
            if len(a) == len(b):
                at = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
            else:
                at = min(len(a), len(b))
            raise SystemExit(f"batch {batch} row {row}: tokens differ from transformers at new token {at}")


def table(results: list[Result]) -> str:
    lines = ["| batch | transformers tok/s | kernelbay tok/s | ratio |", "|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r.batch} | {r.tokens_per_s('transformers'):.1f} | {r.tokens_per_s('kernelbay'):.1f} | {r.ratio:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", help="kernelbay attention backend (default: the selector's choice)")
    parser.add_argument(
        "--prepack",
        default="auto",
        choices=("auto", "always", "never"),
        help="kernelbay's prepack_weights policy (default: auto)",
    )
    parser.add_argument("--threads", type=int, help="torch threads for both libraries (default: torch's choice)")
    parser.add_argument("--write", type=Path, help="also write the results as Markdown to this file")
    parser.add_argument("--model", default="llama", choices=sorted(SHAPES), help="model shape (default: llama)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        params = build_checkpoint(Path(tmp), args.model)
        runners = [HFRunner(Path(tmp)), KernelbayRunner(Path(tmp), args.backend, args.prepack)]
        for runner in runners:
            runner.generate(make_prompts(2, args.prompt_len), 4)  # warm-up
        results = [measure(runners, batch, args) for batch in args.batches]
    backend = ", ".join(f"{k}: {v}" for k, v in runners[1].llm.attention_backends.items())
    packed = len(runners[1].llm.prepack_report.packed)
    header = (
        f"{params / 1e6:.1f}M-parameter fp32 {args.model}, greedy, {args.prompt_len}-token prompts, "
        f"{args.new_tokens} new tokens, best of {args.repeat}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {platform.machine()}; kernelbay attention {backend}, "
        f"{packed} linear layers prepacked for oneDNN; "
        f"tokens identical to transformers"
    )
    report = f"{header}\n\n{table(results)}\n"
    print(report)
    if args.write:
        args.write.write_text(report)


if __name__ == "__main__":
    main()
