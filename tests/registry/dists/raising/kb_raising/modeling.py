from kernelbay import register_model


@register_model("FirstForCausalLM")
class FirstForCausalLM:
    """Registered before the failure: must not survive it."""


@register_model("RaisingForCausalLM", " bad name ")
class RaisingForCausalLM:
    pass
