"""OpenAI requests -> the engine's work (token ids and one `SamplingParams` per sequence), and the engine's
deltas -> OpenAI responses, streamed chunks and usage.

A request with P prompts and `n` choices is P x n sequences, prompt-major: sequence s answers prompt s // n and
is choice s (OpenAI's completions numbering)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kernelbay_engine.errors import PromptTooLong
from kernelbay_engine.outputs import StreamDelta
from kernelbay_engine.sampling import SEED_LIMIT, SamplingParams
from kernelbay_engine.serve.errors import APIError
from kernelbay_engine.serve.protocol import UNSUPPORTED, ChatCompletionRequest, CompletionRequest
from kernelbay_engine.tokenizer import TokenizerError


@dataclass(frozen=True, slots=True)
class Work:
    """What one HTTP request asks of the engine."""

    prompt_ids: list[list[int]]
    """One list of token ids per prompt."""
    prompt_texts: list[str | None]
    """The prompt as text (None when given as token ids)."""
    params: list[SamplingParams]
    """One per sequence, prompt-major."""
    n: int
    generates: bool = True
    """False for completions' max_tokens=0 with echo: the one token the engine must sample is dropped."""

    @property
    def sequences(self) -> list[list[int]]:
        return [ids for ids in self.prompt_ids for _ in range(self.n)]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompt_ids)


# -- requests -> work ------------------------------------------------------------------------------------------
def check_common(body, model_name: str) -> None:
    """What every endpoint refuses the same way: another model, a feature kernelbay lacks, stream_options alone."""
    if body.model is not None and body.model != model_name:
        raise APIError(
            404,
            f"the model {body.model!r} does not exist here; this server serves {model_name!r} (GET /v1/models)",
            type="not_found_error",
            param="model",
            code="model_not_found",
        )
    for name, neutral in UNSUPPORTED.items():
        value = getattr(body, name, None)
        if not any(value == v and type(value) is type(v) for v in neutral):
            raise APIError(
                400,
                f"{name}={value!r} is not supported by kernelbay serve; leave it out",
                param=name,
                code="unsupported_parameter",
            )
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")


def completion_work(body: CompletionRequest, llm) -> Work:
    prompts = _prompt_list(body.prompt)
    if body.max_tokens == 0 and not body.echo:
        raise APIError(
            400,
            "max_tokens=0 generates nothing; give max_tokens >= 1, or echo=true to score the prompt",
            param="max_tokens",
        )
    ids = [llm.encode(p) for p in prompts]
    generates = body.max_tokens != 0
    params = []
    for prompt_ids in ids:
        max_tokens = _max_tokens(body.max_tokens, len(prompt_ids), llm.max_model_len) if generates else 1
        base = _sampling(body, max_tokens, body.logprobs if generates else None)
        if body.echo and body.logprobs is not None:
            base = replace(base, prompt_logprobs=body.logprobs)
        params += _choices(base, body.n)
    texts = [p if isinstance(p, str) else None for p in prompts]
    return Work(ids, texts, params, body.n, generates)


def chat_work(body: ChatCompletionRequest, llm) -> Work:
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
    if body.max_tokens is not None and body.max_completion_tokens not in (None, body.max_tokens):
        raise APIError(400, "give max_tokens or max_completion_tokens, not both", param="max_completion_tokens")
    ids = _chat_ids(body, llm)
    max_tokens = _max_tokens(body.max_completion_tokens or body.max_tokens, len(ids), llm.max_model_len)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    return Work([ids], [None], _choices(_sampling(body, max_tokens, logprobs), body.n), body.n)


def _chat_ids(body: ChatCompletionRequest, llm) -> list[int]:
    tokenizer = llm.tokenizer
    if tokenizer is None or not tokenizer.has_chat_template:
        raise APIError(
            400, "the served model has no chat template; use /v1/completions", param="messages", code="no_chat_template"
        )
    messages = [{"role": m.role, "content": _content(m.content)} for m in body.messages]
    try:
        return llm.encode(tokenizer.encode_chat(messages))
    except TokenizerError as err:
        raise APIError(400, str(err), param="messages", code="chat_template_failed") from None
    except PromptTooLong as err:
        raise APIError(400, str(err), param="messages", code="context_length_exceeded") from None


def _content(content) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _prompt_list(prompt) -> list:
    """One prompt or a batch of them, as a list of texts or token-id lists."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt is empty; give a string, a list of strings or token ids", param="prompt")
    return list(prompt)


def _max_tokens(requested: int | None, prompt_len: int, max_model_len: int) -> int:
    """`requested`, refused where prompt + requested passes the context; None: what the context leaves."""
    if requested is None:
        return max_model_len - prompt_len
    if prompt_len + requested > max_model_len:
        raise APIError(
            400,
            f"the model's context is {max_model_len} tokens, but the prompt has {prompt_len} and max_tokens asks for "
            f"{requested} more ({prompt_len + requested}); lower max_tokens or shorten the prompt",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


def _sampling(body, max_tokens: int, logprobs: int | None) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=body.stop,
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
    )


def _choices(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n copies; with a seed, choice j samples with seed + j (each choice reproducible on its own)."""
    if params.seed is None:
        return [params] * n
    return [replace(params, seed=(params.seed + j) % SEED_LIMIT) for j in range(n)]


# -- deltas -> responses -----------------------------------------------------------------------------------------
@dataclass(slots=True)
class SequenceOutput:
    """One sequence's tokens, text and log-probabilities, gathered from its deltas."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float] | None] = field(default_factory=list)
    prompt_logprobs: list | None = None
    finish_reason: str | None = None

    def add(self, delta: StreamDelta) -> None:
        self.text.append(delta.text)
        self.token_ids.append(delta.token_id)
        self.logprobs.append(delta.logprobs)
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.finish_reason = delta.finish_reason


def usage(work: Work, generated: int) -> dict:
    completion = generated if work.generates else 0
    return {
        "prompt_tokens": work.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": work.prompt_tokens + completion,
    }


class Renderer:
    """Turns one request's sequences into OpenAI's JSON (whole or as stream chunks)."""

    def __init__(self, work: Work, tokenizer, header: dict):
        self.work, self.tokenizer, self.header = work, tokenizer, header

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.hf.decode([token_id])

    def chunk(self, choices: list[dict]) -> dict:
        return {**self.header, "choices": choices}


class CompletionRenderer(Renderer):
    """/v1/completions: `text_completion` objects; echo prefixes the prompt; logprobs in OpenAI's legacy shape."""

    def __init__(self, work: Work, tokenizer, header: dict, body: CompletionRequest):
        super().__init__(work, tokenizer, header)
        self.echo, self.k = body.echo, body.logprobs
        self._offsets = [0] * len(work.params)

    def echo_text(self, seq: int) -> str:
        prompt = self.work.prompt_ids[seq // self.work.n]
        text = self.work.prompt_texts[seq // self.work.n]
        return text if text is not None else self.tokenizer.decode(prompt)

    def response(self, outputs: list[SequenceOutput]) -> dict:
        choices = []
        for seq, out in enumerate(outputs):
            entries = self._entries(seq, out.prompt_logprobs, zip(out.token_ids, out.logprobs, strict=True))
            text = "".join(out.text) if self.work.generates else ""
            choices.append(self._choice(seq, (self.echo_text(seq) if self.echo else "") + text, entries, out))
        generated = sum(len(out.token_ids) for out in outputs)
        return {**self.chunk(choices), "usage": usage(self.work, generated)}

    def delta_chunk(self, delta: StreamDelta, first: bool) -> dict | None:
        seq = delta.index
        prompt_entries = delta.prompt_logprobs if first else None
        if not self.work.generates:  # echo only: the prompt, then nothing
            entries = self._entries(seq, prompt_entries, [])
            return self.chunk([self._choice(seq, self.echo_text(seq), entries, delta)])
        text = (self.echo_text(seq) if self.echo and first else "") + delta.text
        entries = self._entries(seq, prompt_entries, [(delta.token_id, delta.logprobs)])
        if not text and entries is None and delta.finish_reason is None:
            return None  # a held-back token (a possible stop string, half a character): nothing to say yet
        return self.chunk([self._choice(seq, text, entries, delta)])

    def _choice(self, seq: int, text: str, entries, out) -> dict:
        reason = out.finish_reason
        if not self.work.generates and reason is not None:
            reason = "length"
        return {"index": seq, "text": text, "logprobs": entries, "finish_reason": reason}

    def _entries(self, seq: int, prompt_logprobs, generated) -> dict | None:
        """OpenAI's completions logprobs (tokens, token_logprobs, top_logprobs, text_offset), echo's prompt first."""
        if self.k is None:
            return None
        pairs = []
        if self.echo and prompt_logprobs is not None:
            pairs += list(zip(self.work.prompt_ids[seq // self.work.n], prompt_logprobs, strict=True))
        if self.work.generates:
            pairs += list(generated)
        tokens = [self.token_text(t) for t, _ in pairs]
        offsets = []
        for token in tokens:
            offsets.append(self._offsets[seq])
            self._offsets[seq] += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [entry[t] if entry else None for t, entry in pairs],
            "top_logprobs": [
                {self.token_text(i): v for i, v in entry.items()} if entry else None for _, entry in pairs
            ],
            "text_offset": offsets,
        }


class ChatRenderer(Renderer):
    """/v1/chat/completions: `chat.completion` (and `.chunk`) objects; logprobs as OpenAI's `content` list."""

    def __init__(self, work: Work, tokenizer, header: dict, body: ChatCompletionRequest):
        super().__init__(work, tokenizer, header)
        self.k = (body.top_logprobs or 0) if body.logprobs else None

    def response(self, outputs: list[SequenceOutput]) -> dict:
        choices = [
            {
                "index": seq,
                "message": {"role": "assistant", "content": "".join(out.text)},
                "logprobs": self._entries(zip(out.token_ids, out.logprobs, strict=True)),
                "finish_reason": out.finish_reason,
            }
            for seq, out in enumerate(outputs)
        ]
        generated = sum(len(out.token_ids) for out in outputs)
        return {**self.chunk(choices), "usage": usage(self.work, generated)}

    def role_chunk(self) -> dict:
        """The first chunk: every choice's role."""
        choices = [
            {"index": seq, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for seq in range(len(self.work.params))
        ]
        return self.chunk(choices)

    def delta_chunk(self, delta: StreamDelta, first: bool) -> dict | None:
        entries = self._entries([(delta.token_id, delta.logprobs)])
        if not delta.text and entries is None and delta.finish_reason is None:
            return None
        choice = {
            "index": delta.index,
            "delta": {"content": delta.text} if delta.text else {},
            "logprobs": entries,
            "finish_reason": delta.finish_reason,
        }
        return self.chunk([choice])

    def _entries(self, generated) -> dict | None:
        if self.k is None:
            return None
        content = []
        for token_id, entry in generated:
            alternatives = list(entry.items())[: self.k] if entry else []
            content.append(
                {
                    **self._token(token_id, entry[token_id] if entry else None),
                    "top_logprobs": [self._token(i, v) for i, v in alternatives],
                }
            )
        return {"content": content}

    def _token(self, token_id: int, logprob: float | None) -> dict:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
