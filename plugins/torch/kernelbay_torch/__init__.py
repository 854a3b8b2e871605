"""kernelbay-torch plugin."""
