"""`kernelbay serve`: the OpenAI HTTP API (completions, chat completions with SSE streaming, models, health,
Prometheus metrics) on one `LLM`, with FastAPI on uvicorn.

    app = build_app(LLM(), ServeConfig(model_name="kernelbay/demo"), max_num_seqs=64)

Modules: `app` (routes and the request flow), `protocol` (the pydantic request bodies), `convert` (requests to
engine work, deltas to responses), `engine` (the asyncio bridge and admission), `errors` (OpenAI error bodies),
`metrics` (Prometheus), `middleware` (body limit, status counts), `cli` (the command)."""

from kernelbay_engine.serve.app import ServeConfig, build_app

__all__ = ["ServeConfig", "build_app"]
