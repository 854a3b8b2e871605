"""LLM's engine arguments are checked in one place (EngineArgs) before anything loads: a wrong one is an
EngineArgumentError (an InputError, exit 1) naming the argument, never a ValueError/OSError from deep inside."""

from __future__ import annotations

import pytest

from kernelbay.errors import InputError
from kernelbay_engine import LLM
from kernelbay_engine.args import EngineArgs, EngineArgumentError


@pytest.mark.parametrize(
    "options, needle",
    [
        ({"max_model_len": 1}, "max_model_len must be an integer of at least 2, got 1"),
        ({"max_model_len": 2.5}, "max_model_len must be an integer"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be an integer of at least 1, got 0"),
        ({"max_num_seqs": 0}, "max_num_seqs must be an integer of at least 1, got 0"),
        ({"max_num_seqs": True}, "max_num_seqs must be an integer"),
        ({"block_size": 0}, "block_size must be an integer of at least 1"),
        ({"prepack_weights": "sometimes"}, "prepack_weights must be one of 'auto', 'always', 'never'"),
        ({"enable_chunked_prefill": "yes"}, "enable_chunked_prefill must be True or False, got 'yes'"),
        ({"enable_prefix_caching": 1}, "enable_prefix_caching must be True or False, got 1"),
        ({"trust_remote_code": 1}, "trust_remote_code must be True or False"),
        ({"progress": "x"}, "progress must be True, False or None"),
        (
            {"quantization": "int3"},
            "quantization must be None (a GGUF file's own codes) or one of "
            "'int8', 'int8-channel', 'int4', 'gguf', 'none'",
        ),
        ({"model_impl": "hf"}, "model_impl must be one of"),
        ({"dtype": "float8"}, "dtype must be None"),
        ({"kv_cache_memory": "2XB"}, "kv_cache_memory: cannot read memory size '2XB'"),
        ({"kv_cache_memory": 0}, "kv_cache_memory: memory must be positive"),
    ],
)
def test_a_bad_argument_is_refused_naming_it_before_anything_loads(options, needle):
    """Each bad value fails as an EngineArgumentError naming the argument; the folder is never even looked at."""
    with pytest.raises(EngineArgumentError) as caught:
        LLM("/nonexistent/folder", **options)
    assert needle in str(caught.value)
    assert isinstance(caught.value, InputError) and caught.value.exit_code == 1


def test_max_model_len_beyond_the_model_names_its_context(tiny_llama):
    """A max_model_len longer than max_position_embeddings names both numbers."""
    with pytest.raises(EngineArgumentError, match=r"max_model_len=100000 is more than the model's context of \d+"):
        LLM(tiny_llama, progress=False, max_model_len=100_000)


def test_a_cache_the_device_cannot_allocate_names_kv_cache_memory(tiny_llama):
    """10 TiB of KV cache is an InputError naming kv_cache_memory and its bytes, not OSError [Errno 12]."""
    with pytest.raises(InputError, match=r"kv_cache_memory='10TiB' \(10995116277760 bytes\) cannot be allocated"):
        LLM(tiny_llama, progress=False, kv_cache_memory="10TiB")


def test_the_defaults_pass():
    """EngineArgs() with LLM's defaults is valid (so LLM() on the demo is never refused by its own defaults)."""
    EngineArgs()
