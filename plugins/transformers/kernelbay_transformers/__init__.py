"""kernelbay-transformers: the fallback model provider (transformers' modeling code on kernelbay's paged attention)."""
