"""`BackendTokenizer`: a `tokenizers.Tokenizer` with its special tokens, BOS/EOS flags and chat template, as
transformers' `TokenizersBackend` holds them, without importing transformers (~0.5 s and ~18 MiB of a GGUF run that
needs nothing else of it).

What the engine calls (`kernelbay_engine.tokenizer.Tokenizer`) behaves as transformers' class does on the same
backend: `tok(text, add_special_tokens=...)["input_ids"]`, `decode(ids, skip_special_tokens=...)` (no clean-up of
spaces: transformers skips it for BPE) and `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`
(kernelbay_engine.chat_template). Set-up follows `TokenizersBackend.__init__`: a named special token the backend
lacks is added to it as special, and the post-processor adds BOS / EOS as the flags say (neither without its token).
plugins/gguf/tests/test_tokenizer.py holds the two equal: backend, special tokens, ids, text and templates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kernelbay_engine.chat_template import render_chat

# transformers' SPECIAL_TOKENS_ATTRIBUTES, in its order (all_special_tokens lists them so)
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class BackendTokenizer:
    """Encode, decode and render chats with `backend` (a `tokenizers.Tokenizer`, changed in place as transformers
    changes it: missing special tokens added, the post-processor set)."""

    def __init__(
        self,
        backend,
        *,
        special_tokens: Mapping[str, str | None],
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_template: str | None = None,
    ):
        unknown = set(special_tokens) - set(SPECIAL_NAMES)
        if unknown:
            raise ValueError(f"unknown special token names {sorted(unknown)}; expected some of {SPECIAL_NAMES}")
        self.backend_tokenizer = backend
        self.special_tokens_map: dict[str, str] = {
            name: token for name in SPECIAL_NAMES if (token := special_tokens.get(name)) is not None
        }
        self.chat_template = chat_template
        self._add_missing_special_tokens()
        self.add_bos_token = bool(add_bos_token) and self.bos_token is not None
        self.add_eos_token = bool(add_eos_token) and self.eos_token is not None
        self._set_post_processor()

    bos_token = property(lambda self: self.special_tokens_map.get("bos_token"))
    eos_token = property(lambda self: self.special_tokens_map.get("eos_token"))
    unk_token = property(lambda self: self.special_tokens_map.get("unk_token"))
    pad_token = property(lambda self: self.special_tokens_map.get("pad_token"))
    bos_token_id = property(lambda self: self._id(self.bos_token))
    eos_token_id = property(lambda self: self._id(self.eos_token))
    pad_token_id = property(lambda self: self._id(self.pad_token))

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens, each once, in transformers' order."""
        return list(dict.fromkeys(self.special_tokens_map.values()))

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids}

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        return self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
    ) -> str | list[int]:
        """`messages` rendered by the chat template (token ids unless tokenize=False, no special tokens added)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        text = render_chat(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens_map,
        )
        return self(text, add_special_tokens=False)["input_ids"] if tokenize else text

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    def _add_missing_special_tokens(self) -> None:
        """A named special token the backend's added vocabulary lacks, added as special (transformers' rule)."""
        from tokenizers import AddedToken

        added = {str(token) for token in self.backend_tokenizer.get_added_tokens_decoder().values()}
        missing = [token for token in self.all_special_tokens if token not in added]
        if missing:
            self.backend_tokenizer.add_tokens([AddedToken(token, special=True) for token in missing])

    def _set_post_processor(self) -> None:
        """BOS before (and EOS after) each sequence as the flags say, as transformers' `update_post_processor`."""
        from tokenizers import processors

        bos, eos = self.bos_token, self.eos_token

        def sequence(name: str, type_id: int) -> str:
            before = f"{bos}:{type_id} " if self.add_bos_token else ""
            return f"{before}${name}:{type_id}{f' {eos}:{type_id}' if self.add_eos_token else ''}"

        single, pair = sequence("A", 0), f"{sequence('A', 0)} {sequence('B', 1)}"
        special = [(bos, self.bos_token_id)] if self.add_bos_token else []
        special += [(eos, self.eos_token_id)] if self.add_eos_token else []
        self.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=special
        )
