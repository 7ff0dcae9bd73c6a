"""Opaque keyset cursors: a tuple of integers (e.g. seq, or turn_first and part), base64url."""

import base64

from app.core.errors import InvalidInput
from app.core.input import BIGINT_MAX


def encode_cursor(*values: int) -> str:
    raw = "k:" + ".".join(str(v) for v in values)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, size: int) -> tuple[int, ...]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, _, body = raw.partition(":")
        values = tuple(int(v) for v in body.split("."))
        if kind != "k" or len(values) != size or not all(0 <= v <= BIGINT_MAX for v in values):
            raise ValueError(raw)
        return values
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput("malformed cursor", field="cursor") from exc
