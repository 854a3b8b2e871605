"""The transformers fallback (kernelbay-transformers) against the native Llama and against transformers' generate().

    .venv/bin/python benchmarks/fallback.py [--batches 1 8] [--prompt-len 32] [--new-tokens 128] [--repeat 3]
                                            [--threads N]

One random-weight ~50M fp32 Llama (benchmarks/generate.py's: 51.7M parameters), loaded three ways:
transformers `generate()`, kernelbay `LLM` on the native kernelbay-llama family, and kernelbay `LLM`
with `model_impl="transformers"` (transformers' modeling code, attention routed to kernelbay's paged
backend). Greedy decoding, EOS ignored; runs alternate between the three and the best of `--repeat` is
kept; all three must give the same tokens. Targets at batch 8: fallback >= 0.8x native, >= 1.5x transformers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import HFRunner, KernelbayRunner, build_checkpoint, check_same, make_prompts, timed


class NativeRunner(KernelbayRunner):
    name = "native"


class FallbackRunner(KernelbayRunner):
    name = "fallback"

    def __init__(self, folder: Path):
        from kernelbay_engine import LLM

        self.llm = LLM(folder, max_num_seqs=8, kv_cache_memory="256MiB", progress=False, model_impl="transformers")
        assert type(self.llm.model).__name__ == "TransformersForCausalLM"


def measure(runners, batch: int, args) -> dict[str, float]:
    """Best seconds per runner for one batch size; every runner's tokens equal transformers'."""
    prompts = make_prompts(batch, args.prompt_len)
    best = {r.name: float("inf") for r in runners}
    outputs = {}
    for _ in range(args.repeat):
        for runner in runners:  # alternate, so all see the same machine load
            seconds, outputs[runner.name] = timed(runner, prompts, args.new_tokens)
            best[runner.name] = min(best[runner.name], seconds)
    for name in ("native", "fallback"):
        check_same(outputs["transformers"], outputs[name], batch)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        params = build_checkpoint(Path(tmp))
        runners = [HFRunner(Path(tmp)), NativeRunner(Path(tmp), None, "auto"), FallbackRunner(Path(tmp))]
        print(f"Llama {params / 1e6:.1f}M fp32, {torch.get_num_threads()} threads, tokens identical in all three")
        print("| batch | transformers tok/s | native tok/s | fallback tok/s | fallback / native | fallback / transf. |")
        print("|---:|---:|---:|---:|---:|---:|")
        for batch in args.batches:
            best = measure(runners, batch, args)
            tps = {name: batch * args.new_tokens / s for name, s in best.items()}
            print(
                f"| {batch} | {tps['transformers']:.1f} | {tps['native']:.1f} | {tps['fallback']:.1f} "
                f"| {tps['fallback'] / tps['native']:.2f}x | {tps['fallback'] / tps['transformers']:.2f}x |"
            )


if __name__ == "__main__":
    main()
