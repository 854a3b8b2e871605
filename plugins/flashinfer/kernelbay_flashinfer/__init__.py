"""kernelbay-flashinfer: FLASHINFER and FLASHINFER_MLA attention backends.

flashinfer itself is imported only inside functions, when a layer really runs: importing this package,
listing it, and asking its backends their capabilities and availability works without flashinfer.
"""
