"""The built-in Llama, plus `banned_token_ids` from config.json: those token ids can never be generated."""

from __future__ import annotations

import torch

from kernelbay import register_model
from kernelbay_llama.modeling import LlamaForCausalLM as BuiltinLlamaForCausalLM


@register_model("LlamaForCausalLM")
class LlamaForCausalLM(BuiltinLlamaForCausalLM):
    """Same weights and attention as the built-in; logits of the config's `banned_token_ids` are -inf."""

    def __init__(self, config):
        super().__init__(config)
        banned = tuple(getattr(config.hf_config, "banned_token_ids", None) or ())
        bad = [t for t in banned if not 0 <= t < config.vocab_size]
        if bad:
            raise ValueError(
                f"banned_token_ids {bad} are outside the vocabulary (0..{config.vocab_size - 1}); fix config.json"
            )
        self.banned = torch.tensor(banned, dtype=torch.long)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)  # [N, vocab]
        if self.banned.numel():
            logits[:, self.banned.to(logits.device)] = float("-inf")
        return logits
