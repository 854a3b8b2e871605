from kernelbay import register_model


@register_model("ConflictForCausalLM")
class ConflictA:
    pass
