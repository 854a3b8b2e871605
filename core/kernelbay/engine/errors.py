"""The user-input errors the engine and the CLI report, each with its own process exit code.

Exit codes (`kernelbay run` / `kernelbay explain`; documented in docs/engine.md):

    1  any other kernelbay error          7  unknown attention backend
    2  command-line usage (argparse)      8  attention backend cannot run this model
    3  model folder does not exist        9  missing or partial weights
    4  folder has no config.json         10  prompt longer than the model's context
    5  config.json is not valid JSON     11  invalid sampling parameter (max_tokens <= 0, ...)
    6  unsupported architecture          12  a request can never fit in the KV cache
"""

from __future__ import annotations

# The model-folder errors are raised where config.json is read (kernelbay.config); re-exported here.
from ..errors import (ConfigError, InputError, MalformedConfig, MissingConfigFile, ModelFolderNotFound,
                      UnknownNameError)


class UnsupportedArchitecture(InputError, UnknownNameError):
    exit_code = 6


class UnknownBackend(InputError, UnknownNameError):
    exit_code = 7


class IncapableBackend(InputError, ConfigError):
    exit_code = 8


class MissingWeights(InputError, ValueError):
    exit_code = 9


class PromptTooLong(InputError, ValueError):
    exit_code = 10


class SamplingParamsError(InputError, ValueError):
    """A sampling parameter out of range; the message names the parameter and the valid range."""

    exit_code = 11


class RequestTooLarge(InputError, MemoryError):
    """A single request needs more KV-cache blocks than the whole cache has: it could never run."""

    exit_code = 12


EXIT_CODES = {cls.__name__: cls.exit_code for cls in (
    InputError, ModelFolderNotFound, MissingConfigFile, MalformedConfig, UnsupportedArchitecture, UnknownBackend,
    IncapableBackend, MissingWeights, PromptTooLong, SamplingParamsError, RequestTooLarge)}
