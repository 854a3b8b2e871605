"""Text <-> token ids through transformers' `AutoTokenizer` on the model folder (chat template if it has one)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from kernelbay.errors import KernelbayError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


class TokenizerError(KernelbayError, ValueError):
    """No tokenizer in the model folder, or it cannot do what was asked (e.g. no chat template)."""


def has_tokenizer(folder: str | Path) -> bool:
    return any((Path(folder) / name).is_file() for name in TOKENIZER_FILES)


class Tokenizer:
    """The folder's tokenizer: encode prompts, apply its chat template, decode generated ids."""

    def __init__(self, folder: str | Path, *, trust_remote_code: bool = False):
        if not has_tokenizer(folder):
            raise TokenizerError(
                f"{str(folder)!r} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                f"add one to the folder or pass prompts as lists of token ids"
            )
        from transformers import AutoTokenizer

        self.folder = Path(folder)
        self.hf = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    @property
    def eos_token_ids(self) -> set[int]:
        eos = self.hf.eos_token_id
        return set() if eos is None else {int(eos)}

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with the special tokens the tokenizer adds (BOS for Llama)."""
        return list(self.hf(text)["input_ids"])

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of `messages` ([{"role": ..., "content": ...}]) rendered by the chat template."""
        if not self.has_chat_template:
            raise TokenizerError(
                f"the tokenizer in {str(self.folder)!r} has no chat template; "
                f"pass a plain prompt instead of chat messages"
            )
        text = self.hf.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=True)
