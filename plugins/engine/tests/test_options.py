"""kernelbay_engine.options.validate_options: the whole attention option set, every violation in one ConfigError."""

from __future__ import annotations

import pytest

from kernelbay.errors import ConfigError
from kernelbay_engine.options import AttentionOptions, validate_options
from tests.attention.conftest import fresh_registry as fresh_registry  # the fixture, re-exported


def violations_of(**fields) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate_options(AttentionOptions(**fields))
    return err.value.violations


def test_valid_options_pass_and_are_returned(fresh_registry):
    """A consistent option set comes back unchanged."""
    options = AttentionOptions(
        backend="VANILLA", kv_cache_dtype="fp8", logit_softcap=True, chunked_attention=True, attention_chunk_size=8192
    )
    assert validate_options(options) is options
    assert validate_options({"backend": "SDPA"}).backend == "SDPA"


def test_every_violation_is_reported_at_once(fresh_registry):
    """Four independent problems give four lines in one error, each saying what to change."""
    found = violations_of(
        backend="SDPA",
        logit_softcap=True,
        chunked_attention=True,
        sparse_mode="blocksparse",
        kv_cache_dtype="fp8",
        dtype="bfloat16",
    )
    assert found == [
        "chunked attention needs attention_chunk_size >= 1, got None",
        "sparse attention (blocksparse) cannot be combined with a KV cache in another precision than the model "
        "(kv_cache_dtype=fp8, dtype=bfloat16); use kv_cache_dtype=auto",
        "attention backend SDPA: logit_softcap: attention logit soft-capping is not supported",
        "attention backend SDPA: sparse_mode: blocksparse is not supported (supported: none)",
    ]


def test_error_message_counts_problems(fresh_registry):
    """The ConfigError text leads with the count and lists each violation on its own line."""
    with pytest.raises(ConfigError) as err:
        validate_options(AttentionOptions(chunked_attention=True, block_size=0))
    assert str(err.value) == (
        "2 problem(s) in the attention options:\n"
        "  - block_size must be a positive int, got 0\n"
        "  - chunked attention needs attention_chunk_size >= 1, got None"
    )


def test_names_are_checked(fresh_registry):
    """Unknown dtype, KV dtype, layout and backend names are violations with the known names."""
    found = violations_of(backend="VANILA", dtype="float64", kv_cache_dtype="int3", kv_layout="XYZ")
    assert found == [
        "dtype: unknown dtype 'float64'; use one of: float32, bfloat16, float16",
        "kv_cache_dtype: unknown KV-cache dtype 'int3'; use one of: auto, float32, bfloat16, float16, fp8_e4m3",
        "kv_layout: unknown KV layout 'XYZ'; use 'NHD' or 'HND'",
        "Unknown attention backend: 'VANILA'. Known attention backends: CPU_PAGED, FLEX, SDPA, VANILLA. "
        "Did you mean: VANILLA?",
    ]


def test_incomplete_mla_geometry(fresh_registry):
    """MLA geometry missing a field is named; q_lora_rank may be None."""
    found = violations_of(mla={"kv_lora_rank": 512, "qk_rope_head_dim": 64, "q_lora_rank": None})
    assert found == [
        "MLA geometry is incomplete: missing qk_nope_head_dim, v_head_dim (MLA needs kv_lora_rank, "
        "qk_nope_head_dim, qk_rope_head_dim, v_head_dim; q_lora_rank may be None)"
    ]


def test_capabilities_of_the_chosen_backend(fresh_registry):
    """Chunked attention, MLA, block size and head size are checked against the backend's declarations."""
    found = violations_of(
        backend="FLEX",
        head_size=72,
        mla={"kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 0, "v_head_dim": 8},
    )
    assert found == [
        "attention backend FLEX: head_size: 72 is not supported (supported: 16, 32, 64, 80, 96, 128, 256)",
        "attention backend FLEX: mla: multi-head latent attention is not supported",
    ]


def test_backend_options_unknown_keys_and_types(fresh_registry):
    """Per-backend options: an unknown key names the known ones, a bad value names the type."""
    found = violations_of(backend_options={"FLEX": {"compiel": True}, "SDPA": {"x": 1}, "NOPE": {}})
    assert found == [
        "FLEX.compiel is not an option; known options: compile; did you mean compile?",
        "SDPA.x is not an option; known options: (none)",
        "backend_options: Unknown attention backend: 'NOPE'. Known attention backends: CPU_PAGED, FLEX, SDPA, VANILLA.",
    ]
    found = violations_of(backend_options={"FLEX": {"compile": "maybe"}})
    assert found == ["option FLEX.compile expects a bool (true/false), got 'maybe'"]


def test_unknown_option_field_in_a_mapping(fresh_registry):
    """A mapping with a key AttentionOptions does not have is refused with close matches."""
    with pytest.raises(ConfigError, match=r"Unknown attention option: 'block_sise'.*Did you mean: block_size"):
        validate_options({"block_sise": 2})


def test_extra_rules_argument(fresh_registry):
    """Callers can add rules for one call."""
    with pytest.raises(ConfigError, match="no big blocks"):
        validate_options(
            AttentionOptions(block_size=64), extra_rules=[lambda o: ["no big blocks"] if o.block_size > 32 else []]
        )
