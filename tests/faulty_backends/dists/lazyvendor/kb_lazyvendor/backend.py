"""A vendor backend written from the docs' example that forgot two declarations: head_sizes and block_sizes keep
AttentionBackend's conservative defaults (none), so it can serve no layer at all."""

from kernelbay.attention import AttentionBackend
from kernelbay_torch.vanilla import VanillaBackend


class LazyBackend(VanillaBackend):
    name = "LAZY_ATTN"
    head_sizes = AttentionBackend.head_sizes  # not declared: the default, none
    block_sizes = AttentionBackend.block_sizes  # not declared: the default, none
    dtypes = frozenset({"float32", "bfloat16", "float16"})
    platforms = frozenset({"lazyvendor", "cpu"})
