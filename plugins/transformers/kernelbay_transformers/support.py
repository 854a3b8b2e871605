"""Can the fallback serve a config? Decided from the config and the transformers class alone, before any weight.

The fallback runs a transformers causal-LM class with every attention call routed through kernelbay's paged
cache, so it refuses what that cannot express: quantized weights, encoder-decoders, classes whose attention
does not go through `AttentionInterface`, recurrent or state-space layers, and folder code nobody trusted.
"""

from __future__ import annotations


def architecture(hf_config) -> str:
    return (getattr(hf_config, "architectures", None) or [type(hf_config).__name__])[0]


def model_class(hf_config) -> type:
    """The transformers class for the config's architecture; a ValueError saying why there is none."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    arch = architecture(hf_config)
    if arch in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return getattr(transformers, arch)
    remote = (getattr(hf_config, "auto_map", None) or {}).get("AutoModelForCausalLM")
    if remote:
        return _remote_class(hf_config, remote)
    if hasattr(transformers, arch):
        raise ValueError(
            f"transformers implements {arch}, but not as a causal LM (it is not an AutoModelForCausalLM class)"
        )
    raise ValueError(f"transformers {transformers.__version__} does not implement {arch}")


def _remote_class(hf_config, reference: str) -> type:
    """The folder's own modeling code, only when its config code was trusted (--trust-remote-code): a config
    class that came from the folder (transformers' dynamic modules) says so. Any other (transformers' own, a
    plugin's) refuses at once, before transformers would look for the code, on the model hub too."""
    from transformers.dynamic_module_utils import TRANSFORMERS_DYNAMIC_MODULE_NAME

    if not type(hf_config).__module__.startswith(f"{TRANSFORMERS_DYNAMIC_MODULE_NAME}."):
        raise ValueError(
            f"{architecture(hf_config)} is implemented by the model folder's own code (auto_map {reference}); "
            "it runs only with --trust-remote-code (trust_remote_code=True)"
        )
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    return get_class_from_dynamic_module(reference, hf_config.name_or_path)


def attention_class(cls: type) -> type:
    """The attention module class transformers records outputs from; a ValueError if the class names none."""
    recorded = (getattr(cls, "_can_record_outputs", None) or {}).get("attentions")
    recorded = getattr(recorded, "target_class", recorded)  # an OutputRecorder names its class
    if not isinstance(recorded, type):
        raise ValueError(f"{cls.__name__} does not name its attention modules (_can_record_outputs['attentions'])")
    return recorded


def refusal(hf_config) -> str | None:
    """Why the fallback cannot serve this transformers config, in words; None when it can."""
    arch = architecture(hf_config)
    quantization = getattr(hf_config, "quantization_config", None)
    if quantization:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else type(quantization).__name__
        return f"quantized checkpoints ({method}) are not served: the fallback builds transformers' unquantized layers"
    if getattr(hf_config, "is_encoder_decoder", False):
        return f"{arch} is an encoder-decoder model; the fallback serves decoder-only causal LMs"
    if hf_config.get_text_config() is not hf_config:
        return f"{arch} is multimodal (its config holds a text_config); the fallback serves text-only LMs"
    try:
        cls = model_class(hf_config)
        reason = _class_refusal(cls)
        if reason is None:
            attention_class(cls)  # a ValueError if the class names no attention modules
        return reason
    except (ValueError, ImportError, OSError) as err:
        return str(err)


def _class_refusal(cls: type) -> str | None:
    if getattr(cls, "_is_stateful", False):
        return f"{cls.__name__} has recurrent or state-space layers, whose state kernelbay's paged KV cache cannot hold"
    if not cls.is_backend_compatible():
        return (
            f"{cls.__name__} does not route its attention through transformers' AttentionInterface "
            "(_supports_attention_backend is False), so kernelbay's paged attention cannot be plugged in"
        )
    return None
