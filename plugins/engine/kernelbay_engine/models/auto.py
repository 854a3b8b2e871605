"""`AutoModelForCausalLM`: config -> registered class -> meta-built module tree -> weights.

Resolution (DESIGN.md, "Model resolution and construction"):
1. the slot name is `config.architecture` (`architectures[0]`);
2. encoder-only deployments resolve the `vision_encoder` slot instead;
3. a draft checkpoint (`draft_vocab_size`) resolves the `draft_model` slot `EAGLE3<TargetArch>`;
4. the slot's winner may be an alternative implementation that declines with `NoTarget(reason)`:
   `implementation="auto"` falls back to the default (built-in) implementation with a log line,
   `implementation="require"` re-raises;
5. the module is built under `MetaInitMode` (normal init if an op needs real tensors), then every
   `Linear` gets its per-layer weight format and its weights, in one pass;
6. safetensors weights are loaded (single or sharded), with a progress bar.
7. the MoE layers (if any) get their MoE kernel, which prepares the loaded expert weights once.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from kernelbay.errors import KernelbayError, NoTarget
from kernelbay_engine.errors import ModelConstructionError
from kernelbay_engine.layers.moe import bind_moe_backends
from kernelbay_engine.loading import NameRules, load_weights, open_checkpoint
from kernelbay_engine.loading.tied_head import untie_a_different_stored_head
from kernelbay_engine.models.base import default_dtype, torch_dtype
from kernelbay_engine.models.meta import build_module
from kernelbay_engine.models.quant import LinearQuantization, create_weights

logger = logging.getLogger("kernelbay.models")
IMPLEMENTATION_MODES = ("auto", "require")


def _import_target(target: str):
    module, _, qualname = target.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _default_implementation(kind: str, name: str, declined) -> object | None:
    """The built-in implementation the winner displaced, if any (what AUTO falls back to)."""
    from kernelbay.registry import default_registry

    slot = default_registry().slot(kind, name)
    candidates = [r for r in (slot.displaced if slot else ()) if r.provider.is_builtin]
    for reg in candidates:
        impl = _import_target(reg.target)
        if impl is not declined:
            return impl
    return None


def _build(impl, config, dtype: torch.dtype, meta: bool) -> nn.Module:
    from kernelbay_engine.attention import collect_attention_layers

    linear_quantization = LinearQuantization.from_quant_config(config.quantization)  # refuse unsupported formats first

    def construct():
        with default_dtype(dtype), collect_attention_layers() as layers:
            model = impl(config)
        model.attention_registry = layers
        create_weights(model, linear_quantization, dtype)
        return model

    if getattr(impl, "builds_on_meta", False):  # it puts its own parameters on meta (the transformers fallback)
        if not meta:
            raise ValueError(f"{_describe(impl)} always builds its parameters on meta (the checkpoint fills them)")
        model, on_meta = construct(), True
    else:
        model, on_meta = build_module(construct, meta=meta)
    model.built_on_meta = on_meta
    return model


def _announce_fallback(kind: str, name: str, impl) -> None:
    """The fallback provider never serves silently: one warning naming it and why it serves."""
    from kernelbay.registry import ANY_ARCHITECTURE, default_registry, registered_slots

    if (kind, ANY_ARCHITECTURE) not in registered_slots(impl):  # a native class: nothing to announce
        return
    registry = default_registry()
    fallback = registry.fallback_claim(kind)
    if fallback is None or _import_target(fallback.target) is not impl:
        return
    logger.warning(
        "%s runs on the fallback provider %s: %s", name, fallback.provider.describe(), fallback_reason(kind, name)
    )


def fallback_reason(kind: str, name: str) -> str:
    """Why the transformers fallback serves `name`, in the words run's warning and explain's note share: the
    slot as the index and the registrations know it (the native provider is imported to be named)."""
    from kernelbay.registry import slot_info

    native = (slot_info(kind, name) or {}).get("winner")
    if native is None:
        return "no native implementation installed"
    who = _describe_provider(native["provider"])
    return f"model_impl='transformers', although a native implementation is installed ({who})"


def _describe_provider(provider: dict) -> str:
    from kernelbay.registry import Provider

    return Provider(**provider).describe()


def decline_message(decliner: str, name: str, reason: str, fallback: str) -> str:
    """One text for an implementation declining (NoTarget): run's warning and explain's note."""
    return f"{decliner} declined {name}: {reason}; falling back to the default implementation {fallback}"


def declined_reason(impl, config) -> str | None:
    """The reason `impl` declines `config` (its constructor's NoTarget), heard by building it on meta (no
    weights, discarded): the check construct_model makes, for explain to show; None when it builds."""
    try:
        _build_named(impl, config, torch_dtype(config.dtype), meta=True)
    except NoTarget as declined:
        return declined.reason
    return None


def _describe(impl) -> str:
    return f"{impl.__module__}.{impl.__qualname__}"


def resolve_model(config, model_impl: str = "auto"):
    """The class serving `config`'s slot (`model_impl`: auto | native | transformers); where none does, the error
    also says why, if the family's plugin reads these configs but builds no model (its `not_built` rule)."""
    from kernelbay.errors import UnsupportedArchitecture
    from kernelbay.registry import resolve_impl

    try:
        return resolve_impl(config.model_kind, config.architecture, model_impl, config.hf_config)
    except UnsupportedArchitecture as err:
        if not config.not_built:
            raise
        raise UnsupportedArchitecture(f"{err} {config.not_built}") from err


def construct_model(
    config, *, dtype: torch.dtype, implementation: str = "auto", meta: bool = True, model_impl: str = "auto"
) -> nn.Module:
    """Steps 1-5: resolve the class (`model_impl`: auto | native | transformers, the registry's choice between
    native providers and the fallback), honour NoTarget, build on meta with per-layer weight formats."""
    if implementation not in IMPLEMENTATION_MODES:
        raise ValueError(f"implementation must be one of {IMPLEMENTATION_MODES}, got {implementation!r}")
    kind, name = config.model_kind, config.architecture  # the slot it builds from (EAGLE3<Arch> for a draft)
    impl = resolve_model(config, model_impl)  # a refusing fallback says why, before building
    _announce_fallback(kind, name, impl)
    try:
        return _build_named(impl, config, dtype, meta)
    except NoTarget as declined:
        if implementation == "require":
            raise
        fallback = _default_implementation(kind, name, impl)
        if fallback is None:
            raise NoTarget(
                f"{_describe(impl)} declined {name} ({declined.reason}) and no built-in "
                f"implementation of {name} is installed to fall back to"
            ) from declined
        logger.warning(
            "%s", decline_message(_provider_of(config, impl), name, declined.reason, _provider_of(config, fallback))
        )
        return _build_named(fallback, config, dtype, meta)


def _build_named(impl, config, dtype: torch.dtype, meta: bool) -> nn.Module:
    """`_build`, where whatever the class's constructor raises (not NoTarget, not a kernelbay error, which say what
    they are) is a ModelConstructionError naming the class, its provider and where that comes from."""
    try:
        return _build(impl, config, dtype, meta)
    except (NoTarget, KernelbayError):
        raise
    except Exception as err:  # a provider's own code failed: name it, never a bare traceback
        raise ModelConstructionError(
            f"{config.architecture} could not be built: {_describe(impl)} from {_provider_of(config, impl)} raised "
            f"{type(err).__name__}: {err}; fix that provider (or the config.json field it names), or leave it out"
        ) from err


def _provider_of(config, impl) -> str:
    """`module (distribution version | custom-dir path, origin)` of the registration serving `impl`."""
    from kernelbay.registry import default_registry

    registry = default_registry()
    slot = registry.slot(config.model_kind, config.architecture)
    claims = [slot.winner, *slot.displaced] if slot is not None else []
    fallback = registry.fallback_claim(config.model_kind)
    target = f"{impl.__module__}:{impl.__qualname__}"
    for reg in [*claims, fallback]:
        if reg is not None and reg.target == target:
            return reg.provider.describe()
    return f"module {impl.__module__}"


def _tie(model: nn.Module) -> None:
    """Share tied parameters (again after loading replaced them); vision encoders and drafts may not tie."""
    tie = getattr(model, "tie_weights", None)
    if tie is not None:
        tie()


class AutoModelForCausalLM:
    """Entry point: `AutoModelForCausalLM.from_pretrained(path)` -> an eval-mode `CausalLM`."""

    @classmethod
    def from_config(
        cls,
        config,
        *,
        dtype: str | torch.dtype | None = None,
        implementation: str = "auto",
        meta: bool = True,
        model_impl: str = "auto",
    ) -> nn.Module:
        """The module tree with weights created but not loaded (on `meta` when `meta` and possible)."""
        model = construct_model(
            config,
            dtype=torch_dtype(dtype or config.dtype),
            implementation=implementation,
            meta=meta,
            model_impl=model_impl,
        )
        _tie(model)
        return model

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: str | torch.dtype | None = None,
        attention_backend: str | None = None,
        trust_remote_code: bool = False,
        allow_pickle: bool = False,
        implementation: str = "auto",
        encoder_only: bool = False,
        mmap: bool = False,
        progress: bool | None = None,
        config=None,
        model_impl: str = "auto",
        moe_backend: str | None = None,
        before_load: Callable[[nn.Module], object] | None = None,
        moe_selection=None,
    ) -> nn.Module:
        """Load a checkpoint folder. `config`: its `ModelConfig` if the caller already read it (read once);
        `attention_backend` is recorded for the runner's backend selection;
        `allow_pickle=True` is needed for `.bin` weights (pickle can run code); `encoder_only` loads the
        vision encoder of a multimodal checkpoint (the `vision_encoder` slot); `mmap=True` maps tensors
        that need no fusing or cast straight from the file instead of reading them (see `load_weights`);
        `model_impl="transformers"` runs transformers' modeling code (the fallback) even where a native family
        exists, `"native"` refuses the fallback; `moe_backend` names the MoE kernel of the MoE layers (default: the
        selector's choice), bound once the weights are loaded (`kernelbay_engine.layers.moe.bind_moe_backends`;
        `moe_selection`: the caller's `select_moe` answer for this model, so the selector runs once);
        `before_load(model)` runs on the model still on meta, before any weight is read (a weight format giving
        layers their quantized codes there: the loader then skips the weights a layer already holds)."""
        from kernelbay_engine.config import ModelConfig

        if config is None:
            config = ModelConfig.from_pretrained(path, trust_remote_code=trust_remote_code, encoder_only=encoder_only)
        model = cls.from_config(config, dtype=dtype, implementation=implementation, model_impl=model_impl)  # on meta
        if before_load is not None:
            before_load(model)
        checkpoint = open_checkpoint(path, allow_pickle=allow_pickle)
        untie_a_different_stored_head(model, checkpoint)  # as transformers does: the stored head, untied
        rules = model.checkpoint_rules() if hasattr(model, "checkpoint_rules") else NameRules()  # type: ignore[operator]  # a family's method, not a tensor
        load_weights(model, checkpoint, rules, progress=progress, mmap=mmap)
        _tie(model)
        bind_moe_backends(model, moe_backend, chosen=moe_selection)  # after loading: kernels prepare the weights
        model.requested_attention_backend = attention_backend  # type: ignore[assignment]  # a plain attribute
        return model.eval()
