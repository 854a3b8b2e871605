"""The vendor's platform, current when its (simulated) device is visible: LAZYVENDOR_VISIBLE_DEVICES is set."""

import os

from kernelbay.platforms import Platform


class LazyPlatform(Platform):
    name = "lazyvendor"
    device_type = "cpu"

    def is_current(self):
        if os.environ.get("LAZYVENDOR_VISIBLE_DEVICES"):
            return True, "LAZYVENDOR_VISIBLE_DEVICES is set"
        return False, "no lazyvendor device visible (LAZYVENDOR_VISIBLE_DEVICES is not set)"

    def backend_priority(self):
        return ["LAZY_ATTN", "SDPA"]
