"""Keyset pagination shared by every list endpoint: the page size (at most
`CONTEXTD_LIMITS__MAX_PAGE_SIZE`) and a cursor, a tuple of non-negative integers (e.g. seq, or
turn_first and part) joined by dots.

Clients treat cursors as opaque; the format is plain so that the OpenAPI document states exactly
which strings are cursors of a list (`cursor_pattern`), and so that no cursor can carry a number
its column cannot hold. Cursors of the earlier base64 form are refused (422, `cursor`).

A list reads `page.fetch` rows (one more than it shows) and `page_of` cuts them to the page and
the next page's cursor.
"""

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, NamedTuple, TypeVar

from fastapi import Query

from app.core.config import MAX_PAGE_SIZE
from app.core.errors import InvalidInput
from app.http.deps import SettingsDep

# Digits a key may have so that it fits its column: 18 stay below the bigint maximum
# (2**63 - 1, 19 digits), 9 below the integer maximum (2**31 - 1, 10 digits); a UUID as an
# integer has up to 39.
BIGINT_KEY, INT_KEY, UUID_KEY = 18, 9, 39

# The largest value `since_seq`-like filters on a bigint column take.
CURSOR_VALUE_MAX = 2**63 - 1


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


class Page(NamedTuple):
    limit: int  # rows to return
    cursor: str | None
    keys: tuple[int, ...]  # the most digits of each key of this list's cursors

    @property
    def fetch(self) -> int:
        """Rows to read: one more than a page shows tells whether another page follows."""
        return self.limit + 1

    def after(self) -> tuple[int, ...] | None:
        """The keys of the last row of the previous page, or None on the first page."""
        return decode_cursor(self.cursor, *self.keys) if self.cursor else None


Row = TypeVar("Row")  # a row of a list, as its repository reads it


def cut(rows: list[Row], limit: int) -> tuple[list[Row], bool]:
    """The `limit` rows a page shows of the `limit + 1` read, and whether another page follows."""
    return rows[:limit], len(rows) > limit


def page_of(
    rows: list[Row], page: Page, cursor_of: Callable[[Row], str]
) -> tuple[list[Row], str | None]:
    """The rows `page` shows of the `page.fetch` read, and the cursor of the next page (that of
    the last row shown), None on the last page."""
    shown, more = cut(rows, page.limit)
    return shown, cursor_of(shown[-1]) if more else None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def created_cursor(created_at: datetime, row_id: uuid.UUID) -> str:
    """The cursor of a row of a list in (created_at, id) order: microseconds since the epoch
    and the id as a 128-bit integer (keys `BIGINT_KEY, UUID_KEY`)."""
    return encode_cursor((created_at - _EPOCH) // timedelta(microseconds=1), row_id.int)


def created_after(page: Page) -> tuple[datetime, uuid.UUID] | None:
    """The (created_at, id) of the last row of the previous page of such a list."""
    keys = page.after()
    if keys is None:
        return None
    micros, id_int = keys
    try:
        return _EPOCH + timedelta(microseconds=micros), uuid.UUID(int=id_int)
    except (ValueError, OverflowError) as exc:  # beyond a datetime or a UUID
        raise InvalidInput("malformed cursor", field="cursor") from exc


def page_params(*keys: int) -> Callable[..., Awaitable[Page]]:
    """The dependency reading `limit` and `cursor` of a list whose cursor has `keys` (async
    although it does no I/O: see app.http.deps)."""

    async def read_page(
        settings: SettingsDep,
        limit: Annotated[
            int,
            Query(
                ge=1,
                le=MAX_PAGE_SIZE,
                description="page size; values above CONTEXTD_LIMITS__MAX_PAGE_SIZE are reduced "
                "to it",
            ),
        ] = 100,
        cursor: Annotated[
            str | None,
            Query(
                pattern=cursor_pattern(*keys),
                description="`next_cursor` of the previous page",
            ),
        ] = None,
    ) -> Page:
        return Page(min(limit, settings.limits.max_page_size), cursor, keys)

    return read_page
