"""Refused for its core range, yet importable: importing it by hand must not let it take slots."""

from kernelbay import register_model


@register_model("OldApiForCausalLM", "LlamaForCausalLM")
class OldApiForCausalLM:
    pass
