"""Model configs: a checkpoint's config.json read once, every default resolved, frozen.

    from kernelbay_engine.config import ModelConfig
    cfg = ModelConfig.from_pretrained("path/to/checkpoint")   # folder code runs only if trusted
    cfg.head_dim, cfg.layer_types, cfg.mla, cfg.rope, cfg.kv_bytes_per_token("fp8_e4m3")

What config.json leaves implicit for one family (Gemma-2's alternation, Nemotron-NAS's per-layer widths)
comes from that family's plugin, through the `register_model_type_rules` hook: see `_rules.py` and
docs/guides/model-family-plugin.md. The core itself reads only generic fields.

Light to import: transformers is imported when a config is first read; `import kernelbay` never
loads this package.
"""

from kernelbay.attention import IndexerSpec, MLASpec  # the attention contract's records, which configs hold

from ._build import draft_architecture
from ._layers import LayerPlan
from ._loading import read_config_json, typed_hf_config, weight_format_class
from ._model_config import ModelConfig
from ._records import ROPE_TYPES, BlockSparseGeometry, QuantConfig, RopeConfig
from ._rules import RULE_POINTS, ConfigRuleError, ConfigView

__all__ = [
    "BlockSparseGeometry",
    "ConfigRuleError",
    "ConfigView",
    "IndexerSpec",
    "LayerPlan",
    "MLASpec",
    "ModelConfig",
    "QuantConfig",
    "ROPE_TYPES",
    "RULE_POINTS",
    "RopeConfig",
    "draft_architecture",
    "read_config_json",
    "typed_hf_config",
    "weight_format_class",
]
