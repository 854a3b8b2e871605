"""explain's `sections.draft`: what an EAGLE-3 draft folder drafts for (the target's vocabulary and width, the
model type it names), its draft vocabulary, which target layers it reads, its weights, and whose embedding it uses."""

from __future__ import annotations

from pathlib import Path

from kernelbay.errors import KernelbayError
from kernelbay_engine.explain.text import COUNT_UNITS, scaled
from kernelbay_engine.speculative.eagle import declared_aux_layer_ids, target_hidden_size, target_model_type


def draft_section(config, _options: dict) -> dict | None:
    """None unless `config` is a draft's."""
    if not config.is_draft:
        return None
    section = {
        "target_model_type": target_model_type(config),
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": target_hidden_size(config),
        "aux_layer_ids": declared_aux_layer_ids(config),
        "parameters": draft_parameters(config),
        "embedding": _embedding(config),
        "kv_bytes_per_token": 2 * config.num_key_value_heads * config.head_dim * FLOAT32_BYTES,
    }
    section["lines"] = _lines(section)
    return section


FLOAT32_BYTES = 4
"""The proposer runs the draft, and keeps its keys and values, in float32 (speculative/eagle.py)."""


def draft_parameters(config) -> int:
    """The draft's own weights, its embedding aside (norms aside, as the config's count): fc, the layer's
    projections over [embedding, hidden] (2 x hidden wide), the MLP, the head over the draft vocabulary."""
    hidden, heads, kv_heads, dim = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    fc = 3 * target_hidden_size(config) * hidden
    attention = 2 * hidden * (heads + 2 * kv_heads) * dim + heads * dim * hidden
    return fc + attention + 3 * hidden * config.intermediate_size + config.draft_vocab_size * hidden


def _embedding(config) -> str | None:
    """ "own" when the folder stores `embed_tokens.weight`, "target" when its weights hold none (the target's table
    is used), None when the folder has no weights to tell."""
    from kernelbay_engine.loading import open_checkpoint

    try:
        names = open_checkpoint(Path(str(config.source))).names
    except KernelbayError:  # a config-only folder
        return None
    return "own" if any(n.removeprefix("model.") == "embed_tokens.weight" for n in names) else "target"


def _lines(s: dict) -> list[str]:
    trained = f", {s['target_model_type']} models" if s["target_model_type"] else ""
    layers = s["aux_layer_ids"]
    reads = (
        f"reads the input of target layers {', '.join(map(str, layers))}"
        if layers
        else "reads the input of target layers 2, L // 2 and L - 3 of the target's L (the default)"
    )
    embedding = {
        "own": "its own embedding",
        "target": "the target's embedding (the folder stores none)",
        None: "the embedding (no weights here to tell whose)",
    }
    total = s["parameters"]
    return [
        f"draft        EAGLE-3 head for targets with a {s['vocab_size']:,}-token vocabulary and hidden size "
        f"{s['target_hidden_size']:,}{trained}: a {s['draft_vocab_size']:,}-token draft vocabulary, {reads}; "
        f"{scaled(total, COUNT_UNITS, str(total))} parameters besides {embedding[s['embedding']]}",
        f"             runs in float32 beside the target; its keys and values take {s['kv_bytes_per_token']:,} "
        f"bytes per token of each running request (dense, outside the target's KV blocks)",
    ]
