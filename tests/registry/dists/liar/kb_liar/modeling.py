from kernelbay import register_model


@register_model("UnadvertisedForCausalLM")
class Unadvertised:
    pass
