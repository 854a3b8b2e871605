"""A vendor platform (never current: tests select it by name) that puts its own backend first."""

from kernelbay.platforms import Platform


class VendorPlatform(Platform):
    name = "kbvendor"

    def is_current(self):
        return False, "fixture platform: only selected by name"

    def backend_priority(self):
        return ["VENDOR_ATTN", "SDPA"]
