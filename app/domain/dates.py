"""When a turn was said, and the dates a question asks about. Pure: no I/O, no settings.

A client may send the time a turn was said in its metadata (`metadata.time`: ISO 8601, or a date
in words such as "1:56 pm on 8 May, 2023", "May 8, 2023", "2023年5月8日"); otherwise it is
the time the turn was stored. Offloaded history is dated by it (headers, chunk breaks), and each
chunk is searchable by its dates as terms: the day `YYYY-MM-DD` and the month `YYYY-MM`.
Relative expressions in a query ("yesterday", "last week", "in May", "上个月", "3天前") become
the same terms, counted from the time of the conversation's latest turn, and so do the dates it
names outright ("on April 10, 2022", "during March 2023", "2022年4月10日", "between August 11 and
August 15 2023").
"""

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any

TIME_KEY = "time"
MONTHS = {
    name: i + 1
    for i, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ]
    )
    for name in names
}
_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_CLOCK_RE = re.compile(r"(\d{1,2})[:.](\d{2})\s*([ap])\.?m\.?", re.IGNORECASE)
_DAY_MONTH_YEAR_RE = re.compile(
    rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH})\.?,?\s+(\d{{4}})\b", re.I
)
_MONTH_DAY_YEAR_RE = re.compile(
    rf"\b({_MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I
)
_ZH_DATE_RE = re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]")


def parse_when(value: Any) -> datetime | None:
    """A datetime (UTC when no zone is given) from ISO 8601 or a date in words; None if none."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is not None:
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    day: date | None = None
    if m := _DAY_MONTH_YEAR_RE.search(text):
        day = _date(int(m[3]), MONTHS[m[2].lower()], int(m[1]))
    elif m := _MONTH_DAY_YEAR_RE.search(text):
        day = _date(int(m[3]), MONTHS[m[1].lower()], int(m[2]))
    elif m := _ZH_DATE_RE.search(text):
        day = _date(int(m[1]), int(m[2]), int(m[3]))
    if day is None:
        return None
    hour = minute = 0
    if clock := _CLOCK_RE.search(text):
        hour, minute = int(clock[1]) % 12 + (12 if clock[3].lower() == "p" else 0), int(clock[2])
        if hour > 23 or minute > 59:
            hour = minute = 0
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)


def _date(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None


def said_at(metadata: Mapping[str, Any] | None, stored_at: datetime) -> datetime:
    """When a turn was said: its metadata's `time` when the client sent a readable one."""
    return parse_when((metadata or {}).get(TIME_KEY)) or stored_at


def date_terms(*moments: datetime) -> list[str]:
    """Search terms of the days and months of `moments` (UTC): `2023-05-08`, `2023-05`."""
    return _day_terms(moment.astimezone(UTC).date() for moment in moments)


def _day_terms(days: Iterable[date]) -> list[str]:
    out: dict[str, None] = {}
    for day in days:
        out[day.isoformat()] = None
        out[day.isoformat()[:7]] = None
    return list(out)


_ZH_NUM = {"一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_ZH_NUM.update({"十": 10, "十一": 11, "十二": 12})
_AGO_RE = re.compile(
    r"\b(\d{1,3}|a|an|one|two|three|four|five|six)\s+(day|week|month)s?\s+ago\b", re.I
)
_ZH_AGO_RE = re.compile(
    r"(\d{1,3}|[一二两三四五六七八九十]{1,2})\s*(天|个?星期|周|个月)(?:以|之)?前"
)
# A month named without its year ("in May"): the latest such month. One with its year is an
# absolute date (`_absolute_terms`).
_IN_MONTH_RE = re.compile(
    rf"\b(?:in|during|since|last|this|early|late|mid)\s+({_MONTH})\b(?!\.?,?\s*\d{{4}})", re.I
)
_MONTH_YEAR_RE = re.compile(rf"\b({_MONTH})\.?,?\s+(\d{{4}})\b", re.I)
_MONTH_DAY_RE = re.compile(
    rf"\b({_MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?!,?\s*\d{{4}}|:)", re.I
)
_DAY_MONTH_RE = re.compile(
    rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH})\b(?!\.?,?\s*\d{{4}})", re.I
)
_ISO_DAY_RE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_ZH_MONTH_YEAR_RE = re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月(?!\s*\d)")
_ZH_MONTH_DAY_RE = re.compile(r"(?<![\d年])(?<!年\s)(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]")
_RANGE_RE = re.compile(r"\bbetween\b|\bfrom\b.+\b(?:to|until|till)\b|到|至", re.I)
RANGE_DAYS_MAX = 31  # a range of dates in a question ("between May 3 and May 9") up to a month
_ZH_MONTH_RE = re.compile(r"(?<![\d年])(\d{1,2}|[一二三四五六七八九十]{1,2})\s*月份?(?![\d日号])")
_WORD_NUM = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def _month_term(year: int, month: int) -> str:
    while month < 1:
        year, month = year - 1, month + 12
    return f"{year:04d}-{month:02d}"


def _days(first: date, count: int) -> list[str]:
    return [(first + timedelta(days=i)).isoformat() for i in range(count)]


def _latest(month: int, now: date) -> str:
    """The most recent `month` on or before `now`'s month."""
    return _month_term(now.year if month <= now.month else now.year - 1, month)


def query_date_terms(query: str, now: datetime) -> list[str]:
    """Date terms (`YYYY-MM-DD`, `YYYY-MM`) for the relative or month expressions in `query`."""
    today = now.astimezone(UTC).date()
    text = query.lower()
    out: list[str] = []
    if re.search(r"\btoday\b|今天|今日", text):
        out.append(today.isoformat())
    if re.search(r"\byesterday\b|昨天|昨日", text):
        out.append((today - timedelta(days=1)).isoformat())
    if "前天" in text:
        out.append((today - timedelta(days=2)).isoformat())
    monday = today - timedelta(days=today.weekday())
    if re.search(r"\blast week\b|上周|上个?星期|上个礼拜", text):
        out += _days(monday - timedelta(days=7), 7)
    if re.search(r"\bthis week\b|这周|本周|这个?星期", text):
        out += _days(monday, today.weekday() + 1)
    if re.search(r"\blast month\b|上个?月", text):
        out.append(_month_term(today.year, today.month - 1))
    if re.search(r"\bthis month\b|这个月|本月", text):
        out.append(_month_term(today.year, today.month))
    for m in _AGO_RE.finditer(text):
        n = int(m[1]) if m[1].isdigit() else _WORD_NUM.get(m[1], 0)
        out += _ago(today, n, m[2])
    for m in _ZH_AGO_RE.finditer(query):
        n = int(m[1]) if m[1].isdigit() else _ZH_NUM.get(m[1], 0)
        unit = "day" if m[2] == "天" else "month" if "月" in m[2] else "week"
        out += _ago(today, n, unit)
    for m in _IN_MONTH_RE.finditer(text):
        out.append(_latest(MONTHS[m[1]], today))
    for m in _ZH_MONTH_RE.finditer(query):
        month = int(m[1]) if m[1].isdigit() else _ZH_NUM.get(m[1], 0)
        if 1 <= month <= 12:
            out.append(_latest(month, today))
    out += _absolute_terms(query, today)
    return list(dict.fromkeys(out))


def _absolute_terms(query: str, today: date) -> list[str]:
    """The days and months a query names outright ("on April 10, 2022", "March 2023", "8 May",
    "2022年4月10日", "4月10号"; without a year the latest such day), and every day between two
    of them when it asks about a range ("between August 11 and August 15 2023"). A day also
    searches its month: a chunk holds the dates of its turns, the first of which may be on
    another day of that month."""
    days: list[date] = []
    months: list[str] = []
    for pattern, order in ((_DAY_MONTH_YEAR_RE, "dmy"), (_MONTH_DAY_YEAR_RE, "mdy")):
        for m in pattern.finditer(query):
            day, month, year = (m[1], m[2], m[3]) if order == "dmy" else (m[2], m[1], m[3])
            days += _valid(int(year), MONTHS[month.lower()], int(day))
    for m in _ISO_DAY_RE.finditer(query):
        days += _valid(int(m[1]), int(m[2]), int(m[3]))
    for m in _ZH_DATE_RE.finditer(query):
        days += _valid(int(m[1]), int(m[2]), int(m[3]))
    for pattern, order in ((_MONTH_DAY_RE, "md"), (_DAY_MONTH_RE, "dm")):
        for m in pattern.finditer(query):
            day, month = (m[2], m[1]) if order == "md" else (m[1], m[2])
            days += _latest_day(MONTHS[month.lower()], int(day), today)
    for m in _ZH_MONTH_DAY_RE.finditer(query):
        days += _latest_day(int(m[1]), int(m[2]), today)
    for m in _MONTH_YEAR_RE.finditer(query):
        months.append(_month_term(int(m[2]), MONTHS[m[1].lower()]))
    for m in _ZH_MONTH_YEAR_RE.finditer(query):
        if 1 <= int(m[2]) <= 12:
            months.append(_month_term(int(m[1]), int(m[2])))
    if len(days) >= 2 and _RANGE_RE.search(query):
        first, last = min(days), max(days)
        if (last - first).days < RANGE_DAYS_MAX:
            days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    return _day_terms(days) + months


def _valid(year: int, month: int, day: int) -> list[date]:
    found = _date(year, month, day)
    return [found] if found is not None else []


def _latest_day(month: int, day: int, today: date) -> list[date]:
    """The most recent `month`/`day` on or before `today` (this year's or last year's)."""
    this_year = _date(today.year, month, day)
    if this_year is not None and this_year <= today:
        return [this_year]
    return _valid(today.year - 1, month, day)


def _ago(today: date, n: int, unit: str) -> list[str]:
    if n <= 0:
        return []
    if unit == "day":
        return [(today - timedelta(days=n)).isoformat()]
    if unit == "week":
        start = today - timedelta(days=7 * n + today.weekday())
        return _days(start, 7)
    return [_month_term(today.year, today.month - n)]
