"""Backends that exist only to be selected (never run), each with one distinctive capability; a platform whose
backend priority the test chooses (the selector tests here, kernelbay-torch's capability honesty)."""

from __future__ import annotations

from kernelbay.attention import ANY, AttentionBackend
from kernelbay.dtypes import MODEL_DTYPES
from kernelbay.platforms import Platform


class BlockSparseOnly(AttentionBackend):
    """The one backend with block-sparse attention; refuses sliding windows."""

    name = "FAKE_BLOCKSPARSE"
    head_sizes = block_sizes = platforms = ANY
    dtypes = frozenset(MODEL_DTYPES)
    sparse_modes = frozenset({"blocksparse"})


class UnavailableBackend(AttentionBackend):
    """Capable of everything VANILLA is, but its kernels are missing."""

    name = "FAKE_GONE"
    head_sizes = block_sizes = platforms = ANY
    dtypes = frozenset(MODEL_DTYPES)
    mla = sliding_window = chunked_attention = logit_softcap = True

    @classmethod
    def is_available(cls):
        return False, "libfake.so is not installed"


class FakePlatform(Platform):
    """A platform whose priority list the test chooses."""

    name = "fakeplat"
    device_type = "cpu"

    def __init__(self, *priority: str):
        self.priority = list(priority)

    def is_current(self):
        return True, "test platform"

    def backend_priority(self):
        return self.priority
