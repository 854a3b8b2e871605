"""kernelbay-deepseek plugin."""
