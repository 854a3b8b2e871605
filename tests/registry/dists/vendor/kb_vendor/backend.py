"""A vendor backend whose runtime dependency is missing: it fails to import on its own platform."""

import kb_vendor_runtime_not_installed  # noqa: F401


class VendorBackend:
    name = "VENDOR_ATTN"
