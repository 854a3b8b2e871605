"""kernelbay's MoE kernels against transformers' MoE block on the same weights (CPU, fp32).

    .venv/bin/python benchmarks/moe.py [--tokens 1 8 256] [--repeat 7] [--threads N] [--write FILE]

A Qwen3-30B-A3B-shaped layer scaled down: 128 experts, top-8 renormalised, hidden 1024, expert width 384
(151M expert parameters, 604 MB in fp32, so every call streams its experts from memory). transformers'
`Qwen3MoeSparseMoeBlock` runs with its two CPU expert implementations, "eager" (a loop with one-hot masks) and
"grouped_mm" (`torch._grouped_mm`, what a transformers model uses by default); kernelbay's `SparseMoE` runs the
same router and weights through TORCH_MOE (the reference) and TORCH_GROUPED_MOE. Each timed call is the whole
block (router + experts), calls alternate between the four and the best of `--repeat` is kept; every output is
checked against transformers' eager one (max |diff| <= 1e-4) before timing. The generation figure is
`benchmarks/generate.py --model mixtral` (a ~100M random Mixtral, same tokens asserted).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

LAYER = dict(num_experts=128, num_experts_per_tok=8, hidden_size=1024, moe_intermediate_size=384)
KERNELS = ("TORCH_MOE", "TORCH_GROUPED_MOE")
TOLERANCE = 1e-4


def transformers_block(implementation: str, seed: int = 0):
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = transformers.Qwen3MoeConfig(**LAYER, norm_topk_prob=True, experts_implementation=implementation)
    torch.manual_seed(seed)
    block = Qwen3MoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 0.1)  # spread routing: most experts get tokens at 256
        block.experts.gate_up_proj.normal_(0.0, 0.02)
        block.experts.down_proj.normal_(0.0, 0.02)
    return block


def kernelbay_layer(block, kernel: str):
    """A kernelbay SparseMoE holding the transformers block's router and expert weights, bound to `kernel`."""
    from kernelbay.moe import MoEGeometry
    from kernelbay.registry import resolve
    from kernelbay_engine.layers.moe import Routing, SparseMoE
    from kernelbay_engine.models.quant import UnquantizedLinearMethod

    e, k, h, i = (LAYER[n] for n in ("num_experts", "num_experts_per_tok", "hidden_size", "moe_intermediate_size"))
    layer = SparseMoE(MoEGeometry(e, k, h, i), Routing(e, k, normalize=True), router_dtype=torch.float32)
    with torch.no_grad():
        layer.gate.weight.copy_(block.gate.weight)
        pairs = (
            (layer.experts.gate_up_proj, block.experts.gate_up_proj),
            (layer.experts.down_proj, block.experts.down_proj),
        )
        for ours, theirs in pairs:
            ours.create_weights(UnquantizedLinearMethod(), torch.float32)
            ours.weight.copy_(theirs)
    backend = resolve("moe_backend", kernel)(layer.geometry)
    layer.bind(backend, backend.prepare_weights(layer.experts.expert_weights()))
    return layer


def measure(runners: dict, tokens: int, repeat: int) -> dict[str, float]:
    x = torch.randn(tokens, LAYER["hidden_size"], generator=torch.Generator().manual_seed(tokens))
    with torch.inference_mode():
        expected = runners["transformers eager"](x)
        for name, run in runners.items():
            diff = (run(x) - expected).abs().max().item()
            if diff > TOLERANCE:
                raise SystemExit(f"{name} at {tokens} tokens: max |diff| {diff:.3g} from transformers > {TOLERANCE}")
        best = dict.fromkeys(runners, float("inf"))
        for _ in range(repeat):
            for name, run in runners.items():  # alternate, so all see the same machine load
                start = time.perf_counter()
                run(x)
                best[name] = min(best[name], time.perf_counter() - start)
    return {name: seconds * 1e3 for name, seconds in best.items()}


def table(results: dict[int, dict[str, float]]) -> str:
    names = list(next(iter(results.values())))
    lines = [
        "| tokens | " + " | ".join(f"{n} ms" for n in names) + " | GROUPED vs tf grouped_mm | GROUPED vs tf eager |",
        "|---:|" + "---:|" * (len(names) + 2),
    ]
    for tokens, ms in results.items():
        ours = ms["TORCH_GROUPED_MOE"]
        cells = " | ".join(f"{ms[n]:.2f}" for n in names)
        ratios = f"{ms['transformers grouped_mm'] / ours:.2f}x | {ms['transformers eager'] / ours:.2f}x"
        lines.append(f"| {tokens} | {cells} | {ratios} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 256])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--write", type=Path, help="also write the results as Markdown to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    eager = transformers_block("eager")
    grouped = transformers_block("grouped_mm")
    grouped.load_state_dict(eager.state_dict())
    runners = {
        "transformers eager": lambda x: eager(x[None])[0],
        "transformers grouped_mm": lambda x: grouped(x[None])[0],
        **{kernel: kernelbay_layer(eager, kernel) for kernel in KERNELS},
    }
    results = {tokens: measure(runners, tokens, args.repeat) for tokens in args.tokens}
    header = (
        f"MoE block, {LAYER['num_experts']} experts top-{LAYER['num_experts_per_tok']}, hidden "
        f"{LAYER['hidden_size']}, expert width {LAYER['moe_intermediate_size']}, fp32, router + experts, best of "
        f"{args.repeat}; torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.machine()}; "
        f"outputs within {TOLERANCE} of transformers"
    )
    report = f"{header}\n\n{table(results)}\n"
    print(report)
    if args.write:
        args.write.write_text(report)


if __name__ == "__main__":
    main()
