"""`LLM`: a checkpoint folder in, completions out — batched, continuously scheduled, streamable.

from kernelbay_engine import LLM, SamplingParams
llm = LLM()                                   # the embedded demo checkpoint
out = llm.generate(["A fortune:"], SamplingParams(max_tokens=20, temperature=0))
for delta in llm.stream(["A fortune:"]):      # tokens as soon as they are sampled
    print(delta.text, end="")
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from kernelbay.errors import InputError
from kernelbay_engine.args import FILE_QUANTIZATION, EngineArgs, max_model_len_for, quantization_for
from kernelbay_engine.core import EngineCore
from kernelbay_engine.detokenize import TextTracker
from kernelbay_engine.errors import PromptTooLong
from kernelbay_engine.inputs import check_model_folder, demo_model_folder, model_errors
from kernelbay_engine.loading.formats import format_for
from kernelbay_engine.memory import DEFAULT_BLOCK_SIZE, cache_allocation_errors, plan_num_blocks
from kernelbay_engine.outputs import RequestOutput, StreamDelta
from kernelbay_engine.prefix_cache import prefix_caching_status
from kernelbay_engine.request import Request
from kernelbay_engine.sampling import SamplingParams
from kernelbay_engine.scheduler import Scheduler, SchedulerConfig
from kernelbay_engine.stats import EngineStats
from kernelbay_engine.tokenizer import Tokenizer, TokenizerError, has_tokenizer

if TYPE_CHECKING:
    from kernelbay_engine.config import ModelConfig


Prompt = str | Sequence[int]


@dataclass(slots=True, eq=False)
class _Call:
    """One generate() or stream() call: its requests and the events the engine delivered for it.

    `events` and `unfinished` change only under the engine's lock; the caller drains its own events."""

    stream: bool
    requests: list[Request] = field(default_factory=list)
    events: list = field(default_factory=list)
    """StreamDelta (stream) or RequestOutput (generate) in delivery order, or a _Failure."""
    unfinished: int = 0


@dataclass(frozen=True, slots=True)
class _Failure:
    """An error met while handling one of the call's requests; the call raises it."""

    error: BaseException


@dataclass(slots=True)
class _Tracked:
    """Engine-side bookkeeping of one request: which call it belongs to and its text so far."""

    call: _Call
    index: int
    prompt: str | None
    request: Request
    text: TextTracker | None
    """None when nobody needs the text before the end (no stop strings, not streaming)."""
    delivered: int = 0
    """Generated tokens already handed to the call (a step may add several: speculative decoding)."""


class LLM:
    """A loaded model, its paged KV cache and a continuous-batching scheduler.

    model: a folder with config.json, safetensors weights and (for text prompts) a tokenizer, or a .gguf file
    (or a folder holding only one: config, tokenizer and weights from the file, with kernelbay-gguf);
    None means the demo checkpoint shipped with kernelbay. kv_cache_memory: bytes or "2GiB"
    (default: room for max_num_seqs full-context requests, capped at 512 MiB).
    enable_chunked_prefill: a prompt longer than what is left of a step's max_num_batched_tokens is
    fed over several steps (False: whole, alone).
    enable_prefix_caching: prompts that start with the same full KV blocks as an earlier one reuse that
    one's cached blocks and prefill only the rest (kernelbay_engine.prefix_cache; `llm.stats()` counts the
    hits; `llm.prefix_caching` says whether it is on, and why). Outputs are the same with it off.
    prepack_weights: "auto" packs CPU float linear weights of 2^18 elements or more in their kernel's form (fdot's
    panels for float32 where the native ops run, else oneDNN's blocked layout), decided by rule, not timed (see
    kernelbay_engine.layers.prepack); "always" packs every eligible one, "never" none.
    quantization: None (default) runs a GGUF file on its own quantized codes ("gguf": its weight format's
    keep_quantized, given the model on meta: no float copy is built; docs/real-model.md has the rule per file type)
    and a safetensors checkpoint on its weights as stored; "none" dequantizes a GGUF file's codes to dense weights.
    "int8" (groups of 32, as Q8_0), "int8-channel" (a scale per output row) or "int4" (groups of 32) quantizes every
    linear of a float checkpoint after loading, the LM head at 8 bits (see kernelbay_engine.quant).
    `llm.quant_report` says what each linear runs; a file's codes dequantized because no quantized kernel runs on
    this CPU are a WARNING, never silent.
    model_impl: "auto" (a native family where one is installed, else the transformers fallback),
    "native" (refuse the fallback) or "transformers" (the fallback even where a native family exists).
    moe_backend: the MoE expert kernel of an MoE model's layers (default: the selector's first capable one,
    or KERNELBAY_MOE_BACKEND); unknown or incapable names fail before any weight is read.
    speculative: "ngram" proposes up to `num_speculative_tokens` (default 4) next tokens per step by prompt
    lookup, an EAGLE-3 draft folder (trained for this model: same vocabulary and hidden size) by the draft reading the
    target's hidden states; the target verifies them in the same step (kernelbay_engine.speculative): greedy outputs
    are those of plain decoding, sampled ones follow the same distribution; `llm.stats()` reports the acceptance.

    Safe to call from many threads, and streams may be interleaved with other calls: whichever call
    finds no step running advances the whole batch and hands every call its own tokens (see
    docs/engine.md, "Concurrency").
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
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 2048,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
        trust_remote_code: bool = False,
        progress: bool | None = None,
        attention_backend_options: Mapping[str, Mapping] | None = None,
        prepack_weights: str = "auto",
        quantization: str | None = None,
        model_impl: str = "auto",
        moe_backend: str | None = None,
        tensor_parallel_size: int = 1,
        speculative: str | Path | None = None,
        num_speculative_tokens: int | None = None,
    ):
        EngineArgs(  # every argument checked, naming it, before anything is read
            max_num_seqs=max_num_seqs,
            kv_cache_memory=kv_cache_memory,
            block_size=block_size,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            enable_prefix_caching=enable_prefix_caching,
            trust_remote_code=trust_remote_code,
            progress=progress,
            prepack_weights=prepack_weights,
            quantization=quantization,
            model_impl=model_impl,
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            speculative=speculative,
            num_speculative_tokens=num_speculative_tokens,
        )
        self.folder = check_model_folder(demo_model_folder() if model is None else model)
        quantization = quantization_for(quantization, self.folder)
        config, attention, moe = self._read_config_and_select(
            attention_backend, moe_backend, kv_cache_dtype, dtype, block_size, trust_remote_code
        )
        draft_config = _draft_config(speculative, config, trust_remote_code)  # checked before any weight is read
        self.prefix_caching = prefix_caching_status(attention, enable_prefix_caching)
        """Whether prompts reuse cached prefix blocks, and why (`PrefixCaching(enabled, reason)`)."""
        # before the weights: building it parses the vocabulary into ~50 MiB of short-lived objects (SmolLM2's GGUF),
        # which would otherwise be the process's peak on top of the loaded model
        self.tokenizer = (
            Tokenizer(self.folder, trust_remote_code=trust_remote_code, config=config.hf_config)
            if has_tokenizer(self.folder)
            else None
        )
        from kernelbay_engine.models.auto import AutoModelForCausalLM

        file_report: dict[str, str] = {}
        sharded = None  # rank 0's runner when the model is sharded over ranks (kernelbay_engine.distributed)
        with model_errors():
            if tensor_parallel_size > 1:
                shard_options = dict(
                    dtype=dtype,
                    model_impl=model_impl,
                    moe_backend=moe_backend,
                    attention_backend=attention_backend,
                    attention_backend_options=attention_backend_options,
                    kv_cache_dtype=kv_cache_dtype,
                    block_size=block_size,
                    trust_remote_code=trust_remote_code,
                    prepack_weights=prepack_weights,
                    max_num_seqs=max_num_seqs,
                    quantization=quantization,
                )
                sharded = self._start_ranks(tensor_parallel_size, config, shard_options)
                self.model = sharded.model
                file_report.update(sharded.file_codes)
            else:
                self.model = AutoModelForCausalLM.from_pretrained(
                    self.folder,
                    dtype=dtype,
                    attention_backend=attention_backend,
                    trust_remote_code=trust_remote_code,
                    progress=progress,
                    config=config,
                    model_impl=model_impl,
                    moe_backend=moe_backend,
                    moe_selection=moe,
                    before_load=self._file_codes_on_meta(file_report) if quantization == FILE_QUANTIZATION else None,
                )
        self.config: ModelConfig = cast("ModelConfig", self.model.config)
        self.quant_report = file_report if quantization == FILE_QUANTIZATION else self._quantize(quantization)
        """What each linear runs (a GGUF file: its own codes by default; quantization="none" dequantizes them)."""
        _warn_dequantized_codes(file_report, self.folder)
        self.max_model_len = max_model_len_for(max_model_len, self.config.max_position_embeddings)
        self.runner = sharded or self._make_runner(
            block_size, attention_backend, kv_cache_dtype, attention_backend_options, attention
        )
        scheduler_config = self._scheduler_config(
            kv_cache_memory, block_size, max_num_seqs, max_num_batched_tokens, enable_chunked_prefill
        )
        with cache_allocation_errors(kv_cache_memory, scheduler_config.num_blocks * self.runner.bytes_per_block):
            self.runner.allocate_cache(scheduler_config.num_blocks)
        self.prepack_report = self._prepack(prepack_weights)
        proposer = self._proposer(
            speculative, num_speculative_tokens, draft_config, progress, prepack_weights, scheduler_config
        )
        self._core = EngineCore(
            self.runner, Scheduler(scheduler_config), self._eos_token_ids(), self.max_model_len, proposer
        )
        self._tracked: dict[int, _Tracked] = {}
        self._next_id = 0
        # The scheduler is touched only by the thread holding the step flag, or under the lock while it is
        # clear. RLock: a stream collected by the GC inside a locked section may abort re-entrantly.
        self._lock = threading.Condition(threading.RLock())
        self._stepping = False
        self._submitters = 0
        """Threads waiting for the step flag to queue requests; no new step starts until they have."""
        self._pending_aborts: deque[_Call] = deque()
        """Calls ended while a step ran; the stepper drops their requests when the step is done."""

    # -- public API ------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Complete every prompt (text or token ids); outputs in prompt order."""
        call = self._submit(prompts, sampling_params, stream=False)
        try:
            outputs = {out.index: out for out in self._events(call)}
        finally:
            self._abort(call)
        return [outputs[i] for i in sorted(outputs)]

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamDelta]:
        """Like generate(), but yields each token (with its text) as soon as it is sampled.

        While suspended, its requests keep running with other calls; closing it drops only its own."""
        call = self._submit(prompts, sampling_params, stream=True)
        try:
            yield from self._events(call)
        finally:
            self._abort(call)

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
            ids = _token_ids(prompt)
        self._check_prompt(ids)
        return ids

    def stats(self) -> EngineStats:
        """Requests running and waiting, KV blocks in use and cached, prefix-cache queries and hits, now (safe from any
        thread; no step waits)."""
        scheduler = self._core.scheduler
        blocks, cache, spec = scheduler.blocks, scheduler.prefix_cache_stats, self._core.speculation_stats
        return EngineStats(
            running=len(scheduler.running),
            waiting=len(scheduler.waiting),
            kv_blocks_used=blocks.num_used_blocks,
            kv_blocks_total=blocks.num_blocks,
            kv_blocks_cached=blocks.num_cached_blocks,
            prefix_caching=self.prefix_caching.enabled,
            prefix_cache_queries=cache.queries,
            prefix_cache_hits=cache.hits,
            spec_draft_tokens=spec.draft_tokens,
            spec_accepted_tokens=spec.accepted_tokens,
            spec_verifications=spec.verifications,
        )

    # -- requests ----------------------------------------------------------------------------------
    def _submit(self, prompts, sampling_params, *, stream: bool) -> _Call:
        """Check every prompt, then queue them all as one call (none queued if any is refused)."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        ids = [self.encode(p) for p in prompts]
        if stream or any(p.stop for p in params):
            self._require_tokenizer()
        call = _Call(stream)
        with self._step_flag():
            try:
                for index, (prompt, token_ids, p) in enumerate(zip(prompts, ids, params, strict=True)):
                    self._add(call, index, prompt if isinstance(prompt, str) else None, token_ids, p)
            except BaseException:
                self._drop(call)
                raise
        return call

    def _add(self, call: _Call, index: int, prompt: str | None, token_ids: list[int], params: SamplingParams):
        request = Request(self._next_id, token_ids, params, self.max_model_len)
        self._next_id += 1
        text = TextTracker(self._require_tokenizer().decode, params.stop) if call.stream or params.stop else None
        call.requests.append(request)  # before queueing: whatever interrupts the add, _drop finds it
        call.unfinished += 1
        self._tracked[request.request_id] = _Tracked(call, index, prompt, request, text)
        self._core.add(request)

    def _events(self, call: _Call) -> Iterator:
        """The call's outputs as they are delivered, until its last request finishes."""
        while batch := self._next_events(call):
            for event in batch:
                if isinstance(event, _Failure):
                    raise event.error
                yield event

    def _next_events(self, call: _Call) -> list:
        """Wait for the call's next events; when no step is running, run one (no busy wait)."""
        while True:
            with self._lock:
                while not call.events and call.unfinished and (self._stepping or self._submitters):
                    self._lock.wait()  # calls waiting to queue requests go first: they join the next step
                if call.events or not call.unfinished:
                    events, call.events = call.events, []
                    return events
                self._stepping = True
            deliveries: list = []
            try:
                deliveries = self._step()
            finally:
                self._end_step(deliveries)

    @contextmanager
    def _step_flag(self):
        """Hold the right to touch the scheduler (waits while another thread steps; no step starts meanwhile)."""
        with self._lock:
            self._submitters += 1
            try:
                while self._stepping:
                    self._lock.wait()
            finally:
                self._submitters -= 1
            self._stepping = True
        try:
            yield
        finally:
            self._end_step([])

    def _end_step(self, deliveries: list) -> None:
        """Hand each call its events, drop the requests of calls ended meanwhile, wake the waiters."""
        with self._lock:
            for call, event, done in deliveries:
                if event is not None:
                    call.events.append(event)
                call.unfinished -= done
            self._stepping = False
            while self._pending_aborts:
                self._drop(self._pending_aborts.popleft())
            self._lock.notify_all()

    def _step(self) -> list[tuple[_Call, object, bool]]:
        """One engine step for every call; returns (call, event or None, request finished) per new token."""
        deliveries = []
        for request in self._core.step():
            tracked = self._tracked[request.request_id]
            try:
                events = self._on_tokens(tracked)
            except Exception as err:  # noqa: BLE001 - e.g. a decode failure fails its own call only
                self._core.abort(request)
                events = [_Failure(err)]
            if request.is_finished:
                del self._tracked[request.request_id]
            deliveries += [(tracked.call, event, False) for event in events[:-1]]
            deliveries.append((tracked.call, events[-1] if events else None, request.is_finished))
        return deliveries

    def _on_tokens(self, tracked: _Tracked) -> list:
        """The events the request's new tokens give its call, token by token (a stop string may end it early)."""
        events = []
        while tracked.delivered < len(tracked.request.output_token_ids):
            tracked.delivered += 1
            event = self._on_token(tracked, tracked.delivered)
            if event is not None:
                events.append(event)
        return events

    def _on_token(self, tracked: _Tracked, count: int):
        """The event the request's `count`-th generated token gives its call: a delta when streaming, the output
        when it finished with this token."""
        request = tracked.request
        if tracked.text is not None and tracked.text.update(request.output_token_ids[:count]):
            self._core.stop(request, count)
        last = count == len(request.output_token_ids)
        if tracked.call.stream:
            assert tracked.text is not None  # a streamed call always tracks its text
            delta = tracked.text.delta(final=request.is_finished and last)
            reason = request.finish_reason.value if request.finish_reason and last else None
            logprobs = request.logprobs[count - 1] if request.logprobs else None
            prompt_logprobs = request.prompt_logprobs if count == 1 else None  # they ride on the first delta
            token = request.output_token_ids[count - 1]
            return StreamDelta(tracked.index, token, delta, reason, logprobs, prompt_logprobs)
        return self._output(tracked) if request.is_finished and last else None

    def _output(self, tracked: _Tracked) -> RequestOutput:
        request = tracked.request
        assert request.finish_reason is not None  # only a finished request has an output
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
            request.logprobs,
            request.prompt_logprobs,
        )

    def _abort(self, call: _Call) -> None:
        """Drop the call's unfinished requests: now, or when the step in flight ends (never waits for it).

        Runs in the call's `finally`, so also when a stream is closed or garbage-collected in any thread."""
        with self._lock:
            if not call.unfinished:
                return
            self._pending_aborts.append(call)
            if not self._stepping:
                while self._pending_aborts:
                    self._drop(self._pending_aborts.popleft())

    def _drop(self, call: _Call) -> None:
        """Abort every unfinished request of `call` (the caller holds the scheduler)."""
        for request in call.requests:
            self._core.abort(request)
            self._tracked.pop(request.request_id, None)
        call.unfinished = 0
        call.events = []

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
    def _read_config_and_select(self, attention_backend, moe_backend, kv_cache_dtype, dtype, block_size, trust_code):
        """The folder's config, read once, and the kernels for its layers, selected once before any weight is read
        (an unknown or incapable kernel fails here); the runner and the MoE layers take these selections, made for
        the dtype and block size the model runs with, instead of selecting again."""
        from kernelbay.dtypes import dtype_name
        from kernelbay_engine.config import ModelConfig
        from kernelbay_engine.models.base import torch_dtype
        from kernelbay_engine.selection import select_attention

        config = ModelConfig.from_pretrained(self.folder, trust_remote_code=trust_code)
        model_dtype = dtype_name(torch_dtype(dtype or config.dtype))
        attention = select_attention(
            config, kv_cache_dtype=kv_cache_dtype, requested=attention_backend, dtype=model_dtype, block_size=block_size
        )
        return config, attention, _select_moe(config, moe_backend, model_dtype)

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
        return SchedulerConfig(
            num_blocks,
            block_size,
            max_num_seqs,
            max_num_batched_tokens,
            enable_chunked_prefill,
            enable_prefix_caching=self.prefix_caching.enabled,
            cache_key=self.runner.cache.storage_key,
        )

    def _make_runner(self, block_size: int, attention_backend, kv_cache_dtype, backend_options, selection):
        """The runner with every layer's backend and cache spec chosen; its cache is allocated once planned."""
        from kernelbay_engine.runner import ModelRunner

        return ModelRunner(
            self.model,
            block_size=block_size,
            attention_backend=attention_backend,
            kv_cache_dtype=kv_cache_dtype,
            attention_backend_options=backend_options,
            selection=selection,
        )

    def _start_ranks(self, n: int, config, options: dict):
        """Rank 0's runner of the model sharded over `n` ranks (the others started and loaded); what `n` cannot shard
        (sizes, options, the machine, the file's codes) is refused first, before any process starts or any weight is
        read."""
        from kernelbay_engine.distributed import start_tensor_parallel
        from kernelbay_engine.distributed.sharding import check_file_shards, plan_rank_share
        from kernelbay_engine.distributed.sizes import check_options, check_tensor_parallel

        quantization, model_impl = options["quantization"], options["model_impl"]
        check_options(n, model_impl=model_impl)
        check_tensor_parallel(config, n, source=str(self.folder), quantization=quantization)
        plan_rank_share(config, n, model_impl)  # every tensor splits (on meta), before any rank starts
        check_file_shards(self.folder, config, n, quantization=quantization, model_impl=model_impl)
        return start_tensor_parallel(self.folder, n, options)

    def _proposer(
        self, speculative, num_speculative_tokens: int | None, draft: ModelConfig | None, progress, prepack, scheduling
    ):
        """The proposer of speculative decoding (None: plain decoding); the arguments are checked by EngineArgs, a
        draft's config by `_draft_config`. A draft's linears are packed as the target's (`prepack`: the policy)."""
        from kernelbay_engine.speculative import DEFAULT_NUM_SPECULATIVE_TOKENS, NgramProposer

        count = num_speculative_tokens or DEFAULT_NUM_SPECULATIVE_TOKENS
        if draft is None:
            return NgramProposer(count) if speculative is not None else None
        from kernelbay_engine.layers.prepack import prepack_linear_weights
        from kernelbay_engine.speculative.eagle import EagleProposer, load_draft

        model = load_draft(draft, self.runner.whole_input_embeddings, progress=progress)
        prepack_linear_weights(model, policy=prepack)
        return EagleProposer(model, self.model, count, block_size=scheduling.block_size)

    def _prepack(self, policy: str):
        """Pack the CPU linear weights in their kernels' forms (kernelbay_engine.layers.prepack says which, and why)."""
        from kernelbay_engine.layers.prepack import prepack_linear_weights

        return prepack_linear_weights(self.model, policy=policy)

    def _file_codes_on_meta(self, report: dict[str, str]):
        """The weight format gives the linears its own quantized codes while the model is on meta, so those
        weights never exist as float (the loader skips what a layer holds); `report` gets what each runs."""
        fmt = format_for(self.folder)
        return lambda model: report.update(fmt.keep_quantized(model, self.folder))

    def _quantize(self, mode: str | None):
        """Quantize the loaded linears before anything packs or reads them (None: leave them)."""
        if mode is None:
            return None
        from kernelbay_engine.quant import quantize_model

        return quantize_model(self.model, mode)

    def _eos_token_ids(self) -> set[int]:
        """Every end-of-sequence token: config.json's, generation_config.json's (what transformers stops at) and
        the tokenizer's."""
        from kernelbay_engine.config._generation import generation_eos_token_ids

        eos = getattr(self.config.hf_config, "eos_token_id", None)
        ids = set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())
        ids |= generation_eos_token_ids(self.folder, self.config.vocab_size)
        return ids | (self.tokenizer.eos_token_ids if self.tokenizer else set())

    @property
    def attention_backends(self) -> dict[str, str]:
        """Layer kind -> the backend serving it."""
        return {kind: result.backend_name for kind, result in self.runner.cache.selection.groups}


def _draft_config(speculative, target: ModelConfig, trust_remote_code: bool) -> ModelConfig | None:
    """The config of the EAGLE-3 draft folder `speculative` names, checked against the target's (None: no draft)."""
    from kernelbay_engine.speculative import NGRAM

    if speculative is None or speculative == NGRAM:
        return None
    from kernelbay_engine.speculative.eagle import read_draft_config

    return read_draft_config(speculative, target, trust_remote_code=trust_remote_code)


def _select_moe(config, moe_backend: str | None, model_dtype: str):
    """The MoE kernel for the model's MoE layers ((selection, dequantized); None for a dense model, where naming
    one is an error)."""
    from kernelbay_engine.layers.moe import no_moe_layers
    from kernelbay_engine.selection import select_moe

    if config.moe is None:
        if moe_backend:
            raise no_moe_layers(moe_backend, config.architecture)
        return None
    return select_moe(config, requested=moe_backend, dtype=model_dtype)


def _warn_dequantized_codes(report: dict[str, str], path: Path) -> None:
    """Say so when a file's codes were dequantized to dense weights because no quantized kernel runs them here."""
    from kernelbay_engine.quant.method import dequantized_note

    note = dequantized_note(report, path)
    if note:
        import logging

        logging.getLogger("kernelbay.quant").warning(note)


_PROMPT_FORMS = "a string, a list of int token ids (or a 1-D integer numpy/torch array), or a list of those"


def _is_array(value) -> bool:
    """A numpy array or torch tensor (duck-typed, so neither is imported here)."""
    return hasattr(value, "tolist") and hasattr(value, "ndim")


def _is_token_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_prompt_list(prompts) -> list[Prompt]:
    """One prompt or a batch of them, as a list; anything else is an InputError naming the argument."""
    if isinstance(prompts, (bytes, bytearray, Mapping)) or not hasattr(prompts, "__iter__"):
        raise InputError(f"prompts must be {_PROMPT_FORMS}; got {type(prompts).__name__}")
    if isinstance(prompts, str) or (_is_array(prompts) and prompts.ndim == 1):
        return [prompts]
    if isinstance(prompts, Sequence) and prompts and _is_token_id(prompts[0]):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise InputError(f"no prompts given; pass {_PROMPT_FORMS}")
    return prompts


def _token_ids(prompt) -> list[int]:
    """A prompt given as token ids, as a list of ints: float, bool or non-numeric ids are refused, not rounded."""
    if _is_array(prompt):
        if prompt.ndim != 1:
            raise InputError(f"a token-id array prompt must be 1-D, got {prompt.ndim}-D; pass one row per prompt")
        prompt = prompt.tolist()
    if isinstance(prompt, (str, bytes, bytearray, Mapping)) or not hasattr(prompt, "__iter__"):
        raise InputError(f"each prompt must be {_PROMPT_FORMS}; got {type(prompt).__name__}")
    ids = list(prompt)
    bad = next(((i, t) for i, t in enumerate(ids) if not _is_token_id(t)), None)
    if bad is not None:
        raise InputError(
            f"token id {bad[0]} of the prompt is {bad[1]!r} ({type(bad[1]).__name__}); token ids must be ints"
        )
    return ids


def _as_params_list(params, count: int) -> list[SamplingParams]:
    """One SamplingParams for every prompt, or one per prompt; anything else is an InputError."""
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    if isinstance(params, (str, bytes, Mapping)) or not hasattr(params, "__iter__"):
        raise InputError(
            f"sampling_params must be a SamplingParams, a list of them (one per prompt) or None; "
            f"got {type(params).__name__} (build one with SamplingParams(**options))"
        )
    params = list(params)
    wrong = next((p for p in params if not isinstance(p, SamplingParams)), None)
    if wrong is not None:
        raise InputError(f"sampling_params holds a {type(wrong).__name__}, not a SamplingParams: {wrong!r}"[:300])
    if len(params) != count:
        raise InputError(f"got {len(params)} SamplingParams for {count} prompts; pass one, or one per prompt")
    return params
