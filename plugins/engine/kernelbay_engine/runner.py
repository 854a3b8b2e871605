"""`ModelRunner`: runs a kernelbay model one packed step at a time over a paged KV cache.

At construction the runner selects an attention backend per layer group (`selection.select_attention`: an
explicit name, else the first backend capable of every group) and the cache spec each layer's backend
allocates; `bytes_per_block` prices one block across every layer, and `allocate_cache(num_blocks)`
allocates one cache tensor per layer and binds it (`Attention.bind`). Each `step` takes any mix of
prefills, prefill chunks and decodes, builds one `AttentionMetadata` from the requests' block tables,
runs the model on the packed tokens and returns the logits of each request's last new token.

In the engine the scheduler owns the block allocator and every StepRequest brings its block table; the
runner keeps no block accounting. Driven by hand (no block tables), the runner allocates blocks itself:

    runner = ModelRunner(model, num_blocks=256, block_size=16)
    logits = runner.step([StepRequest("a", prompt_ids, 0)])            # prefill
    logits = runner.step([StepRequest("a", [next_id], len(prompt_ids))])  # decode
    runner.free("a")
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from kernelbay.attention import AttentionMetadata, LayerGroupSelection
from kernelbay.attention import StepRequest as MetadataRow
from kernelbay_engine._runner_cache import CachePlan, plan_cache
from kernelbay_engine.failures import KernelRaised, located, non_finite_logits
from kernelbay_engine.kv_cache import KVCacheManager
from kernelbay_engine.models.base import activation_dtype_device

if TYPE_CHECKING:
    from kernelbay_engine.models.base import CausalLM


@dataclass(frozen=True, slots=True)
class StepRequest:
    """One request's new tokens in a step: `token_ids` sit at positions start_pos, start_pos + 1, ..."""

    request_id: Hashable
    token_ids: tuple[int, ...]
    start_pos: int
    """Tokens of this request already in the cache (0 for a new request)."""
    block_table: tuple[int, ...] | None = None
    """Blocks holding positions 0 .. start_pos + len(token_ids) - 1 (the scheduler's); None: the runner
    allocates them (driven by hand, without a scheduler)."""

    def __post_init__(self):
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        if not self.token_ids:
            raise ValueError(f"request {self.request_id!r}: a step needs at least one new token")
        if self.start_pos < 0:
            raise ValueError(f"request {self.request_id!r}: start_pos must be >= 0, got {self.start_pos}")
        if self.block_table is not None:
            object.__setattr__(self, "block_table", tuple(int(b) for b in self.block_table))


def _model_dtype(model: torch.nn.Module) -> str:
    """The dtype activations run in: the embedding table's (FP8 layers dequantise into it)."""
    return str(activation_dtype_device(model)[0]).removeprefix("torch.")


def _require_loaded(model: torch.nn.Module) -> None:
    meta = [name for name, p in model.named_parameters() if p.is_meta]
    if meta:
        raise ValueError(
            f"the model's weights are not loaded ({len(meta)} parameters still on the meta device, "
            f"e.g. {meta[0]}); use AutoModelForCausalLM.from_pretrained, "
            "or load_weights after from_config"
        )


class ModelRunner:
    """Binds `model`'s attention layers to a paged cache of `num_blocks` x `block_size` tokens and runs steps.

    num_blocks=None plans the cache without allocating it: read `bytes_per_block`, then `allocate_cache`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        num_blocks: int | None = None,
        block_size: int = 16,
        attention_backend: str | None = None,
        kv_cache_dtype: str | None = "auto",
        attention_backend_options: Mapping[str, Mapping] | None = None,
        selection: LayerGroupSelection | None = None,
    ):
        _require_loaded(model)
        self.model: CausalLM = cast("CausalLM", model.eval())
        self.device = activation_dtype_device(model)[1]
        self.block_size = block_size
        requested = attention_backend or getattr(model, "requested_attention_backend", None)
        self.cache: CachePlan = plan_cache(
            self.model.attention_layers(),
            self.model.config,
            model_dtype=_model_dtype(model),
            block_size=block_size,
            requested=requested,
            kv_cache_dtype=kv_cache_dtype,
            options=attention_backend_options,
            selection=selection,
        )
        self.num_blocks: int | None = None
        self.steps = 0
        """Steps run so far (what a failure names)."""
        self._own_blocks: KVCacheManager | None = None  # made only when driven by hand (no block tables)
        self._table_source: str | None = None  # "caller" or "runner": who hands out this cache's blocks
        if num_blocks is not None:
            self.allocate_cache(num_blocks)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes across every attention layer (sum of the layers' spec.page_size_bytes)."""
        return self.cache.bytes_per_block

    def allocate_cache(self, num_blocks: int) -> None:
        """Allocate every layer's cache of `num_blocks` blocks and bind it (once)."""
        if self.num_blocks is not None:
            raise RuntimeError(f"the cache is already allocated ({self.num_blocks} blocks)")
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        self.cache.bind(num_blocks, self.device)
        self.num_blocks = num_blocks

    def whole_input_embeddings(self) -> torch.nn.Module:
        """The model's whole token table, for a model that looks tokens up outside the steps (an EAGLE-3 draft without
        its own); a tensor-parallel runner gathers it from the ranks."""
        return self.model.input_embeddings()

    def backend_for(self, layer_kind: str) -> str:
        """Name of the backend serving `layer_kind` layers (a `LayerKind`)."""
        return self.cache.selection.backend_for(layer_kind).backend_name

    def num_cached_tokens(self, request_id: Hashable) -> int:
        """Tokens the runner's own allocator holds for `request_id` (driven by hand; 0 if none)."""
        blocks = self._own_blocks
        return blocks.num_tokens(request_id) if blocks is not None and request_id in blocks else 0

    def prepare(self, requests: Sequence[StepRequest]) -> tuple[torch.Tensor, AttentionMetadata]:
        """Build (input_ids [T], metadata) for one step from the requests' block tables."""
        if not requests:
            raise ValueError("a step needs at least one StepRequest")
        if self.num_blocks is None:
            raise RuntimeError("the KV cache is not allocated yet; call allocate_cache(num_blocks) first")
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a request may appear once per step; got ids {ids}")
        metadata = self.cache.metadata_backend.prepare(
            self._rows(requests), self.block_size, self.cache.layout, self.device
        )
        tokens = torch.tensor([t for r in requests for t in r.token_ids], dtype=torch.long, device=self.device)
        return tokens, metadata

    def step(self, requests: Sequence[StepRequest]) -> torch.Tensor:
        """Run one step; returns logits [len(requests), vocab_size] for each request's last new token."""
        return self.step_with_all_logits(requests, ())[0]

    @torch.inference_mode()
    def step_with_all_logits(
        self, requests: Sequence[StepRequest], every_position: Collection[int]
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """`step`, plus logits [len(token_ids), vocab_size] at every new position of the requests at the indices
        `every_position` (prompt log-probabilities need them)."""
        tokens, metadata = self.prepare(requests)
        self.steps += 1
        try:
            hidden = self.model(tokens, metadata.positions, metadata)  # [T, hidden]
        except KernelRaised as err:
            raise located(err, self._layer_name(err.module), self._step_name(requests)) from err.cause
        decode = hidden.shape[0] == len(requests)  # one new token per request: every row is a last token
        last = hidden if decode else hidden[metadata.query_start_loc[1:].to(torch.long) - 1]
        if not every_position:
            return self._finite(self.model.compute_logits(last), requests), {}
        # one LM-head pass over the last rows and every row asked for: the head's weight is read once a step
        starts = metadata.query_start_loc.tolist()
        spans = [hidden[starts[i] : starts[i + 1]] for i in every_position]
        logits = self.model.compute_logits(torch.cat([last, *spans]))
        full = logits[len(requests) :].split([len(span) for span in spans])
        return self._finite(logits[: len(requests)], requests), dict(zip(every_position, full, strict=True))

    def free(self, request_id: Hashable) -> None:
        """Release a finished request's blocks from the runner's own allocator (driven by hand only)."""
        if self._own_blocks is None:
            raise KeyError(
                f"request {request_id!r} holds no blocks of this runner; its blocks belong to whoever "
                f"handed out its block table (the scheduler frees them)"
            )
        self._own_blocks.free(request_id)

    # -- internals -------------------------------------------------------------------------------
    def _finite(self, logits: torch.Tensor, requests: Sequence[StepRequest]) -> torch.Tensor:
        """`logits`, checked once per step: NaN or +inf means a kernel returned garbage, named as a failure (-inf is
        a mask: a banned token). One float32 sum is NaN or +inf exactly when a logit is (real logits never add up to
        3e38) and costs 1.2 ms where isfinite().all() costs 61 ms on [64, 128256] logits (one CPU thread)."""
        if not bool(logits.sum(dtype=torch.float32) < float("inf")):
            raise non_finite_logits(self._step_name(requests), self._backends_in_use())
        return logits

    def _backends_in_use(self) -> list[tuple[str, str]]:
        """(kind, name) of every attention and MoE backend the model's layers run."""
        from kernelbay_engine.layers.moe import moe_layers

        attention = dict.fromkeys(result.backend_name for _kind, result in self.cache.selection.groups)
        moe = dict.fromkeys(layer.backend.name for layer in moe_layers(self.model) if layer.backend is not None)
        return [("attention", name) for name in attention] + [("MoE", name) for name in moe]

    def _layer_name(self, module: object) -> str:
        return next((name for name, m in self.model.named_modules() if m is module), type(module).__name__)

    def _step_name(self, requests: Sequence[StepRequest]) -> str:
        """`engine step 3 (decode of 2 requests)`: which step, and what it ran (prefill, decode or mixed)."""
        if all(r.start_pos == 0 for r in requests):
            kind = "prefill"
        elif all(len(r.token_ids) == 1 for r in requests):
            kind = "decode"
        else:  # prompt chunks beside decodes, or several new tokens of a running request (speculative decoding)
            kind = "mixed step"
        count = f"{len(requests)} request{'s' if len(requests) > 1 else ''}"
        return f"engine step {self.steps} ({kind} of {count})"

    def _rows(self, requests: Sequence[StepRequest]) -> list[MetadataRow]:
        """The metadata rows: the given block tables, or blocks from the runner's own allocator."""
        sources = {"caller" if r.block_table is not None else "runner" for r in requests}
        if len(sources) > 1:
            raise ValueError("every request of a step brings its block table, or none does")
        source = sources.pop()
        if self._table_source not in (None, source):  # two allocators over one cache would share blocks
            raise ValueError(
                f"this runner's blocks are handed out by {_SOURCES[self._table_source]}; "
                f"a step cannot switch to {_SOURCES[source]}"
            )
        self._table_source = source
        if source == "caller":
            return [self._given_row(r) for r in requests]
        assert self.num_blocks is not None, "allocate_cache(num_blocks) before the first step"
        if self._own_blocks is None:
            self._own_blocks = KVCacheManager(self.num_blocks, self.block_size, self.cache.layout)
        return self._own_blocks.reserve_step([(r.request_id, r.start_pos, len(r.token_ids)) for r in requests])

    def _given_row(self, request: StepRequest) -> MetadataRow:
        assert self.num_blocks is not None, "allocate_cache(num_blocks) before the first step"
        if request.block_table and max(request.block_table) >= self.num_blocks:
            raise ValueError(
                f"request {request.request_id!r}: block table {request.block_table} names a block "
                f"beyond this runner's cache of {self.num_blocks} blocks"
            )
        assert request.block_table is not None  # a caller's row: it brings its table
        return MetadataRow(len(request.token_ids), request.start_pos, request.block_table)


_SOURCES = {
    "caller": "the caller's allocator (steps with block tables)",
    "runner": "the runner's own allocator (steps without block tables)",
}
