"""Automatic prefix caching: time to first token and prompt tokens computed, caching on vs off (CPU).

    .venv/bin/python benchmarks/prefix_cache.py [--turns 8] [--requests 32] [--system-len 1000] [--repeat 3]
                                                [--threads N] [--backend NAME] [--write FILE]

On the random-weight ~50M-parameter fp32 Llama of benchmarks/generate.py (vocab 32000, hidden 512, 6 layers), two
workloads run twice, on one `LLM` with `enable_prefix_caching=True` and one with it off:

- chat: `--turns` turns of a conversation, each sending the whole history (a 128-token system prompt, then per
  turn a 64-token user message and the 32-token reply the model gave): time to first token (`LLM.stream`'s first
  delta) and prompt tokens computed per turn, the median of `--repeat` different conversations, the two engines
  taking turns so that both see the same load;
- shared system prompt: `--requests` requests of a `--system-len`-token system prompt plus a 32-token question each,
  submitted at once (one `LLM.stream` call): mean and p50 time to first token, prompt tokens computed in all, and
  the time until every request has its first token.

Greedy decoding; each workload's tokens are asserted identical with caching on and off. Prompt tokens computed are
the tokens looked up minus the ones found cached (`LLM.stats()`). Prints a Markdown table; `--write FILE` also
writes it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import MODEL, build_checkpoint

SYSTEM_TURN, USER_LEN, REPLY_LEN = 128, 64, 32


@dataclass
class Timed:
    """One call's first-token times (seconds from submission, per prompt), tokens and prompt tokens computed."""

    ttft: list[float]
    tokens: list[list[int]]
    computed: int
    wall: float


def save_word_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over the model's whole vocabulary (`LLM.stream` decodes each token as it comes)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(MODEL["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2")
    fast.save_pretrained(str(folder))


def random_ids(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, MODEL["vocab_size"], (n,), generator=gen).tolist()


def stream_timed(llm, prompts: list[list[int]], max_tokens: int) -> Timed:
    """Stream `prompts` as one call; record when each prompt's first token arrives."""
    from kernelbay_engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    stats = llm.stats()
    looked_up, found = stats.prefix_cache_queries, stats.prefix_cache_hits
    tokens: list[list[int]] = [[] for _ in prompts]
    first: list[float | None] = [None] * len(prompts)
    start = time.perf_counter()
    for delta in llm.stream(prompts, params):
        if first[delta.index] is None:
            first[delta.index] = time.perf_counter() - start
        tokens[delta.index].append(delta.token_id)
    wall = time.perf_counter() - start
    stats = llm.stats()
    computed = _computed(llm, prompts, stats.prefix_cache_queries - looked_up, stats.prefix_cache_hits - found)
    return Timed([t or 0.0 for t in first], tokens, computed, wall)


def _computed(llm, prompts, looked_up: int, found: int) -> int:
    """Prompt tokens fed to the model: every token looked up but not found (all of them with caching off)."""
    return looked_up - found if llm.prefix_caching.enabled else sum(map(len, prompts))


def chat(llms: dict[bool, object], turns: int, seed: int) -> dict[bool, list[Timed]]:
    """One conversation on both engines, turn by turn (alternating which goes first, so both see the machine's load
    alike): each turn sends the whole history plus a new user message; the reply joins the history."""
    history = random_ids(SYSTEM_TURN, seed=seed)
    results: dict[bool, list[Timed]] = {caching: [] for caching in llms}
    for turn in range(turns):
        history = history + random_ids(USER_LEN, seed=seed * 1000 + turn)
        order = sorted(llms, reverse=bool(turn % 2))
        timed = {caching: stream_timed(llms[caching], [history], REPLY_LEN) for caching in order}
        assert timed[False].tokens == timed[True].tokens, f"chat turn {turn + 1}: tokens differ with caching on"
        for caching in llms:
            results[caching].append(timed[caching])
        history = history + timed[True].tokens[0]
    return results


def median_turns(runs: list[dict[bool, list[Timed]]]) -> dict[bool, list[Timed]]:
    """Per engine and turn, the run with the median time to first token."""
    out: dict[bool, list[Timed]] = {}
    for caching in (False, True):
        by_turn = zip(*(run[caching] for run in runs), strict=True)
        out[caching] = [sorted(turn, key=lambda t: t.ttft[0])[len(turn) // 2] for turn in by_turn]
    return out


def shared_system(llm, requests: int, system_len: int) -> Timed:
    system = random_ids(system_len, seed=-1)  # no conversation's seed: nothing of it is cached before
    return stream_timed(llm, [system + random_ids(32, seed=-2 - i) for i in range(requests)], 8)


def make_llm(folder: Path, caching: bool, backend: str | None, requests: int):
    from kernelbay_engine import LLM

    return LLM(
        folder,
        progress=False,
        attention_backend=backend,
        max_num_seqs=requests,
        kv_cache_memory="512MiB",
        enable_prefix_caching=caching,
    )


def run(folder: Path, args) -> dict[bool, tuple[list[Timed], Timed]]:
    llms = {caching: make_llm(folder, caching, args.backend, args.requests) for caching in (False, True)}
    for llm in llms.values():
        stream_timed(llm, [random_ids(16, seed=999)], 2)  # warm-up: first-call allocations out of the timings
    chats = median_turns([chat(llms, args.turns, seed=1 + r) for r in range(args.repeat)])  # distinct conversations
    shared = {caching: shared_system(llm, args.requests, args.system_len) for caching, llm in llms.items()}
    assert shared[False].tokens == shared[True].tokens, "shared system prompt: tokens differ with caching on"
    return {caching: (chats[caching], shared[caching]) for caching in llms}


def table(results, args) -> str:
    off, on = results[False], results[True]
    lines = [
        f"Chat: {args.turns} turns, history = {SYSTEM_TURN}-token system prompt + {USER_LEN}-token user message and "
        f"{REPLY_LEN}-token reply per turn; time to first token (ms, median of {args.repeat} conversations, the two "
        "engines alternating turn by turn) and prompt tokens computed.",
        "",
        "| turn | prompt tokens | TTFT off | TTFT on | computed off | computed on |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    prompt = SYSTEM_TURN
    for turn, (a, b) in enumerate(zip(off[0], on[0], strict=True), 1):
        prompt += USER_LEN + (REPLY_LEN if turn > 1 else 0)
        lines.append(
            f"| {turn} | {prompt} | {a.ttft[0] * 1e3:.0f} | {b.ttft[0] * 1e3:.0f} | {a.computed} | {b.computed} |"
        )
    first, last = on[0][0].ttft[0], on[0][-1].ttft[0]
    lines += [
        "",
        f"Caching on: TTFT at turn {args.turns} = {last / first:.2f}x turn 1's "
        f"(off: {off[0][-1].ttft[0] / off[0][0].ttft[0]:.2f}x).",
        "",
        f"Shared system prompt: {args.requests} requests of a {args.system_len}-token system prompt + a 32-token "
        "question, submitted at once, 8 tokens each.",
        "",
        "| caching | mean TTFT (ms) | p50 TTFT (ms) | last first token (ms) | prompt tokens computed | total (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, timed in (("off", off[1]), ("on", on[1])):
        lines.append(
            f"| {name} | {statistics.mean(timed.ttft) * 1e3:.0f} | {statistics.median(timed.ttft) * 1e3:.0f} | "
            f"{max(timed.ttft) * 1e3:.0f} | {timed.computed:,} | {timed.wall:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--system-len", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3, help="conversations run; each turn's median is shown")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--backend", help="attention backend (default: the first capable one)")
    parser.add_argument("--write", type=Path, help="also write the Markdown table to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        params = build_checkpoint(Path(tmp))
        save_word_tokenizer(Path(tmp))
        results = run(Path(tmp), args)
    head = (
        f"{params / 1e6:.1f}M-parameter fp32 Llama, {torch.get_num_threads()} torch threads, "
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}; tokens identical with caching on "
        "and off."
    )
    text = head + "\n\n" + table(results, args)
    print(text)
    if args.write:
        args.write.write_text(text + "\n")


if __name__ == "__main__":
    main()
