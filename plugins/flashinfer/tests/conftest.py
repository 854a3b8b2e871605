"""kernelbay-flashinfer's tests run against the plugin installed for real (pip --target) by tests/ecosystem; off a
GPU, its backends run on fake_flashinfer.py, a stand-in for FlashInfer's documented API."""

from __future__ import annotations

from tests.ecosystem.conftest import _sites_importable, make_registry, sites  # noqa: F401  (fixtures)
