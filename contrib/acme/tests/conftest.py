"""kernelbay-acme's tests run against the package installed for real (pip --target), as a vendor's CI would: the
installed sites of tests/ecosystem, whose precedence tests put kernelbay-acme against the built-in plugins."""

from __future__ import annotations

from tests.ecosystem.conftest import _sites_importable, make_registry, sites  # noqa: F401  (fixtures)
