"""`LLM`: a checkpoint folder in, completions out — batched, continuously scheduled, streamable.

from kernelbay_engine import LLM, SamplingParams
llm = LLM()                                   # the embedded demo checkpoint
out = llm.generate(["A fortune:"], SamplingParams(max_tokens=20, temperature=0))
for delta in llm.stream(["A fortune:"]):      # tokens as soon as they are sampled
    print(delta.text, end="")
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kernelbay.errors import InputError, PromptTooLong
from kernelbay.inputs import backend_errors, check_model_folder
from kernelbay_engine.core import EngineCore
from kernelbay_engine.detokenize import TextTracker
from kernelbay_engine.inputs import demo_model_folder, model_errors
from kernelbay_engine.memory import plan_num_blocks
from kernelbay_engine.outputs import RequestOutput, StreamDelta
from kernelbay_engine.request import FinishReason, Request
from kernelbay_engine.sampling import SamplingParams
from kernelbay_engine.scheduler import Scheduler, SchedulerConfig
from kernelbay_engine.tokenizer import Tokenizer, TokenizerError, has_tokenizer

Prompt = str | Sequence[int]


@dataclass(slots=True)
class _Tracked:
    """Engine-side bookkeeping of one request: where its output goes and its text so far."""

    index: int
    prompt: str | None
    request: Request
    text: TextTracker | None
    """None when nobody needs the text before the end (no stop strings, not streaming)."""


class LLM:
    """A loaded model, its paged KV cache and a continuous-batching scheduler.

    model: a folder with config.json, safetensors weights and (for text prompts) a tokenizer;
    None means the demo checkpoint shipped with kernelbay. kv_cache_memory: bytes or "2GiB"
    (default: room for max_num_seqs full-context requests, capped at 512 MiB).
    enable_chunked_prefill: a prompt longer than what is left of a step's max_num_batched_tokens is
    fed over several steps (False: whole, alone).
    prepack_weights: "auto" reorders CPU float32 linear weights into oneDNN's blocked layout where
    that is measured faster (see kernelbay_engine.layers.prepack), "always" packs every eligible
    one, "never" none.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        attention_backend: str | None = None,
        dtype: str | None = None,
        max_num_seqs: int = 64,
        kv_cache_memory: int | str | None = None,
        kv_cache_dtype: str = "auto",
        block_size: int = 16,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
        trust_remote_code: bool = False,
        progress: bool | None = None,
        attention_backend_options: Mapping[str, Mapping] | None = None,
        prepack_weights: str = "auto",
    ):
        _check_prepack_policy(prepack_weights)
        self.folder = check_model_folder(demo_model_folder() if model is None else model)
        config = self._read_config_and_select(attention_backend, kv_cache_dtype, dtype, block_size, trust_remote_code)
        from kernelbay_engine import AutoModelForCausalLM

        with model_errors():
            self.model = AutoModelForCausalLM.from_pretrained(
                self.folder,
                dtype=dtype,
                attention_backend=attention_backend,
                trust_remote_code=trust_remote_code,
                progress=progress,
                config=config,
            )
        self.config = self.model.config
        self.max_model_len = _max_model_len(self.config, max_model_len)
        self.tokenizer = (
            Tokenizer(self.folder, trust_remote_code=trust_remote_code) if has_tokenizer(self.folder) else None
        )
        self.runner = self._make_runner(block_size, attention_backend, kv_cache_dtype, attention_backend_options)
        scheduler_config = self._scheduler_config(
            kv_cache_memory, block_size, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill
        )
        with backend_errors():
            self.runner.allocate_cache(scheduler_config.num_blocks)
        self.prepack_report = self._prepack(prepack_weights, max_num_seqs)
        self._core = EngineCore(self.runner, Scheduler(scheduler_config), self._eos_token_ids(), self.max_model_len)
        self._tracked: dict[int, _Tracked] = {}
        self._next_id = 0

    # -- public API ------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Complete every prompt (text or token ids); outputs in prompt order."""
        outputs: dict[int, RequestOutput] = {}
        for _ in self._run(prompts, sampling_params, outputs, stream=False):
            pass
        return [outputs[i] for i in sorted(outputs)]

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamDelta]:
        """Like generate(), but yields each token (with its text) as soon as it is sampled."""
        yield from self._run(prompts, sampling_params, {}, stream=True)

    def chat(
        self, messages: Sequence[Mapping[str, str]], sampling_params: SamplingParams | None = None
    ) -> RequestOutput:
        """One reply to `messages` ([{"role": "user", "content": ...}]) through the folder's chat template."""
        return self.generate([self._require_tokenizer().encode_chat(messages)], sampling_params)[0]

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt (text through the tokenizer; ids checked against the vocabulary)."""
        if isinstance(prompt, str):
            ids = self._require_tokenizer().encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        self._check_prompt(ids)
        return ids

    # -- requests ----------------------------------------------------------------------------------
    def _run(self, prompts, sampling_params, outputs: dict[int, RequestOutput], *, stream: bool):
        """Queue every prompt, then step until all finish; whatever happens, nothing stays queued."""
        try:
            self._add_all(prompts, sampling_params, stream=stream)
            while self._core.has_unfinished:
                for request in self._core.step():
                    delta = self._on_token(request, outputs, stream=stream)
                    if stream:
                        yield delta
        finally:
            self._abort_unfinished()

    def _add_all(self, prompts, sampling_params, *, stream: bool) -> None:
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        ids = [self.encode(p) for p in prompts]  # every prompt checked before any is queued
        for index, (prompt, token_ids, p) in enumerate(zip(prompts, ids, params, strict=True)):
            self._add(index, prompt if isinstance(prompt, str) else None, token_ids, p, stream)

    def _add(self, index: int, prompt: str | None, token_ids: list[int], params: SamplingParams, stream: bool):
        request = Request(self._next_id, token_ids, params, self.max_model_len)
        self._next_id += 1
        needs_text = bool(stream or params.stop)
        if needs_text:
            self._require_tokenizer()
        text = TextTracker(self.tokenizer.decode, params.stop) if needs_text else None
        self._core.add(request)
        self._tracked[request.request_id] = _Tracked(index, prompt, request, text)

    def _on_token(self, request: Request, outputs: dict[int, RequestOutput], *, stream: bool):
        tracked = self._tracked[request.request_id]
        if tracked.text is not None and tracked.text.update(request.output_token_ids):
            self._core.finish(request, FinishReason.STOP)
        if request.is_finished:
            outputs[tracked.index] = self._output(self._tracked.pop(request.request_id))
        if stream:
            delta = tracked.text.delta(final=request.is_finished)
            reason = request.finish_reason.value if request.finish_reason else None
            return StreamDelta(tracked.index, request.output_token_ids[-1], delta, reason)
        return None

    def _output(self, tracked: _Tracked) -> RequestOutput:
        request = tracked.request
        if tracked.text is not None:
            text = tracked.text.text
        else:
            text = self.tokenizer.decode(request.output_token_ids) if self.tokenizer else ""
        return RequestOutput(
            tracked.index,
            tracked.prompt,
            list(request.prompt_token_ids),
            text,
            list(request.output_token_ids),
            request.finish_reason.value,
        )

    def _abort_unfinished(self) -> None:
        self._core.abort_all()
        self._tracked.clear()

    # -- checks --------------------------------------------------------------------------------------
    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise InputError("the prompt is empty (no token ids); give it at least one token")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise InputError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.config.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise PromptTooLong(
                f"the prompt has {len(ids)} tokens but the model's context is {self.max_model_len} "
                f"tokens (max_position_embeddings), leaving no room to generate; shorten the prompt"
            )

    def _require_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise TokenizerError(
                f"{str(self.folder)!r} holds no tokenizer, so prompts must be lists of token ids "
                f"and no text (stop strings, streaming text) can be produced"
            )
        return self.tokenizer

    # -- construction helpers ------------------------------------------------------------------------
    def _read_config_and_select(self, attention_backend, kv_cache_dtype, dtype, block_size, trust_remote_code):
        """The folder's config, read once; an unknown or incapable backend fails before any weight is read.

        The selection is cached (one selector, one cache): the runner's identical request is a cache hit."""
        from kernelbay.attention import select_for_model
        from kernelbay.config import ModelConfig

        config = ModelConfig.from_pretrained(self.folder, trust_remote_code=trust_remote_code)
        with backend_errors():
            select_for_model(
                config,
                kv_cache_dtype=kv_cache_dtype,
                requested=attention_backend,
                dtype=str(dtype).removeprefix("torch.") if dtype else None,
                block_size=block_size,
            )
        return config

    def _scheduler_config(
        self, kv_cache_memory, block_size, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill
    ) -> SchedulerConfig:
        """Blocks priced by the specs the chosen backends allocate (scales and all), not by the config."""
        num_blocks = plan_num_blocks(
            bytes_per_block=self.runner.bytes_per_block,
            block_size=block_size,
            kv_cache_memory=kv_cache_memory,
            max_num_seqs=max_num_seqs,
            max_model_len=self.max_model_len,
        )
        return SchedulerConfig(num_blocks, block_size, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill)

    def _make_runner(self, block_size: int, attention_backend, kv_cache_dtype, backend_options):
        """The runner with every layer's backend and cache spec chosen; its cache is allocated once planned."""
        from kernelbay_engine.runner import ModelRunner

        with backend_errors():
            return ModelRunner(
                self.model,
                block_size=block_size,
                attention_backend=attention_backend,
                kv_cache_dtype=kv_cache_dtype,
                attention_backend_options=backend_options,
            )

    def _prepack(self, policy: str, max_num_seqs: int):
        """Reorder CPU linear weights for oneDNN where measured faster at 1 row and a full decode batch."""
        from kernelbay_engine.layers.prepack import prepack_linear_weights

        return prepack_linear_weights(self.model, rows=(1, min(max_num_seqs, 64)), policy=policy)

    def _eos_token_ids(self) -> set[int]:
        eos = getattr(self.config.hf_config, "eos_token_id", None)
        ids = set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())
        return ids | (self.tokenizer.eos_token_ids if self.tokenizer else set())

    @property
    def attention_backends(self) -> dict[str, str]:
        """Layer kind -> the backend serving it."""
        return {kind: result.backend_name for kind, result in self.runner.cache.selection.groups}


def _check_prepack_policy(policy) -> None:
    from kernelbay_engine.layers.prepack import POLICIES

    if policy not in POLICIES:
        raise ValueError(f"prepack_weights must be one of {', '.join(map(repr, POLICIES))}; got {policy!r}")


def _max_model_len(config, requested: int | None) -> int:
    limit = config.max_position_embeddings
    if requested is None:
        return limit
    if not isinstance(requested, int) or not 1 < requested <= limit:
        raise ValueError(
            f"max_model_len must be an integer in [2, {limit}] (max_position_embeddings), got {requested!r}"
        )
    return requested


def _as_prompt_list(prompts) -> list[Prompt]:
    if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise InputError("no prompts given; pass a string, a list of token ids, or a list of either")
    return prompts


def _as_params_list(params, count: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    params = list(params)
    if len(params) != count:
        raise InputError(f"got {len(params)} SamplingParams for {count} prompts; pass one, or one per prompt")
    return params
