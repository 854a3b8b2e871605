"""The Acme platform. Real Acme hardware does not exist: detection is simulated by an environment variable."""

from __future__ import annotations

import os

from kernelbay.platforms import Platform

VISIBLE_DEVICES_ENV = "ACME_VISIBLE_DEVICES"


def visible_devices(environ=None) -> list[str]:
    """Device ids listed in ACME_VISIBLE_DEVICES ("0,1" -> ["0", "1"]); empty when unset or blank."""
    raw = (os.environ if environ is None else environ).get(VISIBLE_DEVICES_ENV, "")
    return [d.strip() for d in raw.split(",") if d.strip()]


class AcmePlatform(Platform):
    name = "acme"
    # The simulated device computes on the host; a real vendor would name its torch device type here.
    device_type = "cpu"
    # Acme's own kernel first; SDPA and VANILLA serve the layer kinds ACME_INT8 declines.
    default_priority = ("ACME_INT8", "SDPA", "VANILLA")

    def is_current(self) -> tuple[bool, str]:
        devices = visible_devices()
        if not devices:
            return False, f"{VISIBLE_DEVICES_ENV} is not set: no Acme device is visible"
        return True, f"{len(devices)} Acme device(s) visible ({VISIBLE_DEVICES_ENV}={','.join(devices)})"
