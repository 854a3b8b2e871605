"""Bad input never gives a 500 nor disturbs other requests: each is an OpenAI-shaped error with its status."""

from __future__ import annotations

import http.client
import json
import socket
import time
from urllib.parse import urlsplit

import pytest

from .conftest import MAX_REQUEST_BYTES, MODEL, ThreadServer

LONG = "the quick brown fox " * 200  # ~800 tokens: past the 512-token context

COMPLETION_ERRORS = [
    # (what, body, status, param, code)
    ("wrong type", {"prompt": "the", "max_tokens": "5"}, 400, "max_tokens", "invalid_value"),
    ("bool is not an int", {"prompt": "the", "n": True}, 400, "n", "invalid_value"),
    ("temperature above 2", {"prompt": "the", "temperature": 3}, 400, "temperature", "invalid_value"),
    ("negative temperature", {"prompt": "the", "temperature": -1}, 400, "temperature", "invalid_value"),
    ("temperature too small", {"prompt": "the", "temperature": 1e-7}, 400, None, "invalid_sampling_parameter"),
    ("top_p 0", {"prompt": "the", "top_p": 0}, 400, "top_p", "invalid_value"),
    ("n 0", {"prompt": "the", "n": 0}, 400, "n", "invalid_value"),
    ("negative seed", {"prompt": "the", "seed": -1}, 400, "seed", "invalid_value"),
    ("too many logprobs", {"prompt": "the", "logprobs": 21}, 400, "logprobs", "invalid_value"),
    ("missing prompt", {"max_tokens": 3}, 400, "prompt", "invalid_value"),
    ("empty prompt list", {"prompt": []}, 400, "prompt", None),
    ("empty prompt", {"prompt": ""}, 400, None, "invalid_input"),
    ("token id outside the vocabulary", {"prompt": [5, 99999]}, 400, None, "invalid_input"),
    ("unknown model", {"prompt": "the", "model": "gpt-9"}, 404, "model", "model_not_found"),
    ("prompt longer than the context", {"prompt": LONG}, 400, "prompt", "context_length_exceeded"),
    ("max_tokens past the context", {"prompt": "the", "max_tokens": 600}, 400, "max_tokens", "context_length_exceeded"),
    ("never fits the KV cache", {"prompt": "the", "max_tokens": 400}, 400, "max_tokens", "request_too_large"),
    ("max_tokens 0 without echo", {"prompt": "the", "max_tokens": 0}, 400, "max_tokens", None),
    ("unknown parameter", {"prompt": "the", "frobnicate": 1}, 400, "frobnicate", "unsupported_parameter"),
    (
        "unsupported parameter",
        {"prompt": "the", "presence_penalty": 0.5},
        400,
        "presence_penalty",
        "unsupported_parameter",
    ),
    ("stream_options without stream", {"prompt": "the", "stream_options": {}}, 400, "stream_options", None),
    ("streamed, refused before the stream", {"prompt": LONG, "stream": True}, 400, "prompt", "context_length_exceeded"),
]

CHAT_ERRORS = [
    ("no messages", {"messages": []}, 400, "messages", "invalid_value"),
    ("unknown role", {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role", "invalid_value"),
    (
        "content not text",
        {"messages": [{"role": "user", "content": 5}]},
        400,
        "messages.0.content.str",
        "invalid_value",
    ),
    (
        "top_logprobs without logprobs",
        {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2},
        400,
        "top_logprobs",
        None,
    ),
    ("tools", {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400, "tools", None),
    (
        "conversation past the context",
        {"messages": [{"role": "user", "content": LONG}], "max_tokens": 4},
        400,
        "messages",
        "context_length_exceeded",
    ),
]


def _check_error(status: int, body: dict, expected_status: int, param, code) -> None:
    assert status == expected_status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and isinstance(error["message"], str)
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error


@pytest.mark.parametrize(
    ("what", "body", "status", "param", "code"), COMPLETION_ERRORS, ids=[e[0] for e in COMPLETION_ERRORS]
)
def test_bad_completion_requests(served, what, body, status, param, code):
    """Each bad completion request: its status and an OpenAI error body naming the parameter."""
    _check_error(*served.post("/v1/completions", body)[:2], status, param, code)


@pytest.mark.parametrize(("what", "body", "status", "param", "code"), CHAT_ERRORS, ids=[e[0] for e in CHAT_ERRORS])
def test_bad_chat_requests(served, what, body, status, param, code):
    """Each bad chat request: its status and an OpenAI error body naming the parameter."""
    _check_error(*served.post("/v1/chat/completions", body)[:2], status, param, code)


def test_invalid_json_and_non_objects(served):
    """Bodies that are not JSON objects are 400s that say so."""
    status, body, _ = served.post("/v1/completions", b'{"prompt": "the",')
    _check_error(status, body, 400, None, "invalid_json")
    status, body, _ = served.post("/v1/completions", b"[1, 2]")
    _check_error(status, body, 400, None, "invalid_value")


def test_oversized_body_is_413(served):
    """A body past the configured limit is refused with 413 before it is parsed."""
    status, body, _ = served.post("/v1/completions", {"prompt": "x" * MAX_REQUEST_BYTES})
    assert status == 413 and set(body["error"]) == {"message", "type", "param", "code"}


def test_unknown_route_is_an_openai_404(served):
    status, body, _ = served.post("/v1/embeddings", {"input": "x"})
    assert status == 404 and body["error"]["type"] == "not_found_error"


def test_wrong_or_missing_api_key_is_401(served):
    """With --api-key, /v1/* needs it; /health and /metrics do not."""
    import openai

    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic test-key"}):
        status, body, _ = served.post("/v1/completions", {"prompt": "the"}, headers=headers)
        _check_error(status, body, 401, None, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        served.client(api_key="wrong").models.list()
    assert served.get("/health")[0] == 200


def test_bad_requests_leave_the_server_well(served):
    """After every kind of bad request, a good one still gets its answer, and no request failed with a 500."""
    done = served.client().completions.create(model=MODEL, prompt="the", max_tokens=3, temperature=0)
    assert done.choices[0].text
    assert served.metric("kernelbay_requests_total", endpoint="/v1/completions", status="500") == 0
    assert served.metric("kernelbay_requests_total", endpoint="/v1/completions", status="400") > 0


def _open_stream(url: str, body: dict, api_key: str | None = "test-key") -> tuple[http.client.HTTPConnection, object]:
    """A streaming request whose first event has arrived; the caller may read on or hang up."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}), headers)
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    return connection, response


def _hang_up(connection: http.client.HTTPConnection) -> None:
    """Close the connection's socket at once (the response's file would otherwise keep it open)."""
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.sock.close()


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_disconnect_mid_stream_frees_the_blocks(served):
    """A client hanging up mid-stream has its request aborted: its blocks are free and it stops generating, and a
    request needing the whole cache then runs."""
    before = served.metric("kernelbay_generation_tokens_total")
    connection, _ = _open_stream(served.url, {"prompt": "the", "max_tokens": 250, "ignore_eos": True})
    assert served.metric("kernelbay_kv_blocks_used") > 0
    _hang_up(connection)
    assert _wait_for(lambda: served.metric("kernelbay_kv_blocks_used") == 0), "the blocks stayed held"
    assert served.metric("kernelbay_requests_running") == 0
    time.sleep(0.2)
    generated = served.metric("kernelbay_generation_tokens_total") - before
    assert generated < 250, "the request ran to its end"
    whole = 16 * 16  # prompt + max_tokens = every block
    ids = served.llm.encode("the")
    done = served.client().completions.create(
        model=MODEL, prompt=ids, max_tokens=whole - len(ids), temperature=0, extra_body={"ignore_eos": True}
    )
    assert done.usage.completion_tokens == whole - len(ids)


def test_disconnect_while_waiting_for_a_whole_answer_aborts_it(served):
    """A non-streamed request whose client hangs up is aborted too: blocks freed, generation stopped."""
    before = served.metric("kernelbay_generation_tokens_total")
    parts = urlsplit(served.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    body = json.dumps({"prompt": "the", "max_tokens": 250, "ignore_eos": True})
    headers = {"Content-Type": "application/json", "Authorization": "Bearer test-key"}
    connection.request("POST", "/v1/completions", body, headers)
    assert _wait_for(lambda: served.metric("kernelbay_generation_tokens_total") > before), "it never started"
    _hang_up(connection)
    assert _wait_for(lambda: served.metric("kernelbay_kv_blocks_used") == 0), "the blocks stayed held"
    time.sleep(0.2)
    assert served.metric("kernelbay_generation_tokens_total") - before < 250, "the request ran to its end"


def test_chunked_body_past_the_limit_is_413(served):
    """A body sent in chunks (no Content-Length) is cut off at the limit with the same 413."""
    parts = urlsplit(served.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    chunks = iter([b'{"prompt": "', b"x" * MAX_REQUEST_BYTES, b'"}'])
    headers = {"Content-Type": "application/json", "Authorization": "Bearer test-key"}
    connection.request("POST", "/v1/completions", chunks, headers, encode_chunked=True)
    response = connection.getresponse()
    body = json.loads(response.read())
    connection.close()
    assert response.status == 413 and body["error"]["code"] == "request_too_large"


def test_full_queue_is_503_with_retry_after(serve_llm):
    """When the running batch and the queue are full, a request gets 503 with Retry-After, and later succeeds."""
    from kernelbay_engine.serve import ServeConfig, build_app

    from .conftest import Served

    app = build_app(serve_llm, ServeConfig(model_name=MODEL, max_queued=0), max_num_seqs=1)
    with ThreadServer(app) as url:
        served = Served(url, serve_llm, api_key=None)
        connection, response = _open_stream(url, {"prompt": "the", "max_tokens": 200, "ignore_eos": True})
        status, body, headers = served.post("/v1/completions", {"prompt": "the", "max_tokens": 2})
        assert status == 503 and headers["retry-after"] == "1"
        assert body["error"]["code"] == "queue_full"
        assert response.read().rstrip().endswith(b"data: [DONE]")
        connection.close()
        assert served.post("/v1/completions", {"prompt": "the", "max_tokens": 2})[0] == 200
