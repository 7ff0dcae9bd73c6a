"""Cutting a list's rows to a page and its next cursor, without a database: a list reads one row
more than it shows, and that row only says that another page follows."""

import pytest

from app.http.pagination import BIGINT_KEY, INT_KEY, Page, cut, encode_cursor, page_of


def seq_cursor(seq: int) -> str:
    return encode_cursor(seq)


def test_a_page_reads_one_row_more_than_it_shows() -> None:
    assert Page(3, None, (BIGINT_KEY,)).fetch == 4
    assert Page(1, "7", (BIGINT_KEY,)).fetch == 2


@pytest.mark.parametrize(
    ("read", "shown", "more"),
    [
        ([], [], False),
        ([1, 2], [1, 2], False),
        ([1, 2, 3], [1, 2, 3], False),
        ([1, 2, 3, 4], [1, 2, 3], True),
    ],
)
def test_cut_shows_at_most_the_limit_and_says_whether_more_follow(
    read: list[int], shown: list[int], more: bool
) -> None:
    assert cut(read, 3) == (shown, more)


def test_the_next_cursor_is_that_of_the_last_row_shown() -> None:
    page = Page(3, None, (BIGINT_KEY,))
    assert page_of([10, 11, 12, 13], page, seq_cursor) == ([10, 11, 12], "12")
    assert page.after() is None


def test_the_last_page_has_no_next_cursor() -> None:
    page = Page(3, "12", (BIGINT_KEY,))
    assert page.after() == (12,)
    assert page_of([13, 14, 15], page, seq_cursor) == ([13, 14, 15], None)
    assert page_of([13], page, seq_cursor) == ([13], None)
    assert page_of([], page, seq_cursor) == ([], None)


def test_a_cursor_of_several_keys_reads_back_as_them() -> None:
    rows = [(1, 1), (2, 1), (2, 2)]  # (turn_first, part) of chunk pieces
    shown, cursor = page_of(rows, Page(2, None, (BIGINT_KEY, INT_KEY)), lambda r: encode_cursor(*r))
    assert (shown, cursor) == ([(1, 1), (2, 1)], "2.1")
    assert Page(2, cursor, (BIGINT_KEY, INT_KEY)).after() == (2, 1)


def test_cut_keeps_the_rows_it_is_given() -> None:
    rows = [object() for _ in range(5)]
    shown, more = cut(rows, 2)
    assert more and all(a is b for a, b in zip(shown, rows[:2], strict=True))
