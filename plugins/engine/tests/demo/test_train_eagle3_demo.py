"""The pieces of examples/train_eagle3_demo.py, on tiny random inputs (no apt, no real training)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
SCRIPT = EXAMPLES / "train_eagle3_demo.py"


@pytest.fixture(scope="module")
def trainer():
    sys.path.insert(0, str(EXAMPLES))  # the script imports make_demo_checkpoint's corpus functions
    spec = importlib.util.spec_from_file_location("train_eagle3_demo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
        sys.modules.pop("make_demo_checkpoint", None)
        sys.path.remove(str(EXAMPLES))


def tiny_geometry(trainer, vocab: int = 40, draft_vocab: int = 24):
    return trainer.DraftGeometry(
        hidden_size=32,
        intermediate_size=48,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        aux_layers=(0, 1, 2),
    )


def random_draft(trainer, seed: int = 0):
    """A tiny DraftHead with random weights (norms too) and an every-other-token draft vocabulary."""
    torch.manual_seed(seed)
    g = tiny_geometry(trainer)
    draft = trainer.DraftHead(g)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
        stream = torch.arange(0, g.vocab_size, 2).repeat(3)[: g.vocab_size * 2]
        d2t, t2d = trainer.draft_vocabulary(torch.cat([stream, torch.arange(g.vocab_size)]), g.vocab_size, 24)
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
    return draft.eval()


def reference_layer(draft, embeds, hidden, positions, past: list[tuple[torch.Tensor, torch.Tensor]]):
    """The draft layer as an engine runs it: causal attention over every earlier row's cached K/V plus its own.

    RoPE from transformers' Llama, attention by scaled_dot_product_attention; appends this call's K/V to past.
    """
    g, layer = draft.geometry, draft.midlayer
    attn = layer.self_attn
    b, t, _ = embeds.shape
    x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
    q = attn.q_proj(x).view(b, t, g.num_heads, g.head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(b, t, g.num_kv_heads, g.head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, g.num_kv_heads, g.head_dim).transpose(1, 2)
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=8, max_position_embeddings=64)
    cos, sin = LlamaRotaryEmbedding(config)(x, positions[None, :])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    past.append((k, v))
    keys = torch.cat([kk for kk, _ in past], dim=2).repeat_interleave(2, dim=1)
    values = torch.cat([vv for _, vv in past], dim=2).repeat_interleave(2, dim=1)
    earlier = keys.shape[2] - t
    mask = torch.ones(t, keys.shape[2], dtype=torch.bool).tril(diagonal=earlier)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    h1 = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
    h2 = h1 + layer.mlp(layer.post_attention_layernorm(h1))
    return h2, draft.lm_head(draft.norm(h2))


def reference_chain(draft, embed, ids, aux, p: int, k: int) -> list[int]:
    """k proposals after the target produced ids[p + 1] at position p: prefill rows 0..p, then one row a step."""
    past: list[tuple[torch.Tensor, torch.Tensor]] = []
    hidden, logits = reference_layer(
        draft, embed(ids[:, 1 : p + 2]), draft.fc(aux[:, : p + 1]), torch.arange(p + 1), past
    )
    hidden, token = hidden[:, -1:], draft.to_target(logits[:, -1:].argmax(-1))
    chain = [int(token)]
    for j in range(1, k):
        hidden, logits = reference_layer(draft, embed(token), hidden, torch.tensor([p + j]), past)
        token = draft.to_target(logits.argmax(-1))
        chain.append(int(token))
    return chain


def test_batched_proposals_equal_the_engine_style_chain_at_every_row(trainer):
    """One training-time-test pass proposes, at every row, exactly what a KV-cached sequential draft proposes."""
    draft = random_draft(trainer)
    g = draft.geometry
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, g.vocab_size, (1, 12), generator=generator)
    aux = torch.randn(1, 12, 3 * g.hidden_size, generator=generator)
    embed = torch.nn.Embedding(g.vocab_size, g.hidden_size)
    k = 4
    with torch.no_grad():
        batched = trainer.proposals(draft, embed, ids, aux, k)
        for p in range(10):
            assert batched[0, p].tolist() == reference_chain(draft, embed, ids, aux, p, k), f"row {p}"


def test_draft_vocabulary_takes_the_most_frequent_tokens_sorted(trainer):
    """The draft vocabulary is the top-N tokens by count (ties: lower id), in target-id order, maps consistent."""
    stream = torch.tensor([5, 5, 5, 3, 3, 9, 9, 7, 1])
    d2t, t2d = trainer.draft_vocabulary(stream, vocab_size=10, size=3)
    target_ids = torch.arange(3) + d2t
    assert target_ids.tolist() == [3, 5, 9]  # 5 (3x), then 3 and 9 (2x each); 7 and 1 (1x) left out
    assert t2d.nonzero().flatten().tolist() == [3, 5, 9]


def test_ttt_loss_trains_every_unrolled_step(trainer):
    """The unrolled loss is finite, reaches every parameter, and a few AdamW steps lower it."""
    draft = random_draft(trainer).train()
    g = draft.geometry
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(0, g.vocab_size, (2, 16), generator=generator)
    aux = torch.randn(2, 16, 3 * g.hidden_size, generator=generator)
    logits = torch.randn(2, 16, g.vocab_size, generator=generator) * 3
    embed = torch.nn.Embedding(g.vocab_size, g.hidden_size).requires_grad_(False)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss, agreement = trainer.ttt_loss(draft, embed, ids, aux, logits, steps=3)
        optimizer.zero_grad()
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in draft.parameters())
        optimizer.step()
        losses.append(loss.item())
        assert len(agreement) == 3
    assert losses[-1] < losses[0]


def test_written_folder_loads_back_with_its_vocabulary(trainer, tmp_path):
    """write_folder stores the format's tensors (weights in bfloat16) and load_draft reads the same draft back."""
    from transformers import LlamaForCausalLM

    draft = random_draft(trainer)
    config = LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2,
    )  # fmt: skip
    trainer.write_folder(tmp_path, draft, LlamaForCausalLM(config), copyright_text="BSD\n")
    loaded = trainer.load_draft(tmp_path)
    assert loaded.geometry == draft.geometry
    assert torch.equal(loaded.d2t, draft.d2t) and torch.equal(loaded.t2d, draft.t2d)
    torch.testing.assert_close(loaded.fc.weight, draft.fc.weight.to(torch.bfloat16).float())


@pytest.mark.parametrize("field, value", [("steps", 0), ("ttt_steps", 0), ("warmup", 5000), ("lr", 2.0)])
def test_settings_reject_bad_values_naming_the_flag(trainer, field, value):
    """Each bad setting is refused with the command-line flag to change."""
    with pytest.raises(ValueError, match=f"--{field.replace('_', '-')}"):
        trainer.DraftSettings(**{field: value})
