"""kernelbay-llama plugin."""
