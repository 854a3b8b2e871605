import builtins

builtins.__dict__.setdefault("_kb_fixture_imports", []).append(__name__)

import time

from kernelbay import register_model, register_vision_encoder

time.sleep(0.05)  # widen the window for the concurrency test


@register_model("GoodForCausalLM", "GoodLMHeadModel")
class GoodForCausalLM:
    """A fixture model class registered under two architectures."""


@register_vision_encoder("GoodVisionModel")
class GoodVisionModel:
    pass
