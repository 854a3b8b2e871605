"""kernelbay_engine.chat_template renders a chat template as transformers' `render_jinja_template` does (the same
text for each template shape below), in jinja2's sandbox, without importing transformers."""

from __future__ import annotations

import jinja2
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from kernelbay_engine.chat_template import render_chat
from tests._fresh import run_fresh

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None}
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEMPLATES = {
    "chatml": CHATML,
    "bos and eos in scope, trimmed blocks": (
        "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'user' %}\n[INST] {{ m.content | trim }} [/INST]\n"
        "  {% else %}\n{{ m.content }}{{ eos_token }}\n  {% endif %}\n{% endfor %}"
    ),
    "namespace, loop controls, tojson": (
        "{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% if m.role == 'system' %}{% continue %}"
        "{% endif %}{% set ns.n = ns.n + 1 %}{% set ns.last = m.content %}{% if ns.n > 2 %}{% break %}{% endif %}"
        "{{ m | tojson }}|{% endfor %}{{ ns.n }}:{{ ns.last }}{{ dict(a=1) | tojson }}{{ {'x': '<&>'} | tojson }}"
    ),
    "generation block": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}A: {{ m.content }}{% endgeneration %}"
        "{% else %}U: {{ m.content }}{% endif %}\n{% endfor %}"
    ),
    "reasoning aliases": (
        "{% for m in messages %}{{ m.thinking }}/{{ m.reasoning_content }}/{{ m.content }};{% endfor %}"
    ),
    "date": "{{ strftime_now('%Y') | length }}{{ messages | length }}",
}
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": '  two\n\nlines ✓ <think> "quoted" '},
    {"role": "assistant", "content": "b", "reasoning": "thought"},
    {"role": "user", "content": "c"},
]


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_the_text_is_transformers_own(name, add_generation_prompt):
    template = TEMPLATES[name]
    ours = render_chat(template, CHAT, add_generation_prompt=add_generation_prompt, special_tokens=SPECIAL)
    (theirs,), _ = render_jinja_template(
        [CHAT], chat_template=template, add_generation_prompt=add_generation_prompt, **SPECIAL
    )
    assert ours == theirs


def test_the_callers_messages_are_not_changed():
    chat = [{"role": "assistant", "content": "x", "thinking": "t"}]
    render_chat(TEMPLATES["reasoning aliases"], chat, add_generation_prompt=False, special_tokens={})
    assert chat == [{"role": "assistant", "content": "x", "thinking": "t"}]


def test_a_template_raising_is_a_template_error():
    template = (
        "{% if messages[0].role != 'user' %}{{ raise_exception('the first message must be the user') }}{% endif %}"
    )
    with pytest.raises(jinja2.TemplateError, match="the first message must be the user"):
        render_chat(template, [{"role": "system", "content": "x"}], add_generation_prompt=False, special_tokens={})


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__mro__ }}",  # the sandbox refuses dunder attributes
        "{% set ns = namespace(_secret=1) %}{{ ns._secret }}",  # and namespaces refuse underscore names
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ messages.append(1) }}",  # immutable: a template cannot change its inputs
    ],
)
def test_the_sandbox_refuses_reaching_outside(template):
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat(template, CHAT, add_generation_prompt=False, special_tokens={})


def test_objects_reach_the_template_as_placeholders():
    """A message holding a non-JSON object shows the template only its type's name (transformers' rule)."""
    chat = [{"role": "user", "content": object()}]
    assert render_chat("{{ messages[0].content }}", chat, add_generation_prompt=False, special_tokens={}) == "<object>"


def test_rendering_imports_no_transformers():
    code = (
        "from kernelbay_engine.chat_template import render_chat; "
        "assert render_chat('{{ messages[0].content }}', [{'role': 'user', 'content': 'x'}], "
        "add_generation_prompt=False, special_tokens={}) == 'x'"
    )
    run_fresh(code, absent=["transformers"])
