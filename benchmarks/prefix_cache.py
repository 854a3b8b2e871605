"""Automatic prefix caching: time to first token and prompt tokens computed, caching on vs off (CPU).

    .venv/bin/python benchmarks/prefix_cache.py [--turns 8] [--requests 32] [--system-len 1000] [--repeat 3]
                                                [--threads N] [--backend NAME] [--write FILE]
    .venv/bin/python benchmarks/prefix_cache.py --serve [--turns 8] [--reply-len 32] [--repeat 3] [--backend NAME]

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

`--serve` runs the chat workload over HTTP instead: the same model folder behind two `kernelbay serve` processes
(default, and `--no-enable-prefix-caching`; each on a free loopback port, benchmarks/serve.py's `Server`), both up
at once and taking turns as above. Each turn is one streaming `/v1/completions` request of the history's token ids
(greedy, `--reply-len` tokens, `ignore_eos`); time to first token is measured by the client, from sending the
request to its first non-empty text; the prompt tokens computed and cache hits come from the differences of the
server's `kernelbay_prefix_cache_queries` and `kernelbay_prefix_cache_hits` on `GET /metrics` around the request
(with caching off, the whole prompt; that server's hits are asserted to be zero). The generated text is asserted
identical with caching on and off in every turn. Only the chat runs over HTTP.
"""

from __future__ import annotations

import argparse
import http.client
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
from serve import Server, free_port, stream_completion

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


# -- over HTTP (--serve) ----------------------------------------------------------------------------------------
SERVED_NAME = "prefix-cache-bench"


@dataclass
class Served:
    """One turn over HTTP: seconds to the first non-empty text, the text, and prompt tokens looked up / found cached."""

    ttft: float
    text: str
    looked_up: int
    found: int

    def computed(self, caching: bool, prompt_len: int) -> int:
        return self.looked_up - self.found if caching else prompt_len


def prefix_counters(port: int) -> tuple[int, int]:
    """(kernelbay_prefix_cache_queries, kernelbay_prefix_cache_hits) from the server's GET /metrics."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/metrics")
    values = {}
    for line in connection.getresponse().read().decode().splitlines():
        name, _, value = line.partition(" ")
        if name in ("kernelbay_prefix_cache_queries", "kernelbay_prefix_cache_hits"):
            values[name] = int(float(value))
    connection.close()
    if len(values) != 2:
        raise RuntimeError(f"GET /metrics on port {port} lacks the kernelbay_prefix_cache_* gauges: {values}")
    return values["kernelbay_prefix_cache_queries"], values["kernelbay_prefix_cache_hits"]


def stream_ids(port: int, prompt: list[int], max_tokens: int) -> tuple[str, float]:
    """(generated text, seconds to its first non-empty text) of one greedy streaming completion of token ids."""
    text, ttft = stream_completion(port, SERVED_NAME, prompt, max_tokens, ignore_eos=True)
    if not text:
        raise RuntimeError(f"POST /v1/completions on port {port} streamed no text")
    return text, ttft


def serve_turn(port: int, prompt: list[int], max_tokens: int) -> Served:
    looked_up, found = prefix_counters(port)
    text, ttft = stream_ids(port, prompt, max_tokens)
    after_looked_up, after_found = prefix_counters(port)
    return Served(ttft, text, after_looked_up - looked_up, after_found - found)


def word_ids(text: str) -> list[int]:
    """Token ids of `save_word_tokenizer`'s text: word `w<i>` is token i."""
    return [int(word[1:]) for word in text.split()]


def serve_chat(ports: dict[bool, int], turns: int, reply_len: int, seed: int) -> dict[bool, list[Served]]:
    """`chat`'s conversation over HTTP: the reply's text, read back as token ids, joins the history."""
    history = random_ids(SYSTEM_TURN, seed=seed)
    results: dict[bool, list[Served]] = {caching: [] for caching in ports}
    for turn in range(turns):
        history = history + random_ids(USER_LEN, seed=seed * 1000 + turn)
        order = sorted(ports, reverse=bool(turn % 2))
        served = {caching: serve_turn(ports[caching], history, reply_len) for caching in order}
        assert served[False].text == served[True].text, f"serve chat turn {turn + 1}: text differs with caching on"
        assert served[False].found == 0, f"serve chat turn {turn + 1}: cache hits with --no-enable-prefix-caching"
        for caching in ports:
            results[caching].append(served[caching])
        reply = word_ids(served[True].text)
        assert len(reply) == reply_len, f"turn {turn + 1}: {reply_len} tokens asked, {served[True].text!r} came"
        history = history + reply
    return results


def serve_command(folder: Path, port: int, caching: bool, args) -> list[str]:
    kernelbay = Path(sys.executable).parent / "kernelbay"
    command = [str(kernelbay), "serve", str(folder), "--port", str(port), "--served-model-name", SERVED_NAME]
    command += ["--kv-cache-memory", "512MiB"]
    if args.backend:
        command += ["--backend", args.backend]
    return command if caching else [*command, "--no-enable-prefix-caching"]


def log_path(caching: bool) -> Path:
    """Where a server's output goes; it outlives the model's temporary folder, for a server that fails to start."""
    return Path(tempfile.gettempdir()) / f"prefix-cache-serve-{'on' if caching else 'off'}.log"


def run_serve(folder: Path, args) -> dict[bool, list[Served]]:
    ports = {caching: free_port() for caching in (False, True)}
    servers = {
        caching: Server(serve_command(folder, port, caching, args), port, log_path(caching))
        for caching, port in ports.items()
    }
    try:
        for server in servers.values():
            server.wait_ready()
        for port in ports.values():
            stream_ids(port, random_ids(16, seed=999), 2)  # warm-up: first-call allocations out of the timings
        runs = [serve_chat(ports, args.turns, args.reply_len, seed=1 + r) for r in range(args.repeat)]
    finally:
        for server in servers.values():
            server.stop()
    return {caching: median_served([run[caching] for run in runs]) for caching in (False, True)}


def median_served(runs: list[list[Served]]) -> list[Served]:
    """Per turn, the run with the median time to first token."""
    return [sorted(turn, key=lambda s: s.ttft)[len(turn) // 2] for turn in zip(*runs, strict=True)]


def serve_table(results: dict[bool, list[Served]], args) -> str:
    off, on = results[False], results[True]
    lines = [
        f"Chat over `kernelbay serve`: {args.turns} turns, history = {SYSTEM_TURN}-token system prompt + "
        f"{USER_LEN}-token user message and {args.reply_len}-token reply per turn, one streaming /v1/completions "
        f"request a turn; client-side time to first token (ms, median of {args.repeat} conversations, the two "
        "servers alternating turn by turn) and prompt tokens computed (from GET /metrics).",
        "",
        "| turn | prompt tokens | TTFT off | TTFT on | computed off | computed on | cache hits on |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    prompt = SYSTEM_TURN
    for turn, (a, b) in enumerate(zip(off, on, strict=True), 1):
        prompt += USER_LEN + (args.reply_len if turn > 1 else 0)
        lines.append(
            f"| {turn} | {prompt} | {a.ttft * 1e3:.0f} | {b.ttft * 1e3:.0f} | {a.computed(False, prompt)} | "
            f"{b.computed(True, prompt)} | {b.found} |"
        )
    lines += [
        "",
        f"Caching on: TTFT at turn {args.turns} = {on[-1].ttft / on[0].ttft:.2f}x turn 1's "
        f"(off: {off[-1].ttft / off[0].ttft:.2f}x).",
    ]
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
    parser.add_argument("--serve", action="store_true", help="the chat workload over two `kernelbay serve` processes")
    parser.add_argument("--reply-len", type=int, default=REPLY_LEN, help="tokens generated a turn with --serve")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        params = build_checkpoint(Path(tmp))
        save_word_tokenizer(Path(tmp))
        body = serve_table(run_serve(Path(tmp), args), args) if args.serve else table(run(Path(tmp), args), args)
    threads = "each server its default torch threads" if args.serve else f"{torch.get_num_threads()} torch threads"
    head = (
        f"{params / 1e6:.1f}M-parameter fp32 Llama, {threads}, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}; {'text' if args.serve else 'tokens'} identical with caching on and off."
    )
    text = head + "\n\n" + body
    print(text)
    if args.write:
        args.write.write_text(text + "\n")


if __name__ == "__main__":
    main()
