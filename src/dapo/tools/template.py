"""A tool-aware variant of the built-in character tokenizer's chat template.

With ``tools`` it puts one compact system line first (``tools: name(arg, ...); ...``) and
renders ``tool`` messages as ``<|tool|>result<|end|>``; without tools it renders exactly
as :data:`dapo.model.tokenizer.CHAT_TEMPLATE`. Real models bring their own tool-aware
templates (Qwen2.5 renders the schemas and ``<tool_call>`` instructions itself).
"""

from __future__ import annotations

from typing import Any

TOOL_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>tools: "
    "{% for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}"
    "{{ f.name }}({{ (f.parameters.properties if f.parameters is defined and f.parameters.properties is defined "
    "else {}) | list | join(', ') }}){% if not loop.last %}; {% endif %}{% endfor %}<|end|>{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tool_tokenizer() -> Any:
    """The character tokenizer with the tool-aware template."""
    from dapo.model.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = TOOL_CHAT_TEMPLATE
    return tok
