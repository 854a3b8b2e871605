"""Sparse mode "dsa" in the protocol: the indexer geometry, its keys in the MLA cache plane, topk_indices checks."""

from __future__ import annotations

import pytest
import torch

from kernelbay.attention import (
    AttentionForwardArgs,
    AttentionGeometry,
    AttentionRequirements,
    IndexerSpec,
    KVCacheSpec,
    KVLayout,
    MLASpec,
    create_attention,
)

MLA = MLASpec(kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
INDEXER = IndexerSpec(index_n_heads=2, index_head_dim=6, index_topk=3)


def _layer(layout: str = "NHD", indexer=INDEXER):
    proj = torch.nn.Linear(MLA.kv_lora_rank, 2 * (MLA.qk_nope_head_dim + MLA.v_head_dim), bias=False)
    layer = create_attention(0, 2, MLA.qk_head_dim, 2, backend="VANILLA", mla=MLA, indexer=indexer, kv_b_proj=proj)
    cache = layer.kv_cache_spec("float32", block_size=4, layout=layout).allocate(6)
    layer.attach_kv_cache(cache)
    return layer


def test_an_indexer_layer_requires_dsa_and_caches_its_key_beside_the_latent():
    """Requirements carry sparse_mode "dsa"; the cache spec adds index_head_dim to every token of the MLA plane."""
    geometry = AttentionGeometry(0, 2, MLA.qk_head_dim, 2, 0.1, mla=MLA, indexer=INDEXER)
    assert AttentionRequirements.from_geometry(geometry).sparse_mode == "dsa"
    assert geometry.layer_kind == "indexed_attention"
    spec = _layer().kv_cache_spec("float32", block_size=4)
    assert (spec.head_dim, spec.index_head_dim, spec.entry_width) == (MLA.latent_dim, 6, MLA.latent_dim + 6)
    assert spec.bytes_per_token == (MLA.latent_dim + 6) * 4 and spec.cache_shape(3) == (1, 3, 4, 1, MLA.latent_dim + 6)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_indexer_keys_and_latents_share_a_plane_without_overwriting_each_other(layout):
    """Keys written with write_index_keys read back unchanged after the latent is written to the same slots."""
    layer = _layer(layout)
    md = type(layer).prepare([(5, 0, (3, 1))], 4, layout)
    index_keys, latent, k_pe = torch.randn(5, 6), torch.randn(5, MLA.kv_lora_rank), torch.randn(5, 4)
    layer.write_index_keys(index_keys, md)
    layer.write_kv(latent, k_pe, md)
    got_latent, got_pe = layer.read_kv(md.slot_mapping, KVLayout.parse(layout), torch.float32)
    assert torch.equal(layer.read_index_keys(md.slot_mapping, KVLayout.parse(layout), torch.float32), index_keys)
    assert torch.equal(got_latent, latent) and torch.equal(got_pe, k_pe)


def test_topk_indices_are_required_on_a_dsa_layer_and_refused_elsewhere():
    """A DSA layer without (or with mis-shaped) top-k indices, or a plain MLA layer given some: a ValueError."""
    layer = _layer()
    md = type(layer).prepare([(2, 0, (0,))], 4)
    q, latent, k_pe = torch.randn(2, 2, MLA.qk_head_dim), torch.randn(2, MLA.kv_lora_rank), torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"layer 0 is DSA: pass AttentionForwardArgs\(topk_indices=...\)"):
        layer.forward(q, latent, k_pe, md)
    with pytest.raises(ValueError, match=r"\[T, index_topk\] = \[2, 3\].*got torch.int64 \(2, 2\)"):
        layer.forward(q, latent, k_pe, md, AttentionForwardArgs(topk_indices=torch.zeros(2, 2, dtype=torch.long)))
    plain = _layer(indexer=None)
    with pytest.raises(ValueError, match="topk_indices given to a layer without an indexer"):
        plain.forward(q, latent, k_pe, md, AttentionForwardArgs(topk_indices=torch.zeros(2, 3, dtype=torch.long)))


def test_dsa_attends_to_the_picked_keys_only():
    """On VANILLA a query whose top-k row names one key returns exactly that key's value (softmax over one key)."""
    layer = _layer()
    md = type(layer).prepare([(4, 0, (2,))], 4)
    latent, k_pe = torch.randn(4, MLA.kv_lora_rank), torch.randn(4, 4)
    q = torch.randn(4, 2, MLA.qk_head_dim)
    picks = torch.tensor([[0, -1, -1], [1, -1, -1], [0, -1, -1], [2, -1, -1]], dtype=torch.int32)
    with torch.no_grad():
        out = layer.forward(q, latent, k_pe, md, AttentionForwardArgs(topk_indices=picks))
        values = layer.kv_b_proj(latent).view(4, 2, -1)[..., MLA.qk_nope_head_dim :]
    assert torch.allclose(out, values[picks[:, 0].long()], atol=1e-6)


def test_an_indexer_without_mla_is_refused():
    """DSA keys live beside the MLA latent: an indexer on a plain layer is a geometry error."""
    with pytest.raises(ValueError, match="an indexer \\(DSA\\) needs MLA geometry"):
        AttentionGeometry(0, 2, 16, 2, 0.25, indexer=INDEXER)
    with pytest.raises(ValueError, match="index_head_dim must be >= 0 and only set on an MLA cache"):
        KVCacheSpec(num_kv_heads=2, head_dim=16, dtype="float32", index_head_dim=6)
