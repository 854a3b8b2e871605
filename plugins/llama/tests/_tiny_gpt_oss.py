"""kernelbay-llama's tiny GPT-OSS config (passed to `loaded(name, tiny)`), and an MXFP4 copy of its experts."""

from __future__ import annotations

import torch
import transformers

from tests.models._tiny import COMMON, YARN, Tiny

_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _gpt_oss() -> transformers.GptOssConfig:
    """gpt-oss-20b's structure scaled down: sliding and full layers alternating with a window shorter than the
    prompts, 4 experts top-2 with biases and the clamped SwiGLU, attention biases and sinks, YaRN (truncate off).
    hidden and expert widths are multiples of 32, so the experts can be stored MXFP4 too."""
    return transformers.GptOssConfig(
        **{**COMMON, "num_hidden_layers": 4, "intermediate_size": 32},
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters={**YARN, "truncate": False},
        attention_bias=True,
        swiglu_limit=0.3,  # inside the tiny activations' range, so the clamps bite
    )


TINY_GPT_OSS: dict[str, Tiny] = {"gpt_oss": Tiny("gpt-oss-20b", _gpt_oss)}


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] floats -> blocks [..., K/32, 16] uint8 (e2m1 pairs, low nibble first), scales [..., K/32] uint8
    (e8m0, bias 127): each block scaled so its largest value fits e2m1's 6, every value rounded to the nearest."""
    groups = w.float().reshape(*w.shape[:-1], -1, 32)
    exponent = torch.ceil(torch.log2(groups.abs().amax(-1).clamp(min=2**-100) / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent).unsqueeze(-1)
    codes = (scaled.unsqueeze(-1) - _E2M1).abs().argmin(-1).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)
