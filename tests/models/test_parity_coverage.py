"""The families' parity matrices (plugins/llama/tests, plugins/deepseek/tests) together cover what they register."""

from __future__ import annotations

from plugins.deepseek.tests._tiny_v32 import TINY_V32
from plugins.llama.tests._tiny_gemma3 import TINY_GEMMA3
from plugins.llama.tests._tiny_gpt_oss import TINY_GPT_OSS
from plugins.llama.tests._tiny_moe import TINY_MOE

from ._tiny import TINY

# The shared tiny configs and those plugins keep beside their own tests.
ALL_TINY = {**TINY, **TINY_GEMMA3, **TINY_MOE, **TINY_V32, **TINY_GPT_OSS}


def test_every_registered_family_architecture_has_a_parity_case(loaded):
    """The parity matrix covers each architecture the llama and deepseek plugins provide (the registry's
    first-party table, each name resolved to the class it serves: Mistral is Llama's)."""
    from kernelbay.registry import first_party_names, names, resolve

    indexed = [n for n, d in first_party_names("model").items() if d in ("kernelbay-llama", "kernelbay-deepseek")]
    assert set(indexed) <= set(names("model"))
    # draft models share the models index; an EAGLE-3 head has no transformers counterpart (its test computes the
    # format by hand: plugins/engine/tests/test_speculative_eagle.py)
    provided = [n for n in indexed if not _is_draft(n)]
    assert len(provided) >= 14  # Llama, Mistral, Qwen2/3, Phi3, Gemma2/3, 3 MoE, GPT-OSS, DeepSeek V2/V3/V3.2
    family = {resolve("model", n).__name__ for n in provided}
    covered = {type(loaded(name, tiny)[1]).__name__ for name, tiny in ALL_TINY.items()}
    assert family <= covered, f"no parity case for {sorted(family - covered)}"


def _is_draft(name: str) -> bool:
    from kernelbay.errors import UnknownNameError
    from kernelbay.registry import resolve

    try:
        resolve("draft_model", name)
    except UnknownNameError:
        return False
    return True
