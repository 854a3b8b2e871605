"""`kernelbay check-backend`: the conformance kit's command (kernelbay.testing.command)."""

from ..testing.command import add_arguments, run

__all__ = ["add_arguments", "run"]
