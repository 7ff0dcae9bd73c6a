from datetime import UTC, datetime

from app.domain.dates import date_terms, parse_when, query_date_terms, said_at

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


def test_dates_named_outright_in_english_and_chinese() -> None:
    def terms(query: str) -> list[str]:
        return query_date_terms(query, NOW)

    assert terms("How was John feeling on April 10, 2022?") == ["2022-04-10", "2022-04"]
    assert terms("what happened on 8 May 2023") == ["2023-05-08", "2023-05"]
    assert terms("the 2023-05-08 call") == ["2023-05-08", "2023-05"]
    assert terms("2022年4月10日他在做什么") == ["2022-04-10", "2022-04"]
    assert terms("Did Andrew have a dog during March 2021?") == ["2021-03"]  # not the latest
    assert terms("2021年3月去了哪里") == ["2021-03"]
    # without a year: the latest such day on or before the conversation's time
    assert terms("what did we agree on May 3?") == ["2023-05-03", "2023-05"]
    assert terms("the party on 20 August") == ["2022-08-20", "2022-08"]
    assert terms("4月10号发生了什么") == ["2023-04-10", "2023-04"]
    # a range: every day of it, up to a month
    assert terms("Where was John between August 11 and August 14 2022?") == [
        "2022-08-11",
        "2022-08",
        "2022-08-12",
        "2022-08-13",
        "2022-08-14",
    ]
    assert terms("从2023年5月1日到2023年5月3日") == [
        "2023-05-01",
        "2023-05",
        "2023-05-02",
        "2023-05-03",
    ]
    assert terms("between May 1, 2021 and May 1, 2023") == [
        "2021-05-01",
        "2021-05",
        "2023-05-01",
        "2023-05",
    ]  # too long a range: its ends only
    for no_date in ("May I ask what the budget is?", "order 4471 of 12 items", "at 10:30"):
        assert terms(no_date) == []
