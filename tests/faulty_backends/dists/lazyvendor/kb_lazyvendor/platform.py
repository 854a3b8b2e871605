"""The vendor's platform (selected with KERNELBAY_PLATFORM=lazyvendor): its own backend first."""

from kernelbay.platforms import Platform


class LazyPlatform(Platform):
    name = "lazyvendor"
    device_type = "cpu"

    def is_current(self):
        return False, "fixture platform: only selected by name"

    def backend_priority(self):
        return ["LAZY_ATTN", "SDPA"]
