"""kernelbay-acme really computes: its int8 paged cache, its kernel against VANILLA, its honest capabilities,
and its platform detection."""

from __future__ import annotations

import itertools

import pytest
import torch

from kernelbay.attention import KVCacheSpec, create_attention
from tests.attention._harness import MLA_SPECS, SPECS, make_data, run_backend

# Specs ACME_INT8 must claim (the harness may add more; whatever it claims must then pass too).
MUST_CLAIM = {
    "small_prefill",
    "small_decode",
    "mixed_prefill_decode",
    "long_decode",
    "uniform_decode",
    "gqa",
    "mqa",
    "head_80",
    "head_128",
    "head_256",
    "sliding_window",
    "softcap",
    "block_32",
    "bf16",
    "fp16",
}
INT8_TOLERANCE = 0.06  # int8 with per-block scales: ~0.4% of a block's range per entry, before softmax


@pytest.fixture(scope="module")
def acme(sites):
    import kernelbay_acme.backend
    import kernelbay_acme.int8_cache
    import kernelbay_acme.platform

    return kernelbay_acme


def requirements(spec, platform="acme"):
    return spec.requirements().with_platform(platform)


def _claimed(cls) -> dict:
    specs = {**SPECS, **MLA_SPECS}
    return {n: s for n, s in specs.items() if not cls.capability_failures(requirements(s))}


def test_refusals_say_which_capability_is_missing(acme):
    """ACME_INT8 refuses chunked layers, fp8 caches, 64-token blocks, HND and MLA, each with its reason."""
    cls = acme.backend.AcmeInt8Backend
    specs = {**SPECS, **MLA_SPECS}
    reasons = {
        n: cls.capability_failures(requirements(specs[n])) for n in ("chunked", "fp8_kv", "block_64", "hnd", "mla")
    }
    assert reasons["chunked"] == ["chunked_attention: chunked attention is not supported"]
    assert reasons["fp8_kv"] == ["kv_cache_dtype: fp8_e4m3 is not supported (supported: auto)"]
    assert reasons["block_64"] == ["block_size: 64 is not supported (supported: 16, 32)"]
    assert reasons["hnd"] == ["kv_layout: HND is not supported (supported: NHD)"]
    assert "mla: multi-head latent attention is not supported" in reasons["mla"]


def test_only_runs_on_the_acme_platform(acme):
    """Off the acme platform the backend declines: its kernel is Acme's."""
    failures = acme.backend.AcmeInt8Backend.capability_failures(requirements(SPECS["small_prefill"], "cpu"))
    assert failures == ["platform: cpu is not supported (supported: acme)"]


def test_every_claimed_spec_matches_vanilla(acme):
    """[ACME_INT8] equals VANILLA within int8 quantisation error on every harness spec its capabilities claim:
    the declaration is honest."""
    claimed = _claimed(acme.backend.AcmeInt8Backend)
    assert MUST_CLAIM <= set(claimed), f"[ACME_INT8] no longer claims {sorted(MUST_CLAIM - set(claimed))}"
    errors = {}
    for name, spec in claimed.items():
        got, want = run_backend(acme.backend.AcmeInt8Backend, spec), run_backend("VANILLA", spec)
        err = (got.float() - want.float()).abs().max().item()
        if got.shape != want.shape or err > INT8_TOLERANCE * max(1.0, want.float().abs().max().item()):
            errors[name] = err
    assert not errors, f"[ACME_INT8] specs beyond int8 error of VANILLA: {errors}"


def test_conformance_kit_passes(sites):
    """`kernelbay check-backend ACME_INT8` on the installed vendor package: every claimed spec within int8 error
    of the kit's reference, every refusal honest through the selector, exit code 0."""
    import json

    from kernelbay.testing.specs import INTEGER_KV_TOLERANCE
    from tests.ecosystem.conftest import run_kernelbay

    done = run_kernelbay(sites, "check-backend", "ACME_INT8", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    claimed = {r["spec"] for r in report["results"] if r["status"] == "pass"}
    assert report["passed"] and MUST_CLAIM <= claimed, f"[ACME_INT8] {report}"
    assert INTEGER_KV_TOLERANCE == INT8_TOLERANCE and all(
        r["detail"].endswith("(integer KV cache)") for r in report["results"] if r["status"] == "pass"
    )


def _filled_layer(acme, spec, seed=0):
    data = make_data(spec, seed)
    layer = create_attention(
        0,
        spec.num_heads,
        spec.head_dim,
        spec.num_kv_heads,
        backend=acme.backend.AcmeInt8Backend,
        sliding_window=spec.sliding_window,
        attn_type=spec.attn_type,
        logit_softcap=spec.logit_softcap,
    )
    layer.attach_kv_cache(layer.kv_cache_spec(spec.dtype).allocate(16))
    rows, start = [], 0
    for q, c in spec.requests:
        blocks = -(-(q + c) // 16)
        rows.append((q + c, 0, list(range(start, start + blocks))))
        start += blocks
    md = acme.backend.AcmeInt8Backend.prepare(rows, 16)
    layer.write_kv(torch.cat(data.keys), torch.cat(data.values), md)
    return layer, data, md


def test_kernel_equals_attention_over_dequantised_cache(acme):
    """Folding the block scales into scores and weights is exactly attention over the dequantised cache."""
    spec = SPECS["gqa"].but(logit_softcap=5.0)
    layer, _data, md = _filled_layer(acme, spec)
    q = torch.randn(md.num_tokens, spec.num_heads, spec.head_dim)
    got = layer._attend(q, md, layer_args())
    for r, (q0, q1) in enumerate(itertools.pairwise(md.query_start_loc.tolist())):
        slots = md.kv_gather_index[md.kv_start_loc[r] : md.kv_start_loc[r + 1]]
        k, v = (layer.store.dequantise(p, slots).repeat_interleave(4, 1) for p in (0, 1))
        scores = 5.0 * torch.tanh(torch.einsum("qhd,shd->hqs", q[q0:q1], k) * layer.geometry.scale / 5.0)
        scores = scores.masked_fill(
            torch.ones(q1 - q0, len(slots), dtype=torch.bool).tril(len(slots) - (q1 - q0)).logical_not(), float("-inf")
        )
        want = torch.einsum("hqs,shd->qhd", scores.softmax(-1), v)
        torch.testing.assert_close(got[q0:q1], want, atol=1e-5, rtol=1e-5)


def layer_args():
    from kernelbay.attention import AttentionForwardArgs

    return AttentionForwardArgs()


def test_quantisation_error_is_half_a_step(acme):
    """One write: every entry is within half a quantisation step (scale / 2) of its value."""
    cache = acme.int8_cache.Int8PagedKV(torch.zeros(2, 4, 16, 2, 8, dtype=torch.int8))
    values, slots = torch.randn(40, 2, 8), torch.arange(40)
    cache.write(0, values, slots)
    step = cache.scales[0][slots // 16].unsqueeze(-1)
    assert ((cache.dequantise(0, slots) - values).abs() <= step / 2 + 1e-6).all()


def test_growing_block_is_requantised(acme):
    """A later, larger token raises its block's scale and the block's earlier entries stay close."""
    cache = acme.int8_cache.Int8PagedKV(torch.zeros(2, 2, 16, 1, 4, dtype=torch.int8))
    first = torch.randn(5, 1, 4)
    cache.write(1, first, torch.arange(5))
    cache.write(1, torch.full((1, 1, 4), 50.0), torch.tensor([5]))
    assert cache.scales[1, 0, 0].item() == pytest.approx(50.0 / 127)
    assert (cache.dequantise(1, torch.arange(5)) - first).abs().max() <= 50.0 / 127


def test_recycled_block_starts_a_fresh_scale(acme):
    """A block reused by a new request (write at offset 0) drops its previous owner's scale."""
    cache = acme.int8_cache.Int8PagedKV(torch.zeros(2, 1, 16, 1, 4, dtype=torch.int8))
    cache.write(0, torch.full((16, 1, 4), 100.0), torch.arange(16))
    small = torch.randn(3, 1, 4) * 0.01
    cache.write(0, small, torch.arange(3))
    assert cache.scales[0, 0, 0].item() == pytest.approx(small.abs().max().item() / 127)


def test_cache_is_int8_and_smaller(acme):
    """The cache spec stores int8 plus one float32 scale per block and head: half of bf16's bytes, plus the scales."""
    from kernelbay.attention import AttentionGeometry

    geometry = AttentionGeometry(0, 8, 128, 2, 128**-0.5)
    spec = acme.backend.AcmeInt8Backend.get_kv_cache_spec(geometry, "bfloat16")
    assert spec.allocate(3).dtype == torch.int8
    bf16 = KVCacheSpec(num_kv_heads=2, head_dim=128, dtype="bfloat16")
    assert spec.bytes_per_block == 2 * 2 * (16 * 128 + 4)  # planes * kv_heads * (int8 entries + fp32 scale)
    assert spec.bytes_per_token == bf16.bytes_per_token // 2 + 1


def test_wrong_cache_tensors_are_refused(acme):
    """A float cache, or one paged in blocks Acme cannot move, is an error saying how to allocate it."""
    layer = create_attention(0, 4, 64, 2, backend=acme.backend.AcmeInt8Backend)
    with pytest.raises(ValueError, match=r"must be an int8 tensor .*get_kv_cache_spec\(\.\.\.\)\.allocate"):
        layer.attach_kv_cache(torch.zeros(2, 4, 16, 2, 64))
    with pytest.raises(ValueError, match="pages in blocks of 16, 32 tokens, got a cache with block size 64"):
        layer.attach_kv_cache(torch.zeros(2, 4, 64, 2, 64, dtype=torch.int8))


def test_chunked_layers_are_refused_at_construction(acme):
    """A chunked-attention layer cannot be built on ACME_INT8 (no silent full attention)."""
    with pytest.raises(ValueError, match="chunked attention is not supported"):
        create_attention(
            0, 4, 64, 2, backend=acme.backend.AcmeInt8Backend, attn_type="chunked_attention", chunk_size=16
        )


def test_platform_detection_follows_the_environment(acme, monkeypatch):
    """acme is current exactly when ACME_VISIBLE_DEVICES names a device, and says why."""
    platform = acme.platform.AcmePlatform()
    monkeypatch.delenv("ACME_VISIBLE_DEVICES", raising=False)
    assert platform.is_current() == (False, "ACME_VISIBLE_DEVICES is not set: no Acme device is visible")
    monkeypatch.setenv("ACME_VISIBLE_DEVICES", "0, 3")
    assert platform.is_current() == (True, "2 Acme device(s) visible (ACME_VISIBLE_DEVICES=0,3)")
    assert platform.backend_priority() == ["ACME_INT8", "SDPA", "VANILLA"]


def test_demo_model_runs_end_to_end_on_acme(make_registry, monkeypatch):
    """On the acme platform the demo checkpoint is built by Acme's Llama, its layers get ACME_INT8 and an int8
    cache, and greedy decoding follows the VANILLA run of the same model."""
    from kernelbay_engine import AutoModelForCausalLM
    from kernelbay_engine.runner import ModelRunner, StepRequest
    from tests._paths import REPO

    monkeypatch.setenv("ACME_VISIBLE_DEVICES", "0")
    make_registry()
    model = AutoModelForCausalLM.from_pretrained(
        REPO / "plugins/engine/kernelbay_engine/demo", dtype="float32", progress=False
    )
    assert type(model).__name__ == "AcmeLlamaForCausalLM"
    acme_runner = ModelRunner(model, num_blocks=16, block_size=16)
    assert {type(layer.backend).__name__ for layer in model.attention_layers().values()} == {"AcmeInt8Backend"}
    reference = ModelRunner(
        AutoModelForCausalLM.from_pretrained(
            REPO / "plugins/engine/kernelbay_engine/demo", dtype="float32", progress=False
        ),
        num_blocks=16,
        block_size=16,
        attention_backend="VANILLA",
    )
    tokens = [1, 310, 52, 1207, 88, 9]
    for step in range(4):
        batch = [StepRequest("r", tokens if step == 0 else tokens[-1:], 0 if step == 0 else len(tokens) - 1)]
        got, want = acme_runner.step(batch), reference.step(batch)
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist(), f"[ACME_INT8] step {step}: greedy token differs"
        assert (got - want).abs().max() < 0.1 * want.abs().max(), f"[ACME_INT8] step {step}: logits drifted"
        tokens.append(int(want.argmax(-1)))
