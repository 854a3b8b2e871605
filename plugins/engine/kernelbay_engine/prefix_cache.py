"""Automatic prefix caching: what identifies a cached block, whether a model may reuse blocks, what was reused.

A full block of a token sequence is identified by a hash chained over its parent's hash (so over every token
before it), its own token ids and the extra keys that change its keys and values without being tokens (an
adapter, multimodal inputs over its positions: `hash_block`'s `extra_keys`). The chain starts at a root naming
what changes every block of one cache (its dtypes), so caches storing different bytes never share a hash.
The block ledger (`kv_cache.KVCacheManager`) keeps hashed blocks after their requests end and hands them to a
later request whose prompt starts with the same blocks; the scheduler then prefills only the rest, through the
same cached-context path chunked prefill uses.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from kernelbay.attention import LayerGroupSelection

BlockHash = bytes
"""A block's identity: a sha256 digest (collisions are not a practical concern, unlike Python's `hash`)."""


def root_hash(*keys: object) -> BlockHash:
    """The chain's start for one cache: `keys` name what changes every block's bytes (the cache dtypes)."""
    return hashlib.sha256(repr(("kernelbay-prefix-cache", *keys)).encode()).digest()


def hash_block(parent: BlockHash, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """The hash of one full block: its parent's hash, its token ids, and `extra_keys` (reprs that are stable
    across runs: ints, strings, tuples of them) for inputs other than tokens that change its keys and values."""
    digest = hashlib.sha256(parent)
    digest.update(array("q", token_ids).tobytes())
    if extra_keys:
        digest.update(repr(extra_keys).encode())
    return digest.digest()


def extend_hashes(
    hashes: list[BlockHash], root: BlockHash, token_ids: Sequence[int], block_size: int, extra_keys: tuple = ()
) -> None:
    """Append to `hashes` (the chain of `token_ids`' first blocks) the hashes of its remaining full blocks."""
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hashes[-1] if hashes else root
        hashes.append(hash_block(parent, token_ids[start : start + block_size], extra_keys))


@dataclass(frozen=True, slots=True)
class PrefixCaching:
    """Whether an engine reuses cached prefix blocks, and why (what `LLM.stats()` and `kernelbay explain` say)."""

    enabled: bool
    reason: str


def prefix_caching_status(selection: LayerGroupSelection, requested: bool) -> PrefixCaching:
    """Prefix caching for a model whose layer groups got `selection`, when the user `requested` it.

    Every attention backend attends to a cached context over the paged cache (chunked prefill needs it, and the
    conformance kit's `mixed_prefill_decode` spec checks it), so no backend declares anything for it; what turns
    it off is the user, or layers whose keys depend on later tokens (bidirectional attention)."""
    if not requested:
        return PrefixCaching(False, "off: turned off (enable_prefix_caching=False, --no-enable-prefix-caching)")
    if any(result.requirements.encoder for _, result in selection.groups):
        return PrefixCaching(
            False,
            "off: the model has bidirectional (encoder) attention layers, whose keys depend on later tokens, "
            "so no prefix's blocks can be reused",
        )
    backends = ", ".join(sorted({result.backend_name for _, result in selection.groups}))
    return PrefixCaching(True, f"on: prompts reuse the cached KV blocks of their shared prefixes (read by {backends})")


@dataclass(slots=True)
class PrefixCacheStats:
    """Prompt tokens looked up in the prefix cache and found there, counted when a request is admitted
    (again after a preemption), as vLLM counts them."""

    queries: int = 0
    """Tokens of admitted requests that were looked up (the whole sequence)."""
    hits: int = 0
    """Of those, tokens whose KV blocks were found cached (not computed)."""

    def record(self, queried: int, hit: int) -> None:
        self.queries += queried
        self.hits += hit

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
