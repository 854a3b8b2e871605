"""A chat template rendered as transformers' `apply_chat_template(messages, tokenize=False)` renders it, without
transformers (its import is ~0.5 s and ~18 MiB of a GGUF run, which needs nothing else of it).

The template is a model's own Jinja code, so it runs in jinja2's immutable sandbox with transformers' environment:
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `{% generation %}` block (transformers tracks the
assistant's spans with it; rendered here as its body), `tojson` without HTML escaping, `raise_exception`,
`strftime_now`, and `dict` / `namespace` that refuse underscore names. Its inputs are plain JSON data (copies: a
template cannot reach the caller's objects), a message's reasoning under each name templates read, and the
tokenizer's special tokens (`bos_token`, ...). plugins/engine/tests/test_chat_template.py compares the rendered text
with transformers' for each template shape, plugins/gguf/tests/test_tokenizer.py on GGUF files' templates.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' names; the first is standard


def render_chat(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    special_tokens: Mapping[str, str | None],
) -> str:
    """`messages` rendered by `template`, the tokenizer's `special_tokens` (`bos_token`, `eos_token`, ...) in scope;
    a template's own `raise_exception` or any Jinja error propagates (the caller names the template)."""
    chat = [_with_reasoning_aliases(message) for message in _plain(list(messages))]
    for message in chat:
        if not isinstance(message, dict):
            raise TypeError(f"chat messages must be dicts, got {message!r}")
    return _compiled(template).render(
        messages=chat,
        tools=None,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **_plain(dict(special_tokens)),
    )


def _plain(value: Any) -> Any:
    """A copy of `value` in plain JSON types (str, int, float, bool, None, dict, list, tuple); anything else is a
    placeholder naming its type, so a template reaches no object's methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # a subclass (an enum, say) back to its base type
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    return f"<{type(value).__name__}>"


def _with_reasoning_aliases(message: Any) -> Any:
    """A message's reasoning under every name templates read (`thinking` for gpt-oss's, `reasoning_content`)."""
    if not isinstance(message, dict):
        return message
    reasoning = next((message[key] for key in REASONING_FIELDS if message.get(key) is not None), None)
    return message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """The template compiled once in the sandboxed environment (a server renders it per request)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_generation_block(), jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(), namespace=_namespace()
    )
    return env.from_string(template)


def _generation_block():
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's text with it; its body here."""
    import jinja2.ext
    import jinja2.nodes

    class GenerationBlock(jinja2.ext.Extension):
        tags = {"generation"}  # noqa: RUF012  # jinja2's Extension declares a set

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    return GenerationBlock


def _raise_exception(message: str):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """json.dumps, not Jinja's own filter (which escapes <, > and & for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` in a template, without the type's other attributes."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


@functools.cache
def _namespace():
    """jinja2's `namespace`, refusing underscore-prefixed attributes (a way toward Python's internals)."""
    import jinja2.exceptions
    import jinja2.utils

    def check(name) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template cannot store underscore-prefixed attributes on a namespace, got {name!r}"
            )

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):  # jinja2's own signature trick: `namespace(self=...)` still works
            self, args = args[0], args[1:]
            attributes = dict(*args, **kwargs)
            for name in attributes:
                check(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name, value):
            check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    return TemplateNamespace
