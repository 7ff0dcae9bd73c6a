"""The values of tool results and calls, the stub of a cleared result (pure, no database)."""

import json

from app.notes.values import (
    StubSource,
    Value,
    call_values,
    identifying,
    render_stub,
    result_values,
)


def test_a_json_result_gives_each_leaf_under_its_nearest_key() -> None:
    result = json.dumps(
        {
            "reservation_id": "8ZC1KX",
            "flights": [{"flight_number": "HAT069", "date": "2024-05-20", "price": 121}],
            "reservations": ["NO6JO3", "AIXC49"],
            "insurance": True,
            "note": "x" * 200,
        }
    )
    assert result_values(result) == [
        Value("reservation_id", "8ZC1KX"),
        Value("flight_number", "HAT069"),
        Value("date", "2024-05-20"),
        Value("price", "121"),
        Value("reservations", "NO6JO3"),
        Value("reservations", "AIXC49"),
    ]


def test_a_text_result_gives_pairs_and_identifiers_in_english_and_chinese() -> None:
    text = (
        "SECRET_CONST_3 = 7741\n# see billing/mod3.py, owner ops@example.com\n"
        "订单号：8ZC1KX，金额：1299 元\nretry_count: 5"
    )
    found = result_values(text)
    assert Value("SECRET_CONST_3", "7741") in found
    assert Value("订单号", "8ZC1KX") in found
    assert Value("金额", "1299 元") in found
    assert Value("retry_count", "5") in found
    bare = {v.value for v in found if not v.key}
    assert {"billing/mod3.py", "ops@example.com"} <= bare


def test_malformed_call_arguments_give_no_values() -> None:
    assert call_values('{"reservation_id": "8ZC1KX"') == []
    assert call_values('{"reservation_id": "8ZC1KX"}') == [Value("reservation_id", "8ZC1KX")]
    assert call_values(None) == []


def test_codes_and_dates_rank_above_words_and_prose() -> None:
    assert identifying("HAT069") == identifying("2024-05-20") == 3
    assert identifying("one_way") == 2
    assert identifying("Mia") == 1
    assert identifying("975 Sunset Drive") == identifying("121") == 0


def test_a_stub_names_the_call_the_size_and_the_chunk_and_keeps_labelled_values() -> None:
    values = [Value("reservation_id", "8ZC1KX"), Value("flight_number", "HAT069")]
    source = StubSource(
        "get_reservation_details", '{"reservation_id":"8ZC1KX"}', values, 412, 9, "c-1"
    )
    stub = render_stub(source, values[1:])
    header, body = stub.split("\n")
    assert header == (
        '[tool result cleared: get_reservation_details({"reservation_id":"8ZC1KX"}), 412 tokens; '
        "raw in chunk c-1, one memory recall away]"
    )
    assert body == "flight_number: HAT069 …"  # one value of two kept
    assert render_stub(source, values).endswith("reservation_id: 8ZC1KX; flight_number: HAT069")
