"""LLM.generate against transformers' generate() on one checkpoint, plus batching, preemption, streaming."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from kernelbay.errors import IncapableBackend
from kernelbay.registry import names
from kernelbay_engine import LLM
from kernelbay_engine.errors import PromptTooLong, RequestTooLarge
from kernelbay_engine.sampling import SamplingParams
from kernelbay_engine.scheduler import Scheduler
from kernelbay_engine.tokenizer import TokenizerError

PROMPTS = [
    "the",
    "the quick brown fox",
    "a fortune cookie says you will write many tests and kernelbay runs models over a paged cache",
    "greedy decoding always picks",
    "continuous batching lets new requests join while others decode, and the lazy dog sleeps",
]
MAX_TOKENS = 24
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)


@pytest.fixture(scope="session")
def prompt_ids(make_llm):
    ids = [make_llm().encode(p) for p in PROMPTS]
    assert max(len(i) for i in ids) + MAX_TOKENS <= 128, "prompts must leave room in the tiny model's context"
    return ids


@pytest.fixture(scope="session")
def reference(hf_tiny_llama, prompt_ids):
    """transformers' greedy tokens for each prompt, run alone (no padding)."""
    out = []
    for ids in prompt_ids:
        x = torch.tensor([ids])
        with torch.no_grad():
            y = hf_tiny_llama.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0
            )
        out.append(y[0, len(ids) :].tolist())
    return out


def _backends():
    """Every installed backend; FLEX compiles flex_attention per shape, which takes a while on CPU."""
    return [pytest.param(b, marks=pytest.mark.slow) if b == "FLEX" else b for b in names("attention_backend")]


@pytest.mark.parametrize("backend", _backends())
def test_greedy_matches_transformers_on_every_backend(backend, make_llm, prompt_ids, reference, tiny_llama):
    """A batch of mixed-length prompts: greedy tokens equal transformers' on each backend that can run it."""
    try:
        llm = make_llm(attention_backend=backend)
    except IncapableBackend as err:
        pytest.skip(f"{backend} cannot run this model: {err}")
    outputs = llm.generate(prompt_ids, GREEDY)
    assert llm.attention_backends == {"full_attention": backend}
    for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        assert out.token_ids == ref, f"[{backend}] prompt {i}"


def test_text_prompts_and_outputs(make_llm, reference):
    """Text in, text out: the prompt is encoded by the folder's tokenizer and the ids decode to the text."""
    llm = make_llm()
    outputs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outputs] == reference
    assert outputs[1].prompt == PROMPTS[1]
    assert outputs[1].text == llm.tokenizer.decode(reference[1])


def test_stream_yields_the_same_tokens(make_llm, reference):
    """stream() yields each request's tokens in order, the same as generate(); deltas join to the text."""
    llm = make_llm()
    tokens = {i: [] for i in range(len(PROMPTS))}
    texts = dict.fromkeys(range(len(PROMPTS)), "")
    finished = set()
    for delta in llm.stream(PROMPTS, GREEDY):
        assert delta.index not in finished, "no delta after a request's last one"
        tokens[delta.index].append(delta.token_id)
        texts[delta.index] += delta.text
        if delta.finished:
            finished.add(delta.index)
    assert [tokens[i] for i in range(len(PROMPTS))] == reference
    assert [texts[i] for i in range(len(PROMPTS))] == [o.text for o in llm.generate(PROMPTS, GREEDY)]


def test_continuous_batching_matches_running_alone(make_llm, prompt_ids):
    """Two slots for five prompts: requests join as others finish; each gets its solo tokens."""
    llm = make_llm(max_num_seqs=2)
    solo = [llm.generate([ids], GREEDY)[0].token_ids for ids in prompt_ids]
    together = [o.token_ids for o in llm.generate(prompt_ids, GREEDY)]
    assert together == solo


def test_preemption_under_tiny_kv_budget_keeps_tokens(make_llm, prompt_ids, reference, monkeypatch):
    """A cache of 6 blocks of 4 tokens for 5 prompts forces preemption; the tokens stay transformers'."""
    bytes_per_token = make_llm().config.kv_bytes_per_token()
    llm = make_llm(kv_cache_memory=bytes_per_token * 4 * 24, block_size=4)
    preemptions = []
    original = Scheduler._preempt
    monkeypatch.setattr(
        Scheduler, "_preempt", lambda self, r, plan: (preemptions.append(r.request_id), original(self, r, plan))
    )
    fitting = [i for i, ids in enumerate(prompt_ids) if len(ids) + MAX_TOKENS <= 24 * 4]
    outputs = llm.generate([prompt_ids[i] for i in fitting], GREEDY)
    assert preemptions, "the budget was meant to force at least one preemption"
    assert [o.token_ids for o in outputs] == [reference[i] for i in fitting]


def test_seeded_sampling_is_reproducible(make_llm):
    """Same seed, same tokens (alone or in a batch); another seed gives other tokens."""
    llm = make_llm()
    params = SamplingParams(max_tokens=16, temperature=1.0, top_k=50, top_p=0.95, seed=42, ignore_eos=True)
    first = llm.generate("the quick brown fox", params)[0].token_ids
    batched = llm.generate(["the quick brown fox", "the"], params)[0].token_ids
    other = llm.generate(
        "the quick brown fox", SamplingParams(max_tokens=16, temperature=1.0, seed=43, ignore_eos=True)
    )[0].token_ids
    assert first == batched
    assert first != other


def test_stop_string_cuts_the_text(make_llm):
    """A stop string ends the request ("stop") and is cut from the text, streamed or not."""
    llm = make_llm()
    full = llm.generate(PROMPTS[1], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    out = llm.generate(PROMPTS[1], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, stop=stop))[0]
    assert out.finish_reason == "stop" and out.text == full[: full.find(stop)]
    streamed = "".join(
        d.text for d in llm.stream(PROMPTS[1], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, stop=stop))
    )
    assert streamed == out.text


def _stop_completed_by_last_token(llm, token_ids):
    """(max_tokens, stop string) where the stop string first appears with the max_tokens-th token."""
    decode = llm.tokenizer.decode
    for n in range(2, len(token_ids) + 1):
        before, text = decode(token_ids[: n - 1]), decode(token_ids[:n])
        piece = text[len(before) :] if text.startswith(before) else ""
        if piece.strip() and "\ufffd" not in piece and piece not in before:
            return n, piece
    pytest.skip("no generated token adds new clean text")


def test_stop_string_on_the_last_allowed_token_is_stop(make_llm):
    """A stop string completed by the max_tokens-th token ends with "stop", not "length", streamed or not."""
    llm = make_llm()
    full = llm.generate(PROMPTS[1], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    n, stop = _stop_completed_by_last_token(llm, full.token_ids)
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, stop=stop)
    out = llm.generate(PROMPTS[1], params)[0]
    assert (out.finish_reason, out.token_ids) == ("stop", full.token_ids[:n])
    assert out.text == llm.tokenizer.decode(full.token_ids[: n - 1])
    assert list(llm.stream(PROMPTS[1], params))[-1].finish_reason == "stop"


def test_prompt_longer_than_context_is_an_error(make_llm):
    """A prompt with no room left in max_position_embeddings is refused before anything runs."""
    llm = make_llm()
    with pytest.raises(PromptTooLong, match="128 tokens"):
        llm.generate([[5] * 200])


def test_request_larger_than_cache_is_an_error(make_llm):
    """prompt + max_tokens beyond the whole KV cache is a clear error, not a hang; nothing stays queued."""
    llm = make_llm(kv_cache_memory=make_llm().config.kv_bytes_per_token() * 16 * 2)
    small = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    large = SamplingParams(max_tokens=40, temperature=0)
    with pytest.raises(RequestTooLarge, match="whole cache has 2"):
        llm.generate([[5] * 4, [5] * 20], [small, large])
    after = llm.generate([[6] * 4], small)
    assert len(after) == 1 and after[0].prompt_token_ids == [6] * 4 and len(after[0].token_ids) == 4


def test_chat_template_when_the_folder_has_one(tiny_llama, tmp_path):
    """LLM.chat renders messages with the folder's chat template; without one it is a clear error."""
    from kernelbay_engine import LLM

    folder = tmp_path / "chat"
    shutil.copytree(tiny_llama, folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    config_file.write_text(json.dumps(config))
    llm = LLM(folder, progress=False, kv_cache_memory="1MiB")
    reply = llm.chat([{"role": "user", "content": "the quick"}], GREEDY)
    assert reply.prompt_token_ids == llm.tokenizer.encode_chat([{"role": "user", "content": "the quick"}])
    assert llm.tokenizer.hf.decode(reply.prompt_token_ids).endswith("user: the quick\nassistant:")
    plain = LLM(tiny_llama, progress=False, kv_cache_memory="1MiB")
    with pytest.raises(TokenizerError, match="no chat template"):
        plain.chat([{"role": "user", "content": "hi"}])


def test_prepacked_weights_give_transformers_tokens(make_llm, prompt_ids, reference):
    """prepack_weights="always" (every plain CPU linear in oneDNN's layout) keeps the greedy tokens."""
    llm = make_llm(prepack_weights="always")
    assert "model.layers.0.mlp.gate_up_proj" in llm.prepack_report.packed
    outputs = llm.generate(prompt_ids, GREEDY)
    assert [o.token_ids for o in outputs] == reference


def test_unknown_prepack_policy_is_refused_before_loading(tmp_path):
    """The policy is checked first: even a missing folder is not looked at."""
    from kernelbay_engine import LLM

    with pytest.raises(ValueError, match="prepack_weights must be one of 'auto', 'always', 'never'; got 'yes'"):
        LLM(tmp_path / "missing", prepack_weights="yes")


def test_chunked_prefill_gives_the_same_tokens(make_llm, prompt_ids, reference):
    """A 5-token step budget splits every longer prompt over several steps: greedy tokens are still
    transformers', and seeded sampling draws what it draws with whole-prompt prefill."""
    chunked, whole = make_llm(max_num_batched_tokens=5), make_llm(enable_chunked_prefill=False)
    assert max(len(ids) for ids in prompt_ids) > 5
    assert [o.token_ids for o in chunked.generate(prompt_ids, GREEDY)] == reference
    params = SamplingParams(max_tokens=12, temperature=1.0, top_k=40, seed=7, ignore_eos=True)
    assert [o.token_ids for o in chunked.generate(prompt_ids, params)] == [
        o.token_ids for o in whole.generate(prompt_ids, params)
    ]


def test_llm_reads_the_config_once_and_selects_once(tiny_llama, monkeypatch):
    """One config parse and one selector evaluation per LLM: the runner takes the LLM's selection, no second ask."""
    from kernelbay.attention import _selector, clear_selection_cache
    from kernelbay_engine.config import ModelConfig

    reads = []
    real = ModelConfig.from_pretrained.__func__
    monkeypatch.setattr(
        ModelConfig, "from_pretrained", classmethod(lambda cls, *a, **k: reads.append(a) or real(cls, *a, **k))
    )
    clear_selection_cache()
    LLM(tiny_llama, max_num_seqs=2, kv_cache_memory="1MiB", prepack_weights="never")
    info = _selector._select_groups.cache_info()
    assert len(reads) == 1 and (info.misses, info.hits) == (1, 0)
