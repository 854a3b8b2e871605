"""A tied LM head whose checkpoint stores a head of its own: what transformers does with it.

config.json may say `tie_word_embeddings: true` while the checkpoint also stores `lm_head.weight`. When the stored
head equals the embedding table, tying changes nothing. When it differs, transformers (5.x) keeps the stored head
untied, with a warning; kernelbay does the same, so both produce the same tokens, and says so.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn

from kernelbay_engine.loading.formats import WeightSource
from kernelbay_engine.loading.plan import make_plan

logger = logging.getLogger("kernelbay.models")
HEAD = "lm_head.weight"


def untie_a_different_stored_head(model: Any, checkpoint: WeightSource) -> bool:
    """Untie the LM head of `model` (a CausalLM whose config says tied) when the checkpoint stores a head that
    differs from the embedding table: the head then loads from the checkpoint. True when it did; call before
    loading the weights."""
    embedding = _shared_embedding(model)
    if embedding is None or HEAD not in checkpoint.names:
        return False
    embedding_name = _checkpoint_name_of(model, checkpoint, embedding)
    if embedding_name is None or _same_values(checkpoint, HEAD, embedding_name, embedding):
        return False
    note = (
        f"{checkpoint.folder}: tie_word_embeddings is true, but the checkpoint stores an lm_head.weight that differs "
        f"from {embedding_name}: the stored head is used, untied (as transformers does); set tie_word_embeddings to "
        "false in config.json to say so"
    )
    logger.warning(note)
    config = model.config
    model.config = dataclasses.replace(config, tie_word_embeddings=False, notes=(*config.notes, note))
    model.lm_head.weight = nn.Parameter(torch.empty(embedding.shape, dtype=embedding.dtype, device="meta"))
    model.lm_head.weight.requires_grad_(False)
    return True


def _shared_embedding(model: Any) -> torch.Tensor | None:
    """The embedding table when the model ties its LM head to it (the head holding that very tensor), else None."""
    head = getattr(model, "lm_head", None)
    if not getattr(model, "tied", False) or head is None or not hasattr(model, "input_embeddings"):
        return None
    embedding = model.input_embeddings()._parameters.get("weight")  # None when the table is held as a file's codes
    if embedding is None or head._parameters.get("weight") is not embedding:  # a quantized head holds its own
        return None
    return embedding


def _checkpoint_name_of(model: Any, checkpoint: WeightSource, param: torch.Tensor) -> str | None:
    """The checkpoint tensor that fills `param` whole (after the family's renames), if one does."""
    path = next(n for n, p in model.named_parameters(remove_duplicate=False) if p is param and n != HEAD)
    plan = make_plan(model, checkpoint.names, model.checkpoint_rules())
    return next((n for n, t in plan.assignments.items() if t.param == path and not t.index and not t.transposed), None)


def _same_values(checkpoint: WeightSource, head: str, embedding: str, param: torch.Tensor) -> bool:
    """Both tensors read as the model would hold them (its dtype), compared exactly."""
    if tuple(checkpoint.shape(head)) != tuple(checkpoint.shape(embedding)):
        return False
    values = [torch.empty(param.shape, dtype=param.dtype) for _ in range(2)]
    with checkpoint.reader() as reader:
        reader.read_into(head, values[0])
        reader.read_into(embedding, values[1])
    return torch.equal(values[0], values[1])
