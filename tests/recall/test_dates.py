from datetime import UTC, datetime

from app.core.dates import date_terms, parse_when, query_date_terms, said_at

NOW = datetime(2023, 7, 12, 15, 0, tzinfo=UTC)  # a Wednesday


def test_parse_when_reads_iso_and_dates_in_words() -> None:
    expected = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert parse_when("1:56 pm on 8 May, 2023") == expected
    assert parse_when("2023-05-08T13:56:00Z") == expected
    assert parse_when("2023-05-08T15:56:00+02:00") == expected
    assert parse_when("May 8, 2023") == datetime(2023, 5, 8, tzinfo=UTC)
    assert parse_when("2023年5月8日") == datetime(2023, 5, 8, tzinfo=UTC)
    assert parse_when("12:05 am on 1 Jan, 2024") == datetime(2024, 1, 1, 0, 5, tzinfo=UTC)
    for bad in ("soon", "31 February, 2023", "", None, 17):
        assert parse_when(bad) is None


def test_said_at_prefers_the_client_time() -> None:
    stored = datetime(2026, 1, 1, tzinfo=UTC)
    assert said_at({"time": "8 May 2023"}, stored) == datetime(2023, 5, 8, tzinfo=UTC)
    assert said_at({"time": "whenever"}, stored) == stored
    assert said_at(None, stored) == stored


def test_date_terms_are_days_and_months() -> None:
    first, last = datetime(2023, 5, 31, 23, 0, tzinfo=UTC), datetime(2023, 6, 1, 1, 0, tzinfo=UTC)
    assert date_terms(first, last) == ["2023-05-31", "2023-05", "2023-06-01", "2023-06"]


def test_relative_expressions_in_english_and_chinese() -> None:
    assert query_date_terms("what did I buy yesterday?", NOW) == ["2023-07-11"]
    assert query_date_terms("我昨天买了什么？", NOW) == ["2023-07-11"]
    week = [f"2023-07-{d:02d}" for d in range(3, 10)]  # Monday to Sunday before NOW's week
    assert query_date_terms("what happened last week", NOW) == week
    assert query_date_terms("上周发生了什么", NOW) == week
    assert query_date_terms("the bill from last month", NOW) == ["2023-06"]
    assert query_date_terms("上个月的账单", NOW) == ["2023-06"]
    assert query_date_terms("what did we do in May?", NOW) == ["2023-05"]
    assert query_date_terms("in September", NOW) == ["2022-09"]  # the latest September
    assert query_date_terms("5月份去了哪里", NOW) == ["2023-05"]
    assert query_date_terms("3天前说的", NOW) == ["2023-07-09"]
    assert query_date_terms("two days ago", NOW) == ["2023-07-10"]
    assert query_date_terms("what is the hotel budget?", NOW) == []
    assert query_date_terms("我们可能会去", NOW) == []
