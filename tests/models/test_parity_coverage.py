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
    """The parity matrix covers each architecture the llama and deepseek plugins register."""
    from kernelbay.registry import names

    covered = {type(loaded(name, tiny)[1]).__name__ for name, tiny in ALL_TINY.items()}
    family = {
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Phi3ForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "MixtralForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        "GptOssForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
    }
    assert family <= set(names("model"))
    assert family <= covered, f"no parity case for {sorted(family - covered)}"
