"""Model construction: `auto` (resolution steps and `from_pretrained`), `base` (`CausalLM`, what every
family provides), `meta` (meta-device construction), `quant` (per-layer weight formats, FP8 blocks)."""
