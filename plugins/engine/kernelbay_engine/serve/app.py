"""The FastAPI application: OpenAI's /v1/models, /v1/completions and /v1/chat/completions, /health and /metrics,
in front of one `LLM`."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from dataclasses import dataclass

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, format_sse_event
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kernelbay_engine.serve import errors
from kernelbay_engine.serve.convert import (
    ChatRenderer,
    CompletionRenderer,
    SequenceOutput,
    Work,
    chat_work,
    check_common,
    completion_work,
    usage,
)
from kernelbay_engine.serve.engine import AsyncEngine, EngineStream
from kernelbay_engine.serve.errors import APIError
from kernelbay_engine.serve.metrics import ServeMetrics
from kernelbay_engine.serve.middleware import BodyLimit, StatusCounter
from kernelbay_engine.serve.protocol import ChatCompletionRequest, CompletionRequest


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """How the server answers, beside the engine's own options."""

    model_name: str
    """The name /v1/models lists and requests must use (or leave out)."""
    api_key: str | None = None
    """When set, /v1/* needs `Authorization: Bearer <api_key>` (else 401)."""
    max_queued: int = 256
    """Sequences that may wait beyond the engine's batch (max_num_seqs); past that, 503 with Retry-After."""
    max_request_bytes: int = 4 * 1024 * 1024
    """Largest request body; past it, 413."""
    shutdown_timeout: float = 30.0
    """Seconds SIGTERM waits for running requests before aborting them."""


class _Server:
    """What the routes share: the engine bridge, the metrics and the config."""

    def __init__(self, llm, config: ServeConfig, max_num_seqs: int):
        self.llm, self.config = llm, config
        self.engine = AsyncEngine(llm, capacity=max_num_seqs + config.max_queued)
        self.metrics = ServeMetrics(llm, lambda: self.engine.in_flight)
        self.created = int(time.time())

    async def run(self, request: Request, work: Work, renderer, stream: bool, include_usage: bool) -> Response:
        """Admit, start and answer one request (a 4xx before anything is sent if the engine refuses it)."""
        release = self.engine.admit(len(work.params))
        deltas = self.engine.stream(work.sequences, work.params)
        timer = _Timer(self.metrics, work)
        try:
            first = await deltas.__anext__()
        except BaseException:
            deltas.close()
            release()
            raise
        timer.token(first)
        if stream:
            events = self._events(renderer, work, _Tokens(first, deltas, timer), include_usage, release)
            return EventSourceResponse(events, headers={"Cache-Control": "no-cache"})
        try:
            outputs = await _unless_disconnected(request, _collect(work, _Tokens(first, deltas, timer)))
        finally:
            deltas.close()
            release()
        if outputs is None:  # the client left; its requests were aborted
            return Response(status_code=499)
        return JSONResponse(renderer.response(outputs))

    async def _events(self, renderer, work: Work, tokens: _Tokens, include_usage: bool, release):
        """SSE: one chunk per delta, the usage chunk if asked, then `[DONE]`; leaving early aborts the requests."""
        seen: set[int] = set()
        try:
            if isinstance(renderer, ChatRenderer):
                yield format_sse_event(data_str=_json(renderer.role_chunk()))
            async for delta in tokens:
                chunk = renderer.delta_chunk(delta, delta.index not in seen)
                seen.add(delta.index)
                if chunk is not None:
                    yield format_sse_event(data_str=_json(chunk))
            if include_usage:
                yield format_sse_event(data_str=_json({**renderer.chunk([]), "usage": usage(work, tokens.count)}))
        except Exception as err:  # noqa: BLE001 - the status is sent: the error goes in the stream, as OpenAI does
            yield format_sse_event(data_str=_json(errors.from_engine(err).body()))
        finally:
            tokens.deltas.close()
            release()
        yield format_sse_event(data_str="[DONE]")


class _Timer:
    """Records one request's tokens, time to first token, inter-token and request latency."""

    def __init__(self, metrics: ServeMetrics, work: Work):
        self.metrics, self.work = metrics, work
        self.start = time.perf_counter()
        self.last: dict[int, float] = {}
        metrics.prompt_tokens.inc(work.prompt_tokens)

    def token(self, delta) -> None:
        now = time.perf_counter()
        previous = self.last.get(delta.index)
        if previous is None:
            self.metrics.time_to_first_token.observe(now - self.start)
        else:
            self.metrics.inter_token_latency.observe(now - previous)
        self.last[delta.index] = now
        if self.work.generates:
            self.metrics.generation_tokens.inc()

    def done(self) -> None:
        self.metrics.request_latency.observe(time.perf_counter() - self.start)


class _Tokens:
    """The first delta, then the rest, each timed; `count` says how many came."""

    def __init__(self, first, deltas: EngineStream, timer: _Timer):
        self.first, self.deltas, self.timer = first, deltas, timer
        self.count = 0

    async def __aiter__(self):
        self.count = 1
        yield self.first
        async for delta in self.deltas:
            self.timer.token(delta)
            self.count += 1
            yield delta
        self.timer.done()


async def _collect(work: Work, tokens: _Tokens) -> list[SequenceOutput]:
    outputs = [SequenceOutput() for _ in work.params]
    async for delta in tokens:
        outputs[delta.index].add(delta)
    return outputs


async def _unless_disconnected(request: Request, work):
    """`work`'s result, or None (work cancelled, so its requests are aborted) once the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        return await task
    return None


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _json(payload: dict) -> str:
    import json

    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def build_app(llm, config: ServeConfig, *, max_num_seqs: int) -> FastAPI:
    """The application serving `llm` (its batch holds `max_num_seqs` sequences; `config.max_queued` more wait)."""
    server = _Server(llm, config, max_num_seqs)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        server.engine.stop_accepting()
        await asyncio.to_thread(server.engine.join_workers, config.shutdown_timeout)

    app = FastAPI(
        title="kernelbay",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.server = server
    errors.install(app)
    app.add_middleware(BodyLimit, limit=config.max_request_bytes)
    app.add_middleware(StatusCounter, counter=server.metrics.requests)  # outermost: counts the 413s too
    _routes(app, server)
    return app


def _routes(app: FastAPI, server: _Server) -> None:
    config, llm = server.config, server.llm
    authorized = Depends(_authorization(config.api_key))

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[authorized])
    async def models() -> dict:
        card = {
            "id": config.model_name,
            "object": "model",
            "created": server.created,
            "owned_by": "kernelbay",
            "max_model_len": llm.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions", dependencies=[authorized])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_common(body, config.model_name)
        work = completion_work(body, llm)
        header = _header("cmpl", "text_completion", config.model_name)
        renderer = CompletionRenderer(work, llm.tokenizer, header, body)
        return await server.run(request, work, renderer, body.stream, _include_usage(body))

    @app.post("/v1/chat/completions", dependencies=[authorized])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_common(body, config.model_name)
        work = chat_work(body, llm)
        kind = "chat.completion.chunk" if body.stream else "chat.completion"
        renderer = ChatRenderer(work, llm.tokenizer, _header("chatcmpl", kind, config.model_name), body)
        return await server.run(request, work, renderer, body.stream, _include_usage(body))


def _include_usage(body) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _header(prefix: str, kind: str, model: str) -> dict:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}


def _authorization(api_key: str | None):
    """The dependency that checks `Authorization: Bearer <key>` (nothing when no key is set)."""

    async def check(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise APIError(
                401,
                "a valid API key is required: send the header 'Authorization: Bearer <key>' with the server's "
                "--api-key",
                type="invalid_request_error",
                code="invalid_api_key",
            )

    return check
