"""Acme's build of LlamaForCausalLM: the LM head runs in vocab tiles that fit Acme's matrix unit.

Being external, this registration takes the `LlamaForCausalLM` slot from the built-in kernelbay-llama.
Off Acme hardware it declines with `NoTarget`, and kernelbay falls back to the built-in implementation.
"""

from __future__ import annotations

import torch

from kernelbay import NoTarget, register_model
from kernelbay_acme.platform import VISIBLE_DEVICES_ENV, visible_devices
from kernelbay_llama.modeling import LlamaForCausalLM

LOGITS_TILE = 512
"""Weight rows Acme's matrix unit holds at once: the LM head is computed this many vocab entries at a time."""


@register_model("LlamaForCausalLM")
class AcmeLlamaForCausalLM(LlamaForCausalLM):
    """The built-in Llama, with the LM head tiled over the vocabulary."""

    prepack_exclude = ("lm_head",)  # compute_logits reads the weight itself, so it stays dense

    def __init__(self, config):
        if not visible_devices():
            raise NoTarget(f"{VISIBLE_DEVICES_ENV} is not set: Acme's Llama build only runs on an Acme device")
        super().__init__(config)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.lm_head.dequantized_weight()  # [vocab, hidden]
        tiles = [hidden @ weight[start : start + LOGITS_TILE].t() for start in range(0, weight.shape[0], LOGITS_TILE)]
        logits = torch.cat(tiles, dim=-1)
        if self.final_logit_softcap is not None:
            logits = torch.tanh(logits / self.final_logit_softcap) * self.final_logit_softcap
        return logits
