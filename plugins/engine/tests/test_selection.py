"""A ModelConfig turned into the selector's requirement records (kernelbay_engine.selection)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kernelbay.attention import MLASpec
from kernelbay_engine.selection import attention_requirements, select_attention
from tests.attention._fakes import FakePlatform
from tests.testing.conftest import fresh_registry as fresh_registry  # the fixture, re-exported


@dataclass(frozen=True)
class StandInConfig:
    """The ModelConfig fields attention_requirements reads."""

    head_dim: int = 256
    dtype: str = "bfloat16"
    mla: MLASpec | None = None
    attn_logit_softcapping: float | None = 50.0
    attention_sinks: bool = False
    layer_kinds: tuple = (("sliding_attention", (0, 2)), ("full_attention", (1, 3)), ("no_attention", (4,)))

    def layer_groups(self):
        return list(self.layer_kinds)


def test_requirements_from_a_config():
    """Kinds, soft-cap, MLA head size and sparse kinds come from the config; no_attention is refused."""
    req = attention_requirements(StandInConfig(), "sliding_attention", kv_cache_dtype="fp8")
    assert (req.head_size, req.dtype, req.kv_cache_dtype, req.sliding_window, req.logit_softcap) == (
        256,
        "bfloat16",
        "fp8_e4m3",
        True,
        True,
    )
    mla = StandInConfig(mla=MLASpec(512, 128, 64, 128), attn_logit_softcapping=None)
    req = attention_requirements(mla, "indexed_attention")
    assert (req.head_size, req.use_mla, req.sparse_mode) == (192, True, "dsa")
    assert hash(req) == hash(attention_requirements(mla, "indexed_attention"))
    with pytest.raises(ValueError, match="no_attention layers have no attention backend"):
        attention_requirements(StandInConfig(), "no_attention")


def test_selection_skips_layers_without_attention(fresh_registry):
    """A Gemma-2-like config gets one backend for both its groups; the no_attention group is skipped."""
    sel = select_attention(StandInConfig(), platform=FakePlatform("SDPA", "VANILLA"))
    assert [name for name, _ in sel.groups] == ["sliding_attention", "full_attention"]
    assert sel.shared and sel.backend_for("full_attention").backend_name == "VANILLA"
