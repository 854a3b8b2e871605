"""generation_config.json: the end-of-sequence tokens a checkpoint's generation stops at.

transformers' `generate` stops at the `eos_token_id` of generation_config.json, which may list more tokens than
config.json (Llama 3 Instruct: `<|end_of_text|>` and `<|eot_id|>`). A file or field kernelbay cannot read is
ignored with a warning naming the file and the field, never silently.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from kernelbay.errors import MalformedConfig

from ._loading import read_json

GENERATION_CONFIG = "generation_config.json"
_IGNORED = "ignored, so generation does not stop at its end-of-sequence tokens; fix the file or remove it"


class GenerationConfigWarning(UserWarning):
    """generation_config.json, or a field of it kernelbay reads, is malformed: it is ignored."""


def generation_eos_token_ids(folder: Path, vocab_size: int) -> set[int]:
    """The `eos_token_id`s of the folder's generation_config.json (none without one, or for a weight file such as
    x.gguf); a malformed file or field is a GenerationConfigWarning naming it, and adds nothing."""
    file = folder / GENERATION_CONFIG
    if not folder.is_dir() or not file.is_file():
        return set()
    try:
        data = read_json(file)
    except MalformedConfig as err:
        line = re.search(r"at line (\d+)", str(err))
        return _ignored(file, f"{err} It is {_IGNORED}.", int(line[1]) if line else 1)
    except OSError as err:
        return _ignored(file, f"{file} cannot be read ({err.strerror}); it is {_IGNORED}.")
    if not isinstance(data, dict):
        return _ignored(file, f"{file} holds a JSON {type(data).__name__}, not an object; it is {_IGNORED}.")
    eos = data.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids):
        message = (
            f"{file}: eos_token_id {eos!r} is not a token id or a list of token ids (0 to {vocab_size - 1}); "
            f"the field is {_IGNORED.replace('the file', 'it')}."
        )
        return _ignored(file, message, _line_of(file, '"eos_token_id"'))
    return set(ids)


def _ignored(file: Path, message: str, line: int = 1) -> set[int]:
    """Warn at the file's own line (what a terminal shows under the message), and add no token."""
    warnings.warn_explicit(message, GenerationConfigWarning, str(file), line, module="kernelbay_engine.config")
    return set()


def _line_of(file: Path, text: str) -> int:
    lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    return next((number for number, line in enumerate(lines, 1) if text in line), 1)
