"""`kernelbay doctor`: the conformance kit's check of the installed plugins (kernelbay.testing.doctor)."""

from ..testing.doctor import add_arguments, run

__all__ = ["add_arguments", "run"]
