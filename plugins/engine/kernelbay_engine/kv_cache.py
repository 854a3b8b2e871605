"""Paged KV-cache block allocator: a free list, per-request block tables, reference counts and the prefix cache.

The engine keeps exactly one: the scheduler's (it allocates as it schedules, frees on preemption and
finish, and hands each step's block tables to the runner). A `ModelRunner` driven by hand, without a
scheduler, makes one for itself (without prefix caching).

With prefix caching, a full block whose keys and values are computed is registered under its hash
(`prefix_cache.hash_block`); when its last request lets go of it, it keeps its contents and stays findable
until its memory is needed, evicted least-recently-used. A new request takes such blocks by reference
(`match_prefix`, then `allocate(..., prefix=...)`), and several requests may share one. Only full blocks are
ever shared, and a request never writes a block it shares: it is matched up to its last full block before
its last token, which it always computes (as vLLM does), so no block needs copying on write.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from kernelbay.attention import KVLayout, StepRequest
from kernelbay.errors import KernelbayError
from kernelbay_engine.prefix_cache import BlockHash


class KVCacheExhausted(KernelbayError, MemoryError):
    """Not enough free blocks for an allocation; nothing was allocated."""


class _Request:
    __slots__ = ("blocks", "num_tokens", "num_hashed")

    def __init__(self):
        self.blocks: list[int] = []
        self.num_tokens = 0
        self.num_hashed = 0  # leading blocks already offered to the prefix cache


# A block is free and empty, held by one or more requests, or free but keeping cached contents (evictable).
_FREE, _USED, _CACHED = 0, 1, 2
_FREE_RUNS = re.compile(rb"\x00+")


class KVCacheManager:
    """Hands out cache blocks to requests; a block is held by one request, or by several sharing a cached prefix.

    Slots are logical (`block * block_size + offset`), the same for both layouts; the layout only
    decides the cache tensor's shape (see `KVCacheSpec.cache_shape`).

    Placement keeps each request's blocks consecutive when it can (backends then read an NHD cache
    without copying): a new request goes to the middle of the largest free run, leaving room on both
    sides; a growing request takes the block right after its last one when that is free. Any free
    block is used when no run fits, so placement never costs capacity.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        layout: KVLayout | str = KVLayout.NHD,
        *,
        prefix_caching: bool = False,
    ):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.layout = KVLayout.parse(layout)
        self.prefix_caching = prefix_caching
        self._free_map = bytearray(num_blocks)  # _FREE / _USED / _CACHED per block
        self._num_free = num_blocks  # _FREE blocks (empty); the _CACHED ones are in _evictable
        self._refs = [0] * num_blocks  # requests holding each block
        self._hash: list[BlockHash | None] = [None] * num_blocks
        self._by_hash: dict[BlockHash, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; least recently used first
        self._requests: dict[Hashable, _Request] = {}

    # -- queries -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: the empty ones and the cached ones no request holds (evicted on use)."""
        return self._num_free + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (held by requests or evictable)."""
        return len(self._by_hash)

    @property
    def num_used_blocks(self) -> int:
        """Blocks some request holds (0 once every request is freed; `audit` checks it against the counts)."""
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def __contains__(self, request_id: Hashable) -> bool:
        return request_id in self._requests

    def request_ids(self) -> list[Hashable]:
        return list(self._requests)

    def num_tokens(self, request_id: Hashable) -> int:
        return self._get(request_id).num_tokens

    def block_table(self, request_id: Hashable) -> tuple[int, ...]:
        """Physical block ids of the request, in token order."""
        return tuple(self._get(request_id).blocks)

    def slot_mapping(self, request_id: Hashable, num_new_tokens: int) -> list[int]:
        """Flat slots of the request's last `num_new_tokens` tokens (the ones this step writes)."""
        req = self._get(request_id)
        if not 0 <= num_new_tokens <= req.num_tokens:
            raise ValueError(
                f"request {request_id!r} holds {req.num_tokens} tokens; cannot map the last {num_new_tokens}"
            )
        start = req.num_tokens - num_new_tokens
        return [
            req.blocks[p // self.block_size] * self.block_size + p % self.block_size
            for p in range(start, req.num_tokens)
        ]

    def step_request(self, request_id: Hashable, num_new_tokens: int) -> StepRequest:
        """The metadata row for a request whose last `num_new_tokens` tokens are this step's queries."""
        req = self._get(request_id)
        return StepRequest(num_new_tokens, req.num_tokens - num_new_tokens, tuple(req.blocks))

    def extra_blocks(self, request_id: Hashable, num_tokens: int) -> int:
        """More blocks the request needs to hold `num_tokens` tokens in all (every one, if it holds none)."""
        req = self._requests.get(request_id)
        return self.blocks_needed(num_tokens) - (len(req.blocks) if req else 0)

    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= self.num_free_blocks

    def can_append(self, request_id: Hashable, num_tokens: int = 1) -> bool:
        return self._extra_blocks(self._get(request_id), num_tokens) <= self.num_free_blocks

    def match_prefix(self, hashes: Sequence[BlockHash]) -> list[int]:
        """The cached blocks of the longest prefix of `hashes` (a request's chain) found in the cache."""
        blocks: list[int] = []
        if not self.prefix_caching:
            return blocks
        for block_hash in hashes:
            block = self._by_hash.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def admission_cost(self, prefix: Sequence[int], num_tokens: int) -> int:
        """Free blocks `allocate(rid, num_tokens, prefix)` takes: the new ones, and the prefix's unheld ones."""
        return self.blocks_needed(num_tokens) - len(prefix) + sum(1 for block in prefix if not self._refs[block])

    def audit(self) -> list[str]:
        """Where the ledger disagrees with itself (reference counts, free counts, the hash index); empty if sound."""
        problems = []
        refs = [0] * self.num_blocks
        for req in self._requests.values():
            for block in req.blocks:
                refs[block] += 1
        for block in range(self.num_blocks):
            state, cached = self._free_map[block], self._hash[block] is not None
            if refs[block] != self._refs[block]:
                problems.append(f"block {block}: {self._refs[block]} references counted, {refs[block]} held")
            expected = _USED if refs[block] else (_CACHED if cached else _FREE)
            if state != expected or (state == _CACHED) != (block in self._evictable):
                problems.append(f"block {block}: state {state}, expected {expected} ({refs[block]} holders)")
        if self._num_free != self._free_map.count(_FREE):
            problems.append(f"{self._num_free} free blocks counted, {self._free_map.count(_FREE)} free")
        if any(self._hash[block] != block_hash for block_hash, block in self._by_hash.items()):
            problems.append("the hash index names a block that holds another hash")
        return problems

    # -- changes -------------------------------------------------------------------------------
    def allocate(self, request_id: Hashable, num_tokens: int, prefix: Sequence[int] = ()) -> tuple[int, ...]:
        """Reserve blocks for a new request's first `num_tokens` tokens; returns its block table.

        `prefix`: cached blocks (`match_prefix`) holding its first tokens, shared rather than allocated. All or
        nothing: when the blocks do not fit, nothing changes."""
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already holds blocks; use append() to grow it or free() it first")
        if num_tokens < len(prefix) * self.block_size:
            raise ValueError(f"num_tokens must cover the {len(prefix)} cached prefix block(s), got {num_tokens}")
        if any(self._hash[block] is None for block in prefix):
            raise ValueError(f"prefix blocks {list(prefix)} are not all cached blocks (take them from match_prefix)")
        cost = self.admission_cost(prefix, num_tokens)
        if cost > self.num_free_blocks:
            raise KVCacheExhausted(
                f"KV cache exhausted: request {request_id!r} needs {cost} free block(s) for {num_tokens} tokens "
                f"but only {self.num_free_blocks} of {self.num_blocks} are free; free or preempt a request "
                f"(KVCacheManager.free) or give the cache more blocks"
            )
        req = _Request()
        for block in prefix:
            self._hold(block)
            req.blocks.append(block)
        req.num_hashed = len(prefix)
        self._take(request_id, req, self.blocks_needed(num_tokens) - len(prefix), num_tokens)
        self._requests[request_id] = req
        return tuple(req.blocks)

    def append(self, request_id: Hashable, num_tokens: int = 1) -> tuple[int, ...]:
        """Grow a request by `num_tokens` tokens; returns the blocks newly added (often none)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        req = self._get(request_id)
        before = len(req.blocks)
        self._take(request_id, req, self._extra_blocks(req, num_tokens), req.num_tokens + num_tokens)
        return tuple(req.blocks[before:])

    def grow_to(self, request_id: Hashable, num_tokens: int) -> tuple[int, ...]:
        """Make the request hold `num_tokens` tokens in all (allocating it if new); returns its block table."""
        if request_id not in self._requests:
            return self.allocate(request_id, num_tokens)
        held = self._requests[request_id].num_tokens
        if num_tokens < held:
            raise ValueError(f"request {request_id!r} holds {held} tokens; it cannot shrink to {num_tokens}")
        self.append(request_id, num_tokens - held)
        return self.block_table(request_id)

    def reserve_step(self, batch: Sequence[tuple[Hashable, int, int]]) -> list[StepRequest]:
        """Grow every request of a step by its new tokens, all or nothing; returns the step's metadata rows.

        `batch`: (request_id, start_pos, num_new_tokens). A new request must start at position 0; a known
        one must continue exactly where its cache ends.
        """
        needed = sum(self._step_extra(rid, start, n) for rid, start, n in batch)
        if needed > self.num_free_blocks:
            raise KVCacheExhausted(
                f"this step needs {needed} more KV-cache block(s) but only {self.num_free_blocks} of "
                f"{self.num_blocks} are free; run fewer requests per step or free finished ones"
            )
        for rid, start, n in batch:
            self.grow_to(rid, start + n)
        return [self.step_request(rid, n) for rid, _, n in batch]

    def truncate(self, request_id: Hashable, num_tokens: int) -> int:
        """Shrink the request to its first `num_tokens` tokens (speculative tokens the model rejected); the blocks
        past them return to the free list. Returns how many were freed.

        Those blocks were taken for the rejected tokens alone, so this request is their only holder and none is
        registered in the prefix cache (a block is registered only once its tokens are accepted)."""
        req = self._get(request_id)
        if not 0 <= num_tokens <= req.num_tokens:
            raise ValueError(f"request {request_id!r} holds {req.num_tokens} tokens; it cannot shrink to {num_tokens}")
        if num_tokens < req.num_hashed * self.block_size:  # a later write would land in a cached block
            raise ValueError(
                f"request {request_id!r}: its first {req.num_hashed} blocks are cached; it cannot shrink into them"
            )
        keep = self.blocks_needed(num_tokens)
        for block in req.blocks[keep:]:
            if self._refs[block] != 1 or self._hash[block] is not None:
                raise AssertionError(f"block {block} of {request_id!r} is shared or cached; it cannot be rolled back")
            self._refs[block] = 0
            self._free_map[block] = _FREE
            self._num_free += 1
        freed = len(req.blocks) - keep
        del req.blocks[keep:]
        req.num_tokens = num_tokens
        return freed

    def cache_blocks(self, request_id: Hashable, hashes: Sequence[BlockHash]) -> None:
        """Register the request's first `len(hashes)` blocks, whose keys and values are computed, under `hashes`.

        A block already cached (a shared prefix) stays as it is; so does a block whose hash another block
        already holds (two requests computed the same prefix at once): the first keeps the entry."""
        req = self._get(request_id)
        if not self.prefix_caching:
            return
        if len(hashes) > len(req.blocks) or len(hashes) * self.block_size > req.num_tokens:
            raise ValueError(
                f"request {request_id!r} holds {req.num_tokens} tokens in {len(req.blocks)} block(s); "
                f"it cannot register {len(hashes)} full block(s)"
            )
        for index in range(req.num_hashed, len(hashes)):
            block, block_hash = req.blocks[index], hashes[index]
            if self._hash[block] is None and block_hash not in self._by_hash:
                self._hash[block] = block_hash
                self._by_hash[block_hash] = block
        req.num_hashed = max(req.num_hashed, len(hashes))

    def free(self, request_id: Hashable) -> int:
        """Let go of every block of the request; returns how many it held.

        A block nobody holds any more returns to the free list, or, if cached, stays findable until evicted;
        the request's last blocks are evicted first (a later request is likelier to share its first ones)."""
        req = self._requests.pop(request_id, None)
        if req is None:
            raise KeyError(f"request {request_id!r} holds no blocks (never allocated or already freed)")
        for block in reversed(req.blocks):
            if self._refs[block] < 1:
                raise AssertionError(f"block {block} of {request_id!r} has no reference left to release")
            self._refs[block] -= 1
            if self._refs[block]:
                continue
            if self._hash[block] is not None:
                self._free_map[block] = _CACHED
                self._evictable[block] = None
            else:
                self._free_map[block] = _FREE
                self._num_free += 1
        return len(req.blocks)

    # -- internals -----------------------------------------------------------------------------
    def _get(self, request_id: Hashable) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise KeyError(f"request {request_id!r} holds no blocks; allocate() it first") from None

    def _step_extra(self, request_id: Hashable, start: int, n: int) -> int:
        """Blocks a step's `n` tokens at `start` add; checks that `start` continues the request's cache."""
        cached = self._requests[request_id].num_tokens if request_id in self._requests else None
        if cached is None and start != 0:
            raise ValueError(f"request {request_id!r} is new (nothing cached) but start_pos is {start}; start at 0")
        if cached is not None and start != cached:
            raise ValueError(
                f"request {request_id!r}: start_pos {start} but {cached} tokens are cached; "
                f"send the tokens from position {cached}"
            )
        return self.extra_blocks(request_id, start + n)

    def _extra_blocks(self, req: _Request, num_tokens: int) -> int:
        return self.blocks_needed(req.num_tokens + num_tokens) - len(req.blocks)

    def _take(self, request_id: Hashable, req: _Request, count: int, new_num_tokens: int) -> None:
        """All-or-nothing: either the request gets `count` more blocks or nothing changes."""
        if count > self.num_free_blocks:
            raise KVCacheExhausted(
                f"KV cache exhausted: request {request_id!r} needs {count} more block(s) for {new_num_tokens} "
                f"tokens but only {self.num_free_blocks} of {self.num_blocks} are free; free or preempt a request "
                f"(KVCacheManager.free) or give the cache more blocks"
            )
        self._evict(count - self._num_free)
        for block in self._place(count, req.blocks[-1] if req.blocks else None):
            if self._refs[block] or self._free_map[block] != _FREE:
                raise AssertionError(f"free block {block} is still held ({self._refs[block]} references)")
            self._refs[block] = 1
            self._free_map[block] = _USED
            req.blocks.append(block)
        self._num_free -= count
        req.num_tokens = new_num_tokens

    def _hold(self, block: int) -> None:
        """One more request holds a cached block (an evictable one is taken off the eviction order)."""
        if not self._refs[block]:
            del self._evictable[block]
            self._free_map[block] = _USED
        self._refs[block] += 1

    def _evict(self, count: int) -> None:
        """Empty the `count` least recently used evictable blocks (their contents leave the cache)."""
        for _ in range(max(count, 0)):
            block, _ = self._evictable.popitem(last=False)
            block_hash = self._hash[block]
            assert block_hash is not None, f"evictable block {block} holds no hash"
            del self._by_hash[block_hash]
            self._hash[block] = None
            self._free_map[block] = _FREE
            self._num_free += 1

    def _place(self, count: int, last: int | None) -> list[int]:
        """`count` free blocks: continuing after `last`, else centred in the largest free run, else any."""
        picked: list[int] = []
        nxt = None if last is None else last + 1
        while nxt is not None and len(picked) < count and nxt < self.num_blocks and self._free_map[nxt] == _FREE:
            picked.append(nxt)
            nxt += 1
        if len(picked) == count:
            return picked
        free_map = bytearray(self._free_map)
        for block in picked:
            free_map[block] = _USED
        runs = sorted((m.span() for m in _FREE_RUNS.finditer(free_map)), key=lambda r: r[0] - r[1])
        need = count - len(picked)
        if runs and runs[0][1] - runs[0][0] >= need:
            lo, hi = runs[0]
            start = lo + (hi - lo - need) // 2 if lo > 0 else lo  # leave the left neighbour room to grow
            return picked + list(range(start, start + need))
        for lo, hi in runs:
            picked += list(range(lo, hi))[: count - len(picked)]
        return picked

    def build_step(self, batch: Sequence[tuple[Hashable, int]]) -> list[StepRequest]:
        """Metadata rows for `[(request_id, num_new_tokens), ...]` (tokens already appended/allocated)."""
        return [self.step_request(rid, n) for rid, n in batch]
