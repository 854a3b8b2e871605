
from kernelbay import register_model

@register_model("SyntaxForCausalLM")
class SyntaxForCausalLM(:
    pass
