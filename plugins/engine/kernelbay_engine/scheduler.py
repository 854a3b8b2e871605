"""Continuous batching over a paged KV cache: who runs in the next step, and with how many tokens.

Every step carries one token for each running request (decode) plus waiting requests' prompts
(prefill), so new requests join while others decode. A prompt longer than what is left of the
step's token budget is split across steps (chunked prefill, as in vLLM): a long prompt neither
stalls the running decodes nor makes one huge step; no token is sampled until the last chunk.

The scheduler owns the engine's only block allocator (`KVCacheManager`): it allocates a chunk's blocks
when it schedules the chunk and hands the runner each request's block table in the plan. A finished
request's blocks are free for the very next step. When a running request needs a block and none is
free, the newest running request is preempted: its blocks are freed and it goes back to the front of
the queue, to be recomputed from its tokens later (so its output is unchanged). A request that could
not fit even in an empty cache is refused when it is added.

With prefix caching on, a request is admitted with the cached blocks of its longest cached prefix (full
blocks, up to the one before its last token) and only the rest is fed to the model, from `start_pos` =
the tokens found, exactly as a later prefill chunk is. Full blocks are offered to the cache once their keys
and values are computed: when the request's next chunk is scheduled, and when it finishes or is preempted.
A request that asks for prompt log-probabilities skips the lookup until every prompt token is scored: a
cached token is not computed, so it would have no log-probability (vLLM does the same).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kernelbay_engine.errors import RequestTooLarge
from kernelbay_engine.kv_cache import KVCacheManager
from kernelbay_engine.logprobs import wants_prompt_logits
from kernelbay_engine.prefix_cache import PrefixCacheStats, extend_hashes, root_hash
from kernelbay_engine.request import Request, RequestStatus


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits of one step and of the cache the scheduler hands out."""

    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 64
    """Most requests in one step."""
    max_num_batched_tokens: int = 2048
    """Token budget of one step (decodes always get their one token)."""
    enable_chunked_prefill: bool = True
    """Split prompts at the budget; False: a prompt runs whole, alone in its step's prefill part if too long."""
    enable_prefix_caching: bool = True
    """Reuse the cached KV blocks of shared prompt prefixes (kernelbay_engine.prefix_cache)."""
    cache_key: str = ""
    """What changes every cached block's bytes besides its tokens (the cache dtypes): the hash chain's root."""

    def __post_init__(self):
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SchedulerConfig.{name} must be a positive integer, got {value!r}")
        for name in ("enable_chunked_prefill", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SchedulerConfig.{name} must be True or False, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """Tokens of one request fed to the model this step, starting at position `start_pos`."""

    request: Request
    token_ids: list[int]
    start_pos: int
    block_table: tuple[int, ...]
    """The request's blocks, in token order, covering every position up to `end_pos`."""
    num_draft: int = 0
    """Trailing proposed tokens in `token_ids` for the model to verify (speculative decoding)."""

    @property
    def end_pos(self) -> int:
        return self.start_pos + len(self.token_ids)

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the request's tokens (a prefill chunk does not)."""
        return self.end_pos - self.num_draft == self.request.num_tokens


@dataclass(slots=True)
class StepPlan:
    """What the engine runs this step, and which requests were preempted (their blocks are already free)."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


class Scheduler:
    """Waiting queue (FIFO, preempted requests first) and running list (oldest first)."""

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.blocks = KVCacheManager(config.num_blocks, config.block_size, prefix_caching=config.enable_prefix_caching)
        """The engine's block ledger: free list, each running request's block table, the prefix cache."""
        self.prefix_cache_stats = PrefixCacheStats()
        self._hash_root = root_hash(config.block_size, config.cache_key)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        need = self.blocks.blocks_needed(request.max_total_tokens)
        if need > self.config.num_blocks:
            raise RequestTooLarge(
                f"request {request.request_id} may hold {request.max_total_tokens} tokens (prompt + max_tokens) = "
                f"{need} KV-cache blocks of {self.config.block_size}, but the whole cache has "
                f"{self.config.num_blocks}; give the cache more memory (kv_cache_memory) or lower max_tokens"
            )
        self.waiting.append(request)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self._schedule_running(plan)
        if not plan.preempted:
            self._schedule_waiting(plan, budget)
        return plan

    def roll_back(self, request: Request) -> None:
        """Give back the blocks a verification step took for proposed tokens the model rejected: the request's
        ledger shrinks to its `num_cached` tokens (those blocks never held an accepted token, so none is cached)."""
        self.blocks.truncate(request.request_id, request.num_cached)

    def finish(self, request: Request) -> None:
        """Drop a finished request; its blocks are free for the next step."""
        self.running.remove(request)
        self._release(request)

    def abort(self, request: Request) -> None:
        """Drop one request, waiting or running (its call is gone); the others are untouched."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self._release(request)

    # -- internals -------------------------------------------------------------------------------
    def _schedule_running(self, plan: StepPlan) -> int:
        """Decodes (one token each) and the next chunk of running prefills; returns the budget left."""
        budget = self.config.max_num_batched_tokens
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            uncached = request.num_tokens - request.num_cached
            count = 1 + self._fit_drafts(request, budget - 1) if uncached == 1 else min(uncached, budget)
            if count <= 0:
                continue  # a chunked prefill waiting for budget
            if not self._make_room(request, count, plan):
                break
            self._commit(request, plan, count)
            budget -= count
        return budget

    def _fit_drafts(self, request: Request, budget: int) -> int:
        """Keep the request's proposed tokens that fit the step's budget and the blocks it holds or are free, less
        one free block per running request (room for their own next tokens): a proposal never preempts anyone, not
        even later in the step. Returns how many it keeps."""
        if not request.spec_token_ids or request.request_id not in self.blocks:
            return 0
        held = len(self.blocks.block_table(request.request_id))
        spare = max(self.blocks.num_free_blocks - len(self.running), 0)
        room = (held + spare) * self.config.block_size - request.num_tokens
        del request.spec_token_ids[max(min(budget, room), 0) :]
        return len(request.spec_token_ids)

    def _make_room(self, request: Request, count: int, plan: StepPlan) -> bool:
        """Preempt the newest running requests until `request` can cache `count` more tokens.

        False if `request` itself was the victim."""
        while self.blocks.extra_blocks(request.request_id, request.num_cached + count) > self.blocks.num_free_blocks:
            victim = self.running[-1]
            self._preempt(victim, plan)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request, plan: StepPlan) -> None:
        self.running.remove(request)
        self._release(request)
        request.status = RequestStatus.WAITING
        request.num_cached = 0
        request.spec_token_ids = []
        self.waiting.appendleft(request)
        plan.preempted.append(request)

    def _schedule_waiting(self, plan: StepPlan, budget: int) -> None:
        admitted = 0
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            prefix = self._cached_prefix(request)
            found = len(prefix) * self.config.block_size
            count = self._first_chunk(request.num_tokens - found, budget, admitted)
            if count <= 0 or self.blocks.admission_cost(prefix, found + count) > self.blocks.num_free_blocks:
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            budget -= count
            admitted += 1
            self.blocks.allocate(request.request_id, found, prefix)
            request.num_cached = found
            if self.blocks.prefix_caching:
                self.prefix_cache_stats.record(request.num_tokens, found)
            self._commit(request, plan, count)

    def _cached_prefix(self, request: Request) -> list[int]:
        """The cached blocks the request may start from: its longest cached prefix of full blocks, short of its last
        token (always computed, so that it samples; its block is then never a shared one). None while it still
        needs prompt log-probabilities (a cached token is not computed, so it has none)."""
        if not self.blocks.prefix_caching or wants_prompt_logits(request):
            return []
        usable = (request.num_tokens - 1) // self.config.block_size
        if len(request.block_hashes) < usable:
            self._extend_hashes(request)
        return self.blocks.match_prefix(request.block_hashes[:usable])

    def _extend_hashes(self, request: Request) -> None:
        extend_hashes(
            request.block_hashes, self._hash_root, request.all_token_ids(), self.config.block_size, request.cache_keys
        )

    def _cache_computed(self, request: Request) -> None:
        """Offer the request's full blocks whose keys and values are computed to the prefix cache."""
        if not self.blocks.prefix_caching or request.request_id not in self.blocks:
            return
        full = request.num_cached // self.config.block_size
        if len(request.block_hashes) < full:
            self._extend_hashes(request)
        self.blocks.cache_blocks(request.request_id, request.block_hashes[:full])

    def _first_chunk(self, num_tokens: int, budget: int, admitted: int) -> int:
        """Tokens a waiting request may feed this step (0: it waits)."""
        if self.config.enable_chunked_prefill:
            return min(num_tokens, budget)
        return num_tokens if num_tokens <= budget or not admitted else 0

    def _commit(self, request: Request, plan: StepPlan, count: int) -> None:
        """Feed the next `count` uncached tokens of `request` this step and allocate the blocks they fill."""
        self._cache_computed(request)
        uncached = request.uncached_token_ids()
        tokens = (uncached + request.spec_token_ids)[:count]  # proposals follow a decode's one token
        table = self.blocks.grow_to(request.request_id, request.num_cached + count)
        plan.chunks.append(ScheduledChunk(request, tokens, request.num_cached, table, max(count - len(uncached), 0)))

    def _release(self, request: Request) -> None:
        if request.request_id in self.blocks:
            self._cache_computed(request)
            self.blocks.free(request.request_id)
