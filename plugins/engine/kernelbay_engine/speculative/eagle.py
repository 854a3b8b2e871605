"""EAGLE-3 proposals: a one-layer draft model reads the target's hidden states and guesses the next tokens.

The draft (the `draft_model` slot `EAGLE3<Arch>`, e.g. kernelbay-llama's `EAGLE3LlamaForCausalLM`) pairs, at each
position p the target computed, the token after it with the residual stream entering three of the target's layers
(its aux layers) at p, and predicts the token after that (vLLM's alignment). Forward pre-hooks on the aux layers
keep those rows each step (`AuxHiddenStates`; installed only with a draft). With tensor parallelism they sit on rank
0's shard, in the driver: the residual stream is whole on every rank after each all-reduce, so the draft runs there,
unsharded, on the rows of one process. `EagleProposer`:

- `observe(chunks)` after each target step: the rows of every chunk it ran, by request and position;
- `propose_requests(requests, limits)` before the next: ingests the rows of positions the target kept (prefill
  chunks, a decode's token, accepted proposals; rejected ones are dropped) into each request's own draft keys and
  values, in one batched draft forward, whose last row per decoding request gives the first guess; then one row
  per further guess, each fed the previous row's output as its hidden input, argmax over the draft vocabulary
  mapped to target ids by `d2t`. The guesses' keys and values are discarded: the next step ingests the accepted
  ones from the target's own hidden states.

A request's draft cache follows its target cache: a chunk starting at position s drops every draft row at or past
s; the engine releases the cache of a request that finishes, is aborted or preempted, and the rows it covers are
kept by the prefix-cache hash of each full block (`_SavedPrefixes`, least recently used dropped past
SAVED_DRAFT_BYTES): a prefix served from the prefix cache is never run by the target again, so a request starting
on one takes the draft rows from there. Where none are kept, the draft attends only from where the target started
computing: proposals may be worse, never wrong (the target verifies every one).

The draft runs in float32, its keys and values dense per request with torch's SDPA (one layer: small).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import nn
from torch.nn import functional as F

from kernelbay.errors import ConfigError
from kernelbay_engine.errors import DraftMismatch, MissingWeights

if TYPE_CHECKING:
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.loading import NameRules
    from kernelbay_engine.models.base import CausalLM
    from kernelbay_engine.request import Request
    from kernelbay_engine.scheduler import ScheduledChunk

NUM_AUX_LAYERS = 3


class DraftModel(Protocol):
    """What the proposer asks of a draft model class (kernelbay_llama.eagle3.EAGLE3LlamaForCausalLM is one)."""

    shape: tuple[int, int, int]  # (heads, kv_heads, head_dim)
    attention_scale: float

    def aux_layer_ids(self, target_num_layers: int) -> tuple[int, ...]: ...
    def embed(self, token_ids: torch.Tensor) -> torch.Tensor: ...
    def fuse(self, aux: torch.Tensor) -> torch.Tensor: ...
    def attention_inputs(
        self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...
    def layer_output(self, hidden: torch.Tensor, attention: torch.Tensor) -> torch.Tensor: ...
    def draft_logits(self, output: torch.Tensor) -> torch.Tensor: ...
    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor: ...
    def checkpoint_rules(self) -> NameRules: ...
    def use_target_embedding(self, embedding: nn.Module) -> None: ...


# -- the folder, checked against the target --------------------------------------------------------------------
def read_draft_config(folder: str | Path, target: ModelConfig, *, trust_remote_code: bool = False) -> ModelConfig:
    """The draft folder's config, checked against the target's config before any weight is read."""
    from kernelbay_engine.config import ModelConfig
    from kernelbay_engine.inputs import check_model_folder

    config = ModelConfig.from_pretrained(check_model_folder(folder), trust_remote_code=trust_remote_code)
    check_draft(config, target)
    return config


def check_draft(draft: ModelConfig, target: ModelConfig) -> None:
    """Every way `draft` cannot draft for `target` (DraftMismatch naming the field): not a draft, trained for another
    model type, another vocabulary or hidden size, aux layers the target does not have."""
    where = f"speculative={draft.source!r}"
    if not draft.is_draft:
        raise DraftMismatch(
            f"{where} is a {draft.architecture} checkpoint, not an EAGLE-3 draft (its config.json has no "
            f"draft_vocab_size); give a draft folder trained for this model, or speculative='ngram'"
        )
    trained_for = target_model_type(draft)
    if trained_for and trained_for != target.model_type:
        raise DraftMismatch(
            f"{where} is a draft for {trained_for!r} models (target_model_type), but the target is a "
            f"{target.model_type!r} model ({target.architecture}); use a draft trained for this model"
        )
    if draft.vocab_size != target.vocab_size:
        raise DraftMismatch(
            f"{where}: the draft's vocab_size is {draft.vocab_size} but the target's vocabulary has "
            f"{target.vocab_size} tokens; the draft must be trained for this target's tokenizer"
        )
    _check_hidden_size(draft, target, where)
    _check_aux_layers(draft, target, where)


def target_hidden_size(draft: ModelConfig) -> int:
    """Width of each target hidden state the draft fuses: `target_hidden_size`, else the draft's own hidden_size."""
    value = getattr(draft.hf_config, "target_hidden_size", None)
    if value is None:
        return draft.hidden_size
    if type(value) is not int or value < 1:
        raise ConfigError(
            f"{draft.source}: target_hidden_size must be a positive int (the target's hidden_size), got {value!r}"
        )
    return value


def target_model_type(draft: ModelConfig) -> str | None:
    """The model type the draft says it was trained for (`target_model_type`), None when it does not say."""
    value = getattr(draft.hf_config, "target_model_type", None)
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise ConfigError(f'{draft.source}: target_model_type must name a model type (e.g. "llama"), got {value!r}')


def _check_hidden_size(draft: ModelConfig, target: ModelConfig, where: str) -> None:
    width = target_hidden_size(draft)
    if width != target.hidden_size:
        field = "target_hidden_size" if getattr(draft.hf_config, "target_hidden_size", None) else "hidden_size"
        raise DraftMismatch(
            f"{where}: the draft fuses target hidden states {width} wide ({field}), but the target's hidden_size is "
            f"{target.hidden_size}; the draft was trained for another model"
        )


def aux_layer_ids(draft: ModelConfig, target_num_layers: int) -> tuple[int, ...]:
    """The target layers the draft reads (their input residual stream): the draft config's
    `eagle_config.eagle_aux_hidden_state_layer_ids`, else EAGLE-3's default (2, L // 2, L - 3)."""
    ids = declared_aux_layer_ids(draft)
    return tuple(ids) if ids else (2, target_num_layers // 2, target_num_layers - 3)


def declared_aux_layer_ids(draft: ModelConfig) -> list[int] | None:
    """`eagle_config.eagle_aux_hidden_state_layer_ids` as the draft config gives them (None: not given); a value that
    is no list of layer indices is a ConfigError naming the field."""
    eagle = getattr(draft.hf_config, "eagle_config", None)
    if eagle is None:
        return None
    if not isinstance(eagle, dict):
        raise ConfigError(f"{draft.source}: eagle_config must be an object (as SpecForge writes it), got {eagle!r}")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        return None
    if not (isinstance(ids, list) and ids and all(type(i) is int and i >= 0 for i in ids)):
        raise ConfigError(
            f"{draft.source}: eagle_config.eagle_aux_hidden_state_layer_ids must be a list of target layer indices "
            f"(ints >= 0, e.g. [2, 16, 29]), got {ids!r}; remove it for EAGLE-3's default (2, L // 2, L - 3)"
        )
    return list(ids)


def _check_aux_layers(draft: ModelConfig, target: ModelConfig, where: str) -> None:
    ids = aux_layer_ids(draft, target.num_hidden_layers)
    given = "eagle_config.eagle_aux_hidden_state_layer_ids" if declared_aux_layer_ids(draft) else "the default"
    if len(ids) != NUM_AUX_LAYERS:
        raise DraftMismatch(f"{where}: {given} names {len(ids)} layers {list(ids)}; EAGLE-3 fuses exactly 3")
    outside = [i for i in ids if not 0 <= i < target.num_hidden_layers]
    if outside:
        raise DraftMismatch(
            f"{where}: the draft reads target layers {list(ids)} ({given}), but the target has "
            f"{target.num_hidden_layers} layers (0..{target.num_hidden_layers - 1}); layers {outside} do not exist: "
            f"the draft was trained for a deeper model"
        )


def load_draft(
    config: ModelConfig, target_embedding: Callable[[], nn.Module], *, progress: bool | None = None
) -> nn.Module:
    """The draft model of `config` (read by `read_draft_config`), resolved through the `draft_model` slot, its weights
    read in float32; without `embed_tokens.weight` in the folder it looks tokens up in the target's table, which
    `target_embedding()` gives (`ModelRunner.whole_input_embeddings`: called only then)."""
    from kernelbay_engine.inputs import model_errors
    from kernelbay_engine.loading import load_weights, open_checkpoint
    from kernelbay_engine.models.auto import AutoModelForCausalLM

    folder = Path(str(config.source))
    with model_errors():
        model = AutoModelForCausalLM.from_config(config, dtype="float32")
        draft = cast(DraftModel, model)
        checkpoint = open_checkpoint(folder)
        rules = draft.checkpoint_rules()
        stored = {rules.rename(name): name for name in checkpoint.names}
        _check_tensors(checkpoint, stored, config)
        if "embed_tokens.weight" not in stored:
            draft.use_target_embedding(target_embedding())
        load_weights(model, checkpoint, rules, progress=progress)
    _check_d2t(draft, config)
    return model.eval()


def _check_tensors(checkpoint, stored: dict[str, str], config: ModelConfig) -> None:
    """d2t present; t2d, when stored, one entry per target token."""
    if "d2t" not in stored:
        raise MissingWeights(
            f"{checkpoint.folder}: the draft has no d2t tensor (draft id -> target id offsets, "
            f"[{config.draft_vocab_size}] int64); an EAGLE-3 draft folder needs it (SpecForge saves it)"
        )
    if "t2d" in stored:
        (length,) = tuple(checkpoint.shape(stored["t2d"]))[:1] or (0,)
        if length != config.vocab_size:
            raise DraftMismatch(
                f"{checkpoint.folder}: t2d has {length} entries but the vocabulary has {config.vocab_size} tokens "
                f"(vocab_size); the draft's vocabulary maps were made for another tokenizer"
            )


def _check_d2t(draft: DraftModel, config: ModelConfig) -> None:
    """Every draft id maps into the target's vocabulary."""
    assert config.draft_vocab_size is not None  # a draft's config
    with torch.inference_mode():
        target_ids = draft.to_target(torch.arange(config.draft_vocab_size))
    if not (0 <= int(target_ids.min()) and int(target_ids.max()) < config.vocab_size):
        raise DraftMismatch(
            f"{config.source}: d2t maps draft ids to target ids outside [0, {config.vocab_size}); the draft's "
            f"vocabulary map is corrupt or made for another tokenizer"
        )


# -- the target's hidden states --------------------------------------------------------------------------------
class AuxHiddenStates:
    """The residual stream entering each aux layer of the target, kept by a forward pre-hook every step (float32)."""

    def __init__(self, target: nn.Module, layer_ids: Sequence[int]):
        layers = _decoder_layers(target)
        self.layer_ids = tuple(layer_ids)
        self._rows: dict[int, torch.Tensor] = {}
        self._handles = [
            layers[i].register_forward_pre_hook(self._keeper(i), with_kwargs=True) for i in sorted(set(self.layer_ids))
        ]

    def _keeper(self, index: int):
        def keep(_module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]  # transformers' layers may take it by name
            self._rows[index] = x.reshape(-1, x.shape[-1]).to(torch.float32, copy=True)  # the layer may update x

        return keep

    def take(self) -> torch.Tensor | None:
        """[T, 3 * hidden]: the last step's rows, the aux layers' inputs side by side (None if no step ran)."""
        if len(self._rows) < len(set(self.layer_ids)):
            return None
        rows = torch.cat([self._rows[i] for i in self.layer_ids], dim=-1)
        self._rows.clear()
        return rows


def _decoder_layers(target: nn.Module) -> Sequence[nn.Module]:
    layers = getattr(getattr(target, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise DraftMismatch(
            f"the target {type(target).__name__} keeps no decoder layers at model.layers, so an EAGLE-3 draft cannot "
            f"read its hidden states; use speculative='ngram' with this model"
        )
    return cast(Sequence[nn.Module], layers)


# -- per-request draft state -----------------------------------------------------------------------------------
@dataclass(slots=True)
class _DraftCache:
    """One request's draft keys and values (positions ascending) and the target rows not yet ingested."""

    keys: torch.Tensor | None = None  # [capacity, kv_heads, D]
    values: torch.Tensor | None = None
    positions: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    length: int = 0
    pending_start: int = 0
    pending: torch.Tensor | None = None  # [m, 3 * target_hidden]: rows of positions pending_start ...
    block_aux: dict[int, torch.Tensor] = field(default_factory=dict)
    """The target rows [3 * target_hidden] ingested at the last position of each full block (what a later request
    starting after that block needs: `_SavedPrefixes`)."""

    def receive(self, start: int, rows: torch.Tensor) -> None:
        """The target computed positions start .. start + len(rows) - 1: anything of ours at or past `start` is
        stale."""
        self.truncate(start)
        pending = self.pending
        if pending is not None and self.pending_start + len(pending) == start:
            self.pending = torch.cat([pending, rows])
        else:
            self.pending, self.pending_start = rows, start

    def truncate(self, position: int) -> None:
        self.length = int(torch.searchsorted(self.positions[: self.length], position))
        self.block_aux = {p: row for p, row in self.block_aux.items() if p < position}
        if self.pending is not None:
            keep = position - self.pending_start
            self.pending = self.pending[:keep] if keep > 0 else None

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        need = self.length + len(keys)
        if self.keys is None or self.values is None or need > len(self.keys):
            self._grow(max(need, 2 * self.length, 64), keys)
        assert self.keys is not None and self.values is not None
        self.keys[self.length : need] = keys
        self.values[self.length : need] = values
        self.positions[self.length : need] = positions
        self.length = need

    def _grow(self, capacity: int, like: torch.Tensor) -> None:
        keys, values = (like.new_empty((capacity, *like.shape[1:])) for _ in range(2))
        positions = torch.empty(capacity, dtype=torch.long)
        if self.keys is not None and self.values is not None:
            keys[: self.length], values[: self.length] = self.keys[: self.length], self.values[: self.length]
            positions[: self.length] = self.positions[: self.length]
        self.keys, self.values, self.positions = keys, values, positions

    def cached(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert self.keys is not None and self.values is not None
        n = self.length
        return self.keys[:n], self.values[:n], self.positions[:n]

    def contiguous(self) -> int:
        """n: the rows of positions 0 .. n - 1 are all here (positions are ascending and distinct)."""
        return int((self.positions[: self.length] == torch.arange(self.length)).sum())


SAVED_DRAFT_BYTES = 64 * 2**20
"""Draft keys and values of released requests kept for later prompts that start with their prefix."""


@dataclass(slots=True)
class _Saved:
    keys: torch.Tensor  # [n, kv_heads, D]: the draft rows of positions 0 .. n - 1
    values: torch.Tensor
    block_aux: dict[int, torch.Tensor]  # the target rows at the last position of each full block it covers


class _SavedPrefixes:
    """Draft caches of released requests, found by the prefix-cache hash of each full block they cover (least
    recently used dropped past `max_tokens`). A request admitted on a cached prefix of s tokens is not computed
    there by the target, so its draft could not ingest those positions; it starts from the saved rows 0 .. s - 2
    and the target row at s - 1 instead (the same rows: they depend only on the prefix)."""

    def __init__(self, max_tokens: int, block_size: int):
        self.max_tokens, self.block_size = max_tokens, block_size
        self._saved: OrderedDict[int, tuple[_Saved, list[bytes]]] = OrderedDict()
        self._index: dict[bytes, int] = {}
        self._tokens = self._count = 0

    def save(self, hashes: Sequence[bytes], state: _DraftCache) -> None:
        covered = state.contiguous()
        ends = ((h, (j + 1) * self.block_size) for j, h in enumerate(hashes))
        usable = [(h, end) for h, end in ends if end - 1 <= covered and end - 1 in state.block_aux]
        if not usable or state.keys is None or state.values is None:
            return
        rows = usable[-1][1] - 1
        aux = {end - 1: state.block_aux[end - 1] for _, end in usable}
        saved = _Saved(state.keys[:rows].clone(), state.values[:rows].clone(), aux)
        self._count += 1
        self._saved[self._count] = (saved, [h for h, _ in usable])
        self._index.update((h, self._count) for h, _ in usable)
        self._tokens += rows
        while self._tokens > self.max_tokens and self._saved:
            self._drop_oldest()

    def restore(self, hashes: Sequence[bytes], start: int, state: _DraftCache) -> None:
        """Fill an empty `state` for a request whose target starts computing at `start` (after a cached prefix)."""
        blocks, partial = divmod(start, self.block_size)
        key = self._index.get(hashes[blocks - 1]) if blocks and not partial and len(hashes) >= blocks else None
        if key is None:
            return
        self._saved.move_to_end(key)
        saved = self._saved[key][0]
        state.append(saved.keys[: start - 1], saved.values[: start - 1], torch.arange(start - 1))
        state.block_aux = {p: row for p, row in saved.block_aux.items() if p < start}
        state.pending, state.pending_start = saved.block_aux[start - 1][None], start - 1

    def _drop_oldest(self) -> None:
        key, (saved, hashes) = self._saved.popitem(last=False)
        self._tokens -= len(saved.keys)
        for h in hashes:
            if self._index.get(h) == key:
                del self._index[h]


@dataclass(slots=True)
class _Ingest:
    """One request's rows in the batched ingestion forward."""

    request: Request
    state: _DraftCache
    positions: torch.Tensor
    token_ids: list[int]
    aux: torch.Tensor


class EagleProposer:
    """Proposals from an EAGLE-3 draft for each decoding request (see the module docstring)."""

    def __init__(self, draft: nn.Module, target: nn.Module, num_speculative_tokens: int, *, block_size: int):
        """`block_size`: the target cache's (prefix-cache hashes cover blocks of it)."""
        self.draft: DraftModel = draft  # type: ignore[assignment]  # a draft model class (the DraftModel protocol)
        self.num_speculative_tokens = num_speculative_tokens
        self.block_size = block_size
        target_layers = cast("CausalLM", target).config.num_hidden_layers
        self.aux = AuxHiddenStates(target, self.draft.aux_layer_ids(target_layers))
        self._states: dict[Hashable, _DraftCache] = {}
        _, kv_heads, head_dim = self.draft.shape
        self._saved = _SavedPrefixes(SAVED_DRAFT_BYTES // (2 * kv_heads * head_dim * 4), block_size)

    def observe(self, chunks: Sequence[ScheduledChunk]) -> None:
        """After a target step over `chunks` (in the step's token order): keep each chunk's aux rows."""
        rows = self.aux.take()
        if rows is None:
            return
        offset = 0
        for chunk in chunks:
            count, request = len(chunk.token_ids), chunk.request
            state = self._states.get(request.request_id)
            if state is None:  # a new request, or one preempted and recomputed: after a cached prefix, maybe
                state = self._states[request.request_id] = _DraftCache()
                self._saved.restore(request.block_hashes, chunk.start_pos, state)
            state.receive(chunk.start_pos, rows[offset : offset + count])
            offset += count

    def release(self, request: Request) -> None:
        """The request left the running batch (finished, aborted, preempted): its draft cache goes, kept by the
        prefix-cache hashes of the full blocks it covers for later requests on that prefix."""
        state = self._states.pop(request.request_id, None)
        if state is not None and request.block_hashes:
            self._saved.save(request.block_hashes, state)

    @torch.inference_mode()
    def propose_requests(self, requests: Sequence[Request], limits: Sequence[int]) -> list[list[int]]:
        """Each running request's proposals (up to min(limit, num_speculative_tokens); limit 0: none, its rows are
        still ingested)."""
        ingests = [i for i in (self._ingest_of(r) for r in requests) if i is not None]
        counts: dict[Hashable, int] = {
            r.request_id: min(limit, self.num_speculative_tokens) for r, limit in zip(requests, limits, strict=True)
        }
        proposals: dict[Hashable, list[int]] = {}
        if ingests:
            proposals = self._ingest_and_propose(ingests, counts)
        return [proposals.get(r.request_id, []) for r in requests]

    # -- internals -------------------------------------------------------------------------------------------
    def _ingest_of(self, request: Request) -> _Ingest | None:
        """The rows of `request` the target kept that its draft cache lacks (positions before its cached length, whose
        next token is known)."""
        state = self._states.get(request.request_id)
        if state is None or state.pending is None:
            return None
        start, pending = state.pending_start, state.pending
        end = min(start + len(pending), request.num_cached, request.num_tokens - 1)
        state.pending = None
        if end <= start:
            return None
        tokens = request.all_token_ids()[start + 1 : end + 1]  # each position's row pairs with the token after it
        first_block_end = -(-(start + 1) // self.block_size) * self.block_size  # the first block end past start
        for last in range(first_block_end - 1, end, self.block_size):
            state.block_aux[last] = pending[last - start].clone()  # not a view: the step's rows may go
        return _Ingest(request, state, torch.arange(start, end), tokens, pending[: end - start])

    def _ingest_and_propose(self, ingests: list[_Ingest], counts: dict[Hashable, int]) -> dict[Hashable, list[int]]:
        draft = self.draft
        token_ids = torch.tensor([t for i in ingests for t in i.token_ids], dtype=torch.long)
        positions = torch.cat([i.positions for i in ingests])
        hidden = draft.fuse(torch.cat([i.aux for i in ingests]))
        q, k, v = draft.attention_inputs(draft.embed(token_ids), hidden, positions)
        outputs, offset = [], 0
        for ingest in ingests:
            n = len(ingest.token_ids)
            ingest.state.append(k[offset : offset + n], v[offset : offset + n], ingest.positions)
            outputs.append(self._attend(q[offset : offset + n], *ingest.state.cached(), ingest.positions))
            offset += n
        layer_out = draft.layer_output(hidden, torch.cat(outputs))
        ends = torch.tensor([len(i.token_ids) for i in ingests]).cumsum(0) - 1
        proposing = [
            j
            for j, i in enumerate(ingests)
            if counts.get(i.request.request_id, 0) > 0 and int(i.positions[-1]) == i.request.num_tokens - 2
        ]
        if not proposing:
            return {}
        rows = ends[proposing]
        return self._guess([ingests[j] for j in proposing], layer_out[rows], counts)

    def _guess(self, ingests: list[_Ingest], outputs: torch.Tensor, counts: dict[Hashable, int]):
        """Autoregressive guesses from each request's last ingested row (its output `outputs[j]`): the first from that
        row, each next from a row fed the previous guess and output, attending to the request's cache and the earlier
        guesses' keys and values, which are appended to it for this call only (truncated back at the end)."""
        draft = self.draft
        guesses: dict[Hashable, list[int]] = {i.request.request_id: [] for i in ingests}
        lengths = [i.state.length for i in ingests]
        active = list(range(len(ingests)))
        position = torch.tensor([int(i.positions[-1]) for i in ingests])
        try:
            while True:
                tokens = draft.to_target(draft.draft_logits(outputs).argmax(dim=-1))
                for j, token in zip(active, tokens.tolist(), strict=True):
                    guesses[ingests[j].request.request_id].append(int(token))
                keep = [
                    n
                    for n, j in enumerate(active)
                    if len(guesses[ingests[j].request.request_id]) < counts[ingests[j].request.request_id]
                ]
                if not keep:
                    return guesses
                active = [active[n] for n in keep]
                hidden, tokens = outputs[keep], tokens[keep]
                position[active] += 1
                q, k, v = draft.attention_inputs(draft.embed(tokens), hidden, position[active])
                attended = []
                for n, j in enumerate(active):
                    state = ingests[j].state
                    state.append(k[n : n + 1], v[n : n + 1], position[j : j + 1])
                    keys, values, _ = state.cached()
                    attended.append(self._attend(q[n : n + 1], keys, values))
                outputs = draft.layer_output(hidden, torch.cat(attended))
        finally:
            for ingest, length in zip(ingests, lengths, strict=True):
                ingest.state.length = length  # the guesses' rows go: the target's verdict decides what is ingested

    def _attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        key_positions: torch.Tensor | None = None,
        query_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of q [m, heads, D] over keys/values [n, kv_heads, D] -> [m, heads * D]; with positions, each
        query sees only the keys at or before its own (causal), else every key."""
        mask = None
        if key_positions is not None and query_positions is not None:
            mask = key_positions[None, :] <= query_positions[:, None]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            keys.transpose(0, 1)[None],
            values.transpose(0, 1)[None],
            attn_mask=mask,
            scale=self.draft.attention_scale,
            enable_gqa=True,
        )  # [1, heads, m, D]
        return out[0].transpose(0, 1).reshape(q.shape[0], -1)
