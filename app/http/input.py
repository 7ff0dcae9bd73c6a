"""What every JSON request body must satisfy before any domain sees it.

PostgreSQL can store neither a NUL character (in `text` or `jsonb`) nor a lone UTF-16 surrogate
(JSON's `"\\ud800"` decodes to one; it has no UTF-8 form), and deeply nested JSON costs recursion
everywhere it is walked. Such input is refused with a 422 naming the field (`turns[0].content`,
`turns[0].metadata.note`, `system[1].content`, ...), never half-stored or answered with a 500.
Every top-level request model derives from `RequestBody`.
"""

import json
import re
from typing import Any

from pydantic import AfterValidator, BaseModel, model_validator
from pydantic_core import PydanticCustomError

from app.core.errors import InvalidText, PayloadTooLarge, TooDeep
from app.http.errors import Rule

BIGINT_MAX = 2**63 - 1  # PostgreSQL bigint: seq, turn ranges, cursor keys
MAX_JSON_DEPTH = 32  # nesting of objects and arrays in a request body, the body itself being 1
_BAD_CHAR_RE = re.compile("[\x00\ud800-\udfff]")

# The rules every request body obeys beyond its schema (see `app.http.errors.with_rules`).
BODY_RULES = (
    Rule(InvalidText, "no string or object key holds NUL (U+0000) or a lone surrogate"),
    Rule(TooDeep, f"JSON nested at most {MAX_JSON_DEPTH} levels"),
    Rule(PayloadTooLarge, "a body within limits.max_body_bytes"),
)


# The rule of a free-text path or query parameter (`StorableText`).
PARAMETER_RULE = Rule(InvalidText, "no text parameter holds NUL (U+0000) or a lone surrogate")


def json_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON (how limits on metadata and tool calls count)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def find_bad_input(value: Any, path: str = "", depth: int = 1) -> tuple[str, str, str] | None:
    """The first problem in a decoded JSON value: (error code, field path, message), or None."""
    if isinstance(value, str):
        bad = _BAD_CHAR_RE.search(value)
        if bad is None:
            return None
        what = "a NUL character" if bad.group(0) == "\x00" else "a lone UTF-16 surrogate"
        return InvalidText.code, path, f"text holds {what} (U+{ord(bad.group(0)):04X})"
    if not isinstance(value, dict | list):
        return None
    if depth > MAX_JSON_DEPTH:
        return TooDeep.code, path, f"JSON nested deeper than {MAX_JSON_DEPTH} levels"
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(key, str) and _BAD_CHAR_RE.search(key):
            return InvalidText.code, _child(path, "<key>"), "an object key holds a NUL or surrogate"
        problem = find_bad_input(item, _child(path, key), depth + 1)
        if problem is not None:
            return problem
    return None


class RequestBody(BaseModel):
    """Base of request bodies: rejects NUL, lone surrogates and over-deep nesting anywhere."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_unstorable_input(cls, data: Any) -> Any:
        problem = find_bad_input(data)
        if problem is not None:
            code, field, message = problem
            raise PydanticCustomError(code, "{message}", {"message": message, "field": field})
        return data


def _storable(value: str) -> str:
    problem = find_bad_input(value)
    if problem is not None:
        code, _, message = problem
        raise PydanticCustomError(code, "{message}", {"message": message})
    return value


# A free-text path or query parameter, refused like a body's text (422 `invalid_text` naming the
# parameter) rather than reaching PostgreSQL: `Annotated[str, Query(...), StorableText]`.
StorableText = AfterValidator(_storable)
