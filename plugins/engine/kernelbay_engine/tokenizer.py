"""Text <-> token ids through transformers' `AutoTokenizer` on the model folder, or the tokenizer a weight
file carries (x.gguf, built by its format plugin); the chat template if it has one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from kernelbay.errors import InputError, KernelbayError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


class TokenizerError(KernelbayError, ValueError):
    """No tokenizer in the model folder, or it cannot do what was asked (e.g. no chat template)."""


def check_prompt_text(text, what: str = "the prompt") -> str:
    """`text` if it is a str that UTF-8 can encode; lone surrogates (what undecodable bytes become) are refused."""
    if not isinstance(text, str):
        raise InputError(f"{what} must be a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(
            f"{what} is not valid Unicode text: {text[err.start]!r} at character {err.start} is a lone surrogate "
            "(often invalid UTF-8 bytes decoded with surrogateescape); pass valid UTF-8 text"
        ) from None
    return text


def has_tokenizer(folder: str | Path) -> bool:
    """A folder's tokenizer files, or (a weight file, x.gguf) a tokenizer in the file's metadata."""
    path = Path(folder)
    if path.is_file():
        return bool(getattr(_file_format(path), "has_tokenizer", lambda _: False)(path))
    return any((path / name).is_file() for name in TOKENIZER_FILES)


def _names_its_class(folder: Path, trust_remote_code: bool) -> bool:
    """Whether tokenizer_config.json names the tokenizer class and AutoTokenizer needs the config for nothing else:
    no remote code (its auto_map, or trust_remote_code, reads the folder's own config)."""
    import json

    try:
        entries = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none, or unreadable: AutoTokenizer reads the folder (and says what is wrong)
        return False
    return (
        isinstance(entries, dict)
        and isinstance(entries.get("tokenizer_class"), str)
        and "auto_map" not in entries
        and not trust_remote_code
    )


def _file_format(path: Path):
    from kernelbay_engine.loading.formats import format_for

    return format_for(path)


class Tokenizer:
    """The folder's tokenizer: encode prompts, apply its chat template, decode generated ids."""

    def __init__(self, folder: str | Path, *, trust_remote_code: bool = False, config=None):
        """`config`: the folder's transformers config as the engine parsed it; AutoTokenizer is given it (instead of
        parsing config.json again with its class: LlamaConfig's import alone is ~0.9 s) where tokenizer_config.json
        names its class, which is then what AutoTokenizer builds whichever config it holds."""
        if not has_tokenizer(folder):
            raise TokenizerError(
                f"{str(folder)!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                f"add one to the folder or pass prompts as lists of token ids"
            )
        self.folder = Path(folder)
        if self.folder.is_file():  # the weight format builds it from the file's metadata (its errors name it)
            self.hf = _file_format(self.folder).tokenizer(self.folder)
            return
        from transformers import AutoTokenizer  # imports transformers' `models` package (~0.4 s): folders only

        given = {"config": config} if config is not None and _names_its_class(self.folder, trust_remote_code) else {}
        try:
            self.hf = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code, **given)
        except Exception as err:  # transformers/tokenizers raise anything (KeyError, bare Exception) on bad files
            raise TokenizerError(
                f"the tokenizer in {str(folder)!r} cannot be loaded ({type(err).__name__}: {err}); "
                f"repair or re-download {', '.join(n for n in TOKENIZER_FILES if (self.folder / n).exists())}"
            ) from err

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    @property
    def eos_token_ids(self) -> set[int]:
        eos = self.hf.eos_token_id
        return set() if eos is None else {int(eos)}

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with the special tokens the tokenizer adds (BOS for Llama)."""
        return list(self.hf(check_prompt_text(text))["input_ids"])

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of `messages` ([{"role": ..., "content": ...}]) rendered by the chat template."""
        if not self.has_chat_template:
            raise TokenizerError(
                f"the tokenizer in {str(self.folder)!r} has no chat template; "
                f"pass a plain prompt instead of chat messages"
            )
        for message in messages:
            if isinstance(message, Mapping) and isinstance(message.get("content"), str):
                check_prompt_text(message["content"], what="a chat message's content")
        try:
            text = self.hf.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        except Exception as err:  # the template is the folder's own Jinja code: it can raise anything
            where = "the file's tokenizer.chat_template" if self.folder.is_file() else "tokenizer_config.json"
            raise TokenizerError(
                f"the chat template in {str(self.folder)!r} failed ({type(err).__name__}: {err}); "
                f"fix chat_template in {where}, or pass --raw / a plain prompt"
            ) from err
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=True)
