"""Keyset pagination shared by every list endpoint: the page size (at most
`CONTEXTD_LIMITS__MAX_PAGE_SIZE`) and an opaque cursor, a tuple of integers in base64url."""

import base64
from typing import Annotated, NamedTuple

from fastapi import Depends, Query

from app.core.config import MAX_PAGE_SIZE
from app.core.deps import SettingsDep
from app.core.errors import InvalidInput

# Every value a cursor carries must fit a signed 64-bit column, except where a caller widens it.
CURSOR_VALUE_MAX = 2**63 - 1


def encode_cursor(*values: int) -> str:
    raw = "k:" + ".".join(str(v) for v in values)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, size: int, maximum: int = CURSOR_VALUE_MAX) -> tuple[int, ...]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, _, body = raw.partition(":")
        values = tuple(int(v) for v in body.split("."))
        if kind != "k" or len(values) != size or not all(0 <= v <= maximum for v in values):
            raise ValueError(raw)
        return values
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput("malformed cursor", field="cursor") from exc


class Page(NamedTuple):
    limit: int  # rows to return (the caller fetches one more to know if a next page exists)
    cursor: str | None


# async although it does no I/O: see app.core.deps
async def page_params(
    settings: SettingsDep,
    limit: Annotated[
        int,
        Query(
            ge=1,
            le=MAX_PAGE_SIZE,
            description="page size; values above CONTEXTD_LIMITS__MAX_PAGE_SIZE are reduced to it",
        ),
    ] = 100,
    cursor: Annotated[
        str | None, Query(max_length=200, description="`next_cursor` of the previous page")
    ] = None,
) -> Page:
    return Page(min(limit, settings.limits.max_page_size), cursor)


PageDep = Annotated[Page, Depends(page_params)]
