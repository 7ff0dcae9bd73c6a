"""Keyset cursors: a tuple of non-negative integers (e.g. seq, or turn_first and part) joined by
dots. Clients treat them as opaque; the format is plain so that the OpenAPI document can state
exactly which strings are cursors (`cursor_pattern`), and every such string is one."""

from app.core.errors import InvalidInput

# Digits a key may have so that it fits its column: 18 stay below the bigint maximum
# (2**63 - 1, 19 digits), 9 below the integer maximum (2**31 - 1, 10 digits).
BIGINT_KEY, INT_KEY = 18, 9


def cursor_pattern(*digits: int) -> str:
    """The regular expression of a cursor whose keys have at most `digits` digits each."""
    return "^" + r"\.".join(rf"\d{{1,{d}}}" for d in digits) + "$"


def encode_cursor(*values: int) -> str:
    return ".".join(str(v) for v in values)


def decode_cursor(cursor: str, *digits: int) -> tuple[int, ...]:
    parts = cursor.split(".")
    if len(parts) != len(digits) or not all(
        p.isascii() and p.isdigit() and len(p) <= d for p, d in zip(parts, digits, strict=True)
    ):
        raise InvalidInput("malformed cursor", field="cursor")
    return tuple(int(p) for p in parts)
