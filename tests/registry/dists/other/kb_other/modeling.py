import builtins

builtins.__dict__.setdefault("_kb_fixture_imports", []).append(__name__)

import time

from kernelbay import register_model

time.sleep(0.05)


@register_model("OtherForCausalLM")
class OtherForCausalLM:
    pass
