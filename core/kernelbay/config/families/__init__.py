"""Config classes kernelbay ships for `model_type`s transformers does not know.

They fill the `kernelbay.configs` slot only when it is empty: a plugin that provides the same
model type wins (built-in fills empty slots). None of them runs code from a model folder.

Each is declared as a `kernelbay.configs` entry point of the core distribution (pyproject.toml).
"""
