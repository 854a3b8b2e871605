"""`EngineArgs`: every `LLM` argument that is not the model, checked in one place before anything loads.

Each check names the argument and what it accepts, so a typo fails in milliseconds as an `EngineArgumentError`
(an InputError: exit code 1 on the command line) instead of a ValueError from deep inside the scheduler,
the cache planner or the allocator."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kernelbay.errors import InputError


class EngineArgumentError(InputError, ValueError):
    """An `LLM(...)` argument of the wrong type or out of range; the message names the argument."""


FILE_QUANTIZATION = "gguf"
"""quantization= value that keeps a weight file's own quantized codes (formats with keep_quantized): the default for
such a file."""
NO_QUANTIZATION = "none"
"""quantization= value that runs every linear on dense weights: a GGUF file's codes dequantized at load."""


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """LLM's engine arguments (defaults as LLM's); `__post_init__` refuses any that cannot work."""

    max_num_seqs: int = 64
    kv_cache_memory: int | str | None = None
    block_size: int = 16
    max_model_len: int | None = None
    """Checked against the model's max_position_embeddings once the config is read (`max_model_len_for`)."""
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    trust_remote_code: bool = False
    progress: bool | None = None
    prepack_weights: str = "auto"
    quantization: str | None = None
    model_impl: str = "auto"
    dtype: str | None = None
    tensor_parallel_size: int = 1
    """Ranks the model is sharded over; what the model and the machine allow is checked once the config is read
    (`kernelbay_engine.distributed.sizes`)."""
    speculative: str | os.PathLike | None = None
    """None (plain decoding), "ngram" (prompt-lookup proposals) or an EAGLE-3 draft folder
    (kernelbay_engine.speculative); a folder is checked against the target once its config is read
    (`speculative.eagle.read_draft_config`)."""
    num_speculative_tokens: int | None = None
    """Tokens proposed per step (default DEFAULT_NUM_SPECULATIVE_TOKENS); only with `speculative`."""

    def __post_init__(self):
        for name in ("max_num_seqs", "block_size", "max_num_batched_tokens", "tensor_parallel_size"):
            _require_count(name, getattr(self, name), minimum=1)
        if self.max_model_len is not None:
            _require_count("max_model_len", self.max_model_len, minimum=2)
        for name in ("enable_chunked_prefill", "enable_prefix_caching", "trust_remote_code"):
            _require_bool(name, getattr(self, name))
        if self.progress is not None:
            _require_bool("progress", self.progress, "True, False or None (a bar when stderr is a terminal)")
        self._check_memory()
        self._check_choices()
        self._check_speculation()

    def _check_memory(self) -> None:
        from kernelbay_engine.memory import parse_memory

        if self.kv_cache_memory is not None:
            try:
                parse_memory(self.kv_cache_memory)
            except ValueError as err:
                raise EngineArgumentError(f"kv_cache_memory: {err}") from None

    def _check_choices(self) -> None:
        from kernelbay.dtypes import MODEL_DTYPES, normalize_dtype
        from kernelbay.registry import MODEL_IMPLS
        from kernelbay_engine.layers.prepack import POLICIES
        from kernelbay_engine.quant import MODES

        _require_choice("prepack_weights", self.prepack_weights, POLICIES)
        _require_choice("model_impl", self.model_impl, MODEL_IMPLS)
        if self.quantization is not None:
            choices = (*MODES, FILE_QUANTIZATION, NO_QUANTIZATION)
            _require_choice("quantization", self.quantization, choices, "None (a GGUF file's own codes) or ")
        if self.dtype is not None:
            try:
                normalize_dtype(self.dtype)
            except ValueError:
                _require_choice("dtype", self.dtype, MODEL_DTYPES, "None (the checkpoint's) or ")

    def _check_speculation(self) -> None:
        from kernelbay_engine.speculative import MAX_NUM_SPECULATIVE_TOKENS, NGRAM

        if self.speculative is None:
            if self.num_speculative_tokens is not None:
                raise EngineArgumentError(
                    f"num_speculative_tokens={self.num_speculative_tokens!r} needs speculative decoding; "
                    f"pass speculative={NGRAM!r} (or a draft folder) too, or drop num_speculative_tokens"
                )
            return
        if self.speculative != NGRAM:
            self._check_draft_folder()
        if self.num_speculative_tokens is not None:
            _require_count("num_speculative_tokens", self.num_speculative_tokens, minimum=1)
            if self.num_speculative_tokens > MAX_NUM_SPECULATIVE_TOKENS:
                raise EngineArgumentError(
                    f"num_speculative_tokens must be at most {MAX_NUM_SPECULATIVE_TOKENS}, "
                    f"got {self.num_speculative_tokens}"
                )

    def _check_draft_folder(self) -> None:
        """speculative= names an EAGLE-3 draft folder that exists (its config is checked once the target's is read)."""
        if not isinstance(self.speculative, (str, os.PathLike)) or not Path(self.speculative).is_dir():
            raise EngineArgumentError(
                f"speculative must be None, 'ngram' (prompt-lookup proposals) or an EAGLE-3 draft folder; "
                f"got {self.speculative!r}, which is neither (no such folder)"
            )


def quantization_for(requested: str | None, path) -> str | None:
    """The quantization a model at `path` runs with: None (dense weights as loaded), a mode that quantizes after
    loading, or FILE_QUANTIZATION. A file whose format keeps its own codes (GGUF) runs on them unless
    `requested` is NO_QUANTIZATION; FILE_QUANTIZATION on any other checkpoint is refused."""
    from kernelbay_engine.loading.formats import format_for

    keeps_codes = hasattr(format_for(path), "keep_quantized")
    if requested is None:
        return FILE_QUANTIZATION if keeps_codes else None
    if requested == NO_QUANTIZATION:
        return None
    if requested == FILE_QUANTIZATION and not keeps_codes:
        raise EngineArgumentError(
            f"quantization={requested!r} keeps a GGUF file's own quantized weights, but {str(path)!r} is not a .gguf "
            f"file; use quantization='int8' or 'int4' to quantize a float checkpoint"
        )
    return requested


def max_model_len_for(requested: int | None, max_position_embeddings: int) -> int:
    """The context LLM serves: `requested` (already a count >= 2) within the model's, or the model's own."""
    if requested is None:
        return max_position_embeddings
    if requested > max_position_embeddings:
        raise EngineArgumentError(
            f"max_model_len={requested} is more than the model's context of {max_position_embeddings} tokens "
            f"(max_position_embeddings); give at most {max_position_embeddings}, or None for all of it"
        )
    return requested


def _require_count(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EngineArgumentError(f"{name} must be an integer of at least {minimum}, got {value!r}")


def _require_bool(name: str, value: object, accepted: str = "True or False") -> None:
    if not isinstance(value, bool):
        raise EngineArgumentError(f"{name} must be {accepted}, got {value!r}")


def _require_choice(name: str, value: object, choices, prefix: str = "") -> None:
    if not isinstance(value, str) or value not in choices:
        raise EngineArgumentError(f"{name} must be {prefix}one of {', '.join(repr(c) for c in choices)}; got {value!r}")
