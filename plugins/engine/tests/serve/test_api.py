"""The OpenAI API of `kernelbay serve`, through the official `openai` client: the same tokens as `LLM`."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from kernelbay_engine.sampling import SamplingParams

from .conftest import MODEL

PROMPTS = [
    "the quick brown fox",
    "a fortune cookie says",
    "kernelbay runs models over",
    "continuous batching lets new requests",
    "greedy decoding always picks",
    "the lazy dog",
    "many tests",
    "a paged cache of keys",
]


def _generate(llm, prompt, **params):
    return llm.generate(prompt, SamplingParams(**params))[0]


def test_models_lists_the_served_model(served):
    """GET /v1/models names the served model and its context."""
    models = served.client().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_greedy_completion_equals_generate(served):
    """A greedy completion is LLM.generate's text for the same prompt, with its usage."""
    expected = _generate(served.llm, PROMPTS[0], max_tokens=12, temperature=0)
    done = served.client().completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    assert done.choices[0].text == expected.text
    assert done.choices[0].finish_reason == expected.finish_reason
    assert done.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert done.usage.completion_tokens == len(expected.token_ids)


def test_prompt_batches_and_token_ids(served):
    """A list of prompts, token ids and lists of them: one choice per prompt, in order."""
    llm = served.llm
    ids = [llm.encode(p) for p in PROMPTS[:3]]
    expected = [_generate(llm, p, max_tokens=6, temperature=0).text for p in PROMPTS[:3]]
    client = served.client()
    texts = client.completions.create(model=MODEL, prompt=PROMPTS[:3], max_tokens=6, temperature=0)
    token_lists = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    one_list = client.completions.create(model=MODEL, prompt=ids[1], max_tokens=6, temperature=0)
    assert [c.text for c in texts.choices] == expected
    assert [c.text for c in token_lists.choices] == expected
    assert [c.index for c in token_lists.choices] == [0, 1, 2]
    assert one_list.choices[0].text == expected[1]


def test_streamed_chat_deltas_concatenate_to_the_whole_reply(served):
    """Streamed chat deltas join into the non-streamed reply; include_usage adds the usage chunk."""
    client = served.client()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the quick brown fox"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    expected = served.llm.chat(messages, SamplingParams(max_tokens=20, temperature=0))
    assert whole.choices[0].message.content == expected.text


def test_sse_ends_with_done(served):
    """The wire format: `data: {...}` events, the last one `data: [DONE]`."""
    import urllib.request

    body = json.dumps({"prompt": "the", "max_tokens": 3, "stream": True}).encode()
    request = urllib.request.Request(
        f"{served.url}/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer test-key"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in response.read().decode().splitlines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 2


def test_n_choices_with_a_seed_are_reproducible(served):
    """n > 1 with a seed: choice j samples with seed + j, so it equals a solo request with that seed."""
    client = served.client()
    options = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=10, temperature=1.0, ignore_eos=True)
    both = client.completions.create(n=3, seed=7, extra_body={"ignore_eos": True}, **_without(options, "ignore_eos"))
    again = client.completions.create(n=3, seed=7, extra_body={"ignore_eos": True}, **_without(options, "ignore_eos"))
    solo = [
        client.completions.create(seed=7 + j, extra_body={"ignore_eos": True}, **_without(options, "ignore_eos"))
        for j in range(3)
    ]
    texts = [c.text for c in both.choices]
    assert texts == [c.text for c in again.choices]
    assert texts == [s.choices[0].text for s in solo]
    assert len(set(texts)) > 1
    expected = _generate(served.llm, PROMPTS[1], max_tokens=10, temperature=1.0, seed=8, ignore_eos=True)
    assert texts[1] == expected.text


def _without(options: dict, *names: str) -> dict:
    return {k: v for k, v in options.items() if k not in names}


def test_echo_with_logprobs_scores_the_prompt(served):
    """echo + logprobs with max_tokens=0: the prompt's log-probabilities, as SamplingParams(prompt_logprobs=k)."""
    llm = served.llm
    prompt = PROMPTS[2]
    expected = _generate(llm, prompt, max_tokens=1, temperature=0, prompt_logprobs=2).prompt_logprobs
    ids = llm.encode(prompt)
    done = served.client().completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=2)
    choice = done.choices[0]
    assert choice.text == prompt
    assert done.usage.completion_tokens == 0
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(
        [e[t] for e, t in zip(expected[1:], ids[1:], strict=True)]
    )
    for top, entry in zip(
        choice.logprobs.top_logprobs[1:], expected[1:], strict=True
    ):  # ids that print alike share a key
        assert all(any(v == pytest.approx(x) for x in entry.values()) for v in top.values())
    assert len(choice.logprobs.tokens) == len(ids)


def test_completion_logprobs_are_the_generated_tokens(served):
    """logprobs=k on a completion: one entry per generated token, the engine's values; echo puts the prompt's first."""
    llm = served.llm
    expected = _generate(llm, PROMPTS[3], max_tokens=5, temperature=0, logprobs=3)
    client = served.client()
    done = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=5, temperature=0, logprobs=3)
    values = done.choices[0].logprobs.token_logprobs
    # The served request finds the prompt's first block in the prefix cache, so its last prompt token attends as a
    # short row after cached keys rather than within one prompt call: float32 rounding apart, not bit for bit.
    want = [e[t] for e, t in zip(expected.logprobs, expected.token_ids, strict=True)]
    assert values == pytest.approx(want, rel=1e-5)
    echoed = client.completions.create(
        model=MODEL, prompt=PROMPTS[3], max_tokens=5, temperature=0, logprobs=3, echo=True
    )
    prompt_len = len(expected.prompt_token_ids)
    assert echoed.choices[0].text == PROMPTS[3] + expected.text
    assert echoed.choices[0].logprobs.token_logprobs[prompt_len:] == pytest.approx(want, rel=1e-5)  # as above


def test_chat_logprobs(served):
    """Chat logprobs: one entry per token with top_logprobs alternatives, values from the engine."""
    messages = [{"role": "user", "content": "greedy decoding"}]
    expected = served.llm.chat(messages, SamplingParams(max_tokens=6, temperature=0, logprobs=2))
    done = served.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = done.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(
        [e[t] for e, t in zip(expected.logprobs, expected.token_ids, strict=True)]
    )
    assert all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob for c in content)


def test_streamed_logprobs_equal_whole(served):
    """A streamed completion carries each token's logprobs, the same as the whole response."""
    client = served.client()
    options = dict(model=MODEL, prompt=PROMPTS[4], max_tokens=6, temperature=0, logprobs=1)
    whole = client.completions.create(**options).choices[0].logprobs.token_logprobs
    chunks = list(client.completions.create(stream=True, **options))
    streamed = [v for c in chunks for v in (c.choices[0].logprobs.token_logprobs if c.choices[0].logprobs else [])]
    assert streamed == pytest.approx(whole)


def test_32_concurrent_clients_get_their_solo_answers(served):
    """32 clients at once (streaming and not, through a 16-block cache) get exactly their solo greedy answers."""
    llm = served.llm
    prompts = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(32)]
    solo = {p: _generate(llm, p, max_tokens=8, temperature=0, ignore_eos=True).text for p in set(prompts)}
    client = served.client()

    def ask(i: int) -> str:
        options = dict(model=MODEL, prompt=prompts[i], max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        if i % 2:
            return client.completions.create(**options).choices[0].text
        return "".join(c.choices[0].text for c in client.completions.create(stream=True, **options))

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, range(32)))
    assert answers == [solo[p] for p in prompts]


def test_metrics_report_tokens_latencies_and_the_cache(served):
    """/metrics: requests by status, tokens, TTFT and inter-token histograms, running/waiting, KV blocks."""
    served.client().completions.create(model=MODEL, prompt="the lazy", max_tokens=4, temperature=0)
    assert served.metric("kernelbay_requests_total", endpoint="/v1/completions", status="200") >= 1
    assert served.metric("kernelbay_prompt_tokens_total") > 0
    assert served.metric("kernelbay_generation_tokens_total") >= 4
    assert served.metric("kernelbay_time_to_first_token_seconds_count") >= 1
    assert served.metric("kernelbay_inter_token_latency_seconds_count") >= 3
    assert served.metric("kernelbay_kv_blocks_capacity") == 16
    assert served.metric("kernelbay_requests_running") == 0
    assert served.metric("kernelbay_requests_waiting") == 0
    assert served.metric("kernelbay_kv_blocks_used") == 0
    assert served.metric("kernelbay_prefix_cache_queries") >= served.metric("kernelbay_prefix_cache_hits") > 0
