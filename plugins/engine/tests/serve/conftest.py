"""One server per test session: a tiny Llama with a chat template behind `kernelbay serve`'s app, on a free
loopback port, in a thread of the test process (so tests can compare with the same `LLM`)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from plugins.engine.tests.checkpoints import build_tiny_llama

API_KEY = "test-key"
MODEL = "tiny-chat"
CACHE_BLOCKS = 16
"""The shared server's whole KV cache: 16 blocks of 16 tokens (the context is 512)."""
BYTES_PER_BLOCK = 8192
"""2 layers x (K + V) x 16 tokens x 2 KV heads x 16 dims x 4 bytes (float32)."""
MAX_REQUEST_BYTES = 64 * 1024
CHAT_TEMPLATE = (
    "{% for m in messages %}<bos>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<bos>assistant:{% endif %}"
)


def build_chat_llama(folder: Path) -> Path:
    """The tests' tiny Llama with a 512-token context and a chat template."""
    build_tiny_llama(folder, max_position_embeddings=512)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    return folder


@dataclass
class Served:
    """A running server: its address, the app's LLM, and how to talk to it without the openai client."""

    url: str
    llm: object
    api_key: str | None = API_KEY

    def client(self, **options):
        import openai

        options = {"api_key": self.api_key or "none", "max_retries": 0, **options}
        return openai.OpenAI(base_url=f"{self.url}/v1", **options)

    def post(self, path: str, body: bytes | dict, headers: dict | None = None) -> tuple[int, dict, dict]:
        """(status, JSON body, lower-cased headers) of one POST; errors are answers too."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {"Content-Type": "application/json", **self._auth(), **(headers or {})}
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers=sent, method="POST")
        return _answer(request)

    def get(self, path: str, headers: dict | None = None) -> tuple[int, str, dict]:
        request = urllib.request.Request(f"{self.url}{path}", headers={**self._auth(), **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read().decode(), dict(response.headers)
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(), dict(err.headers)

    def metric(self, name: str, **labels) -> float:
        """One sample of /metrics (0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        _, text, _ = self.get("/metrics")
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return 0.0

    def _auth(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def _answer(request) -> tuple[int, dict, dict]:
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read()), _lower(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), _lower(err.headers)


def _lower(headers) -> dict:
    return {name.lower(): value for name, value in headers.items()}


class ThreadServer:
    """uvicorn serving `app` on 127.0.0.1, a free port, in a daemon thread."""

    def __init__(self, app):
        import uvicorn

        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", ws="none", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="session")
def chat_llama(tmp_path_factory) -> Path:
    return build_chat_llama(tmp_path_factory.mktemp("chat-llama"))


@pytest.fixture(scope="session")
def serve_llm(chat_llama):
    from kernelbay_engine import LLM

    llm = LLM(chat_llama, progress=False, max_num_seqs=16, kv_cache_memory=CACHE_BLOCKS * BYTES_PER_BLOCK)
    assert llm.stats().kv_blocks_total == CACHE_BLOCKS
    return llm


@pytest.fixture(scope="session")
def served(serve_llm):
    """The shared server: API key, 64 KiB bodies, a 16-block cache."""
    from kernelbay_engine.serve import ServeConfig, build_app

    config = ServeConfig(model_name=MODEL, api_key=API_KEY, max_request_bytes=MAX_REQUEST_BYTES)
    with ThreadServer(build_app(serve_llm, config, max_num_seqs=16)) as url:
        yield Served(url, serve_llm)
