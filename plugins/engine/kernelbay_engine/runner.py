"""`ModelRunner`: runs a kernelbay model one packed step at a time over a paged KV cache.

The runner owns the cache: at construction it selects an attention backend per layer group
(`select_for_model`: an explicit name, else the first backend capable of every group), allocates one
cache tensor per layer and binds it (`Attention.bind`). Each `step` takes any mix of prefills,
prefill chunks and decodes, builds one `AttentionMetadata`, runs the model on the packed tokens and
returns the logits of each request's last new token. Scheduling and sampling live above it
(`kernelbay.engine` scheduler / LLM).

    runner = ModelRunner(model, num_blocks=256, block_size=16)
    logits = runner.step([StepRequest("a", prompt_ids, 0)])            # prefill
    logits = runner.step([StepRequest("a", [next_id], len(prompt_ids))])  # decode
    runner.free("a")
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch

from kernelbay.attention import AttentionMetadata
from kernelbay_engine.kv_cache import KVCacheManager

from kernelbay_engine._runner_cache import CacheSetup, bind_attention, reserve_blocks


@dataclass(frozen=True, slots=True)
class StepRequest:
    """One request's new tokens in a step: `token_ids` sit at positions start_pos, start_pos + 1, ..."""

    request_id: Hashable
    token_ids: tuple[int, ...]
    start_pos: int
    """Tokens of this request already in the cache (0 for a new request)."""

    def __post_init__(self):
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        if not self.token_ids:
            raise ValueError(f"request {self.request_id!r}: a step needs at least one new token")
        if self.start_pos < 0:
            raise ValueError(f"request {self.request_id!r}: start_pos must be >= 0, got {self.start_pos}")


def _model_dtype(model: torch.nn.Module) -> str:
    """The dtype activations run in: the embedding table's (FP8 layers dequantise into it)."""
    return str(model.model.embed_tokens.weight.dtype).removeprefix("torch.")


def _require_loaded(model: torch.nn.Module) -> None:
    meta = [name for name, p in model.named_parameters() if p.is_meta]
    if meta:
        raise ValueError(f"the model's weights are not loaded ({len(meta)} parameters still on the meta device, "
                         f"e.g. {meta[0]}); use AutoModelForCausalLM.from_pretrained, or load_weights after from_config")


class ModelRunner:
    """Binds `model`'s attention layers to a paged cache of `num_blocks` x `block_size` tokens and runs steps."""

    def __init__(self, model: torch.nn.Module, *, num_blocks: int, block_size: int = 16,
                 attention_backend: str | None = None, kv_cache_dtype: str | None = "auto",
                 attention_backend_options: Mapping[str, Mapping] | None = None):
        _require_loaded(model)
        self.model = model.eval()
        self.device = model.model.embed_tokens.weight.device
        requested = attention_backend or getattr(model, "requested_attention_backend", None)
        self.cache: CacheSetup = bind_attention(
            model.attention_layers(), model.config, model_dtype=_model_dtype(model), num_blocks=num_blocks,
            block_size=block_size, requested=requested, kv_cache_dtype=kv_cache_dtype,
            options=attention_backend_options, device=self.device)
        self.kv = KVCacheManager(num_blocks, block_size, self.cache.layout)

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    def backend_for(self, layer_kind: str) -> str:
        """Name of the backend serving `layer_kind` layers ("full_attention", "sliding_attention", ...)."""
        return self.cache.selection.backend_for(layer_kind).backend_name

    def num_cached_tokens(self, request_id: Hashable) -> int:
        return self.kv.num_tokens(request_id) if request_id in self.kv else 0

    def prepare(self, requests: Sequence[StepRequest]) -> tuple[torch.Tensor, AttentionMetadata]:
        """Reserve cache blocks and build (input_ids [T], metadata) for one step."""
        if not requests:
            raise ValueError("a step needs at least one StepRequest")
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"a request may appear once per step; got ids {ids}")
        reserve_blocks(self.kv, [(r.request_id, r.start_pos, len(r.token_ids)) for r in requests])
        rows = [self.kv.step_request(r.request_id, len(r.token_ids)) for r in requests]
        metadata = self.cache.metadata_backend.prepare(rows, self.block_size, self.cache.layout, self.device)
        tokens = torch.tensor([t for r in requests for t in r.token_ids], dtype=torch.long, device=self.device)
        return tokens, metadata

    @torch.inference_mode()
    def step(self, requests: Sequence[StepRequest]) -> torch.Tensor:
        """Run one step; returns logits [len(requests), vocab_size] for each request's last new token."""
        tokens, metadata = self.prepare(requests)
        hidden = self.model(tokens, metadata.positions, metadata)  # [T, hidden]
        last = metadata.query_start_loc[1:].to(torch.long) - 1
        return self.model.compute_logits(hidden[last])

    def free(self, request_id: Hashable) -> None:
        """Release a finished (or preempted) request's cache blocks."""
        self.kv.free(request_id)
