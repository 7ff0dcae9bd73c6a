"""The layered view of a huge tool result (pure): within its budget, the head and the tail of
the text as they are, and the values that say most about the result, English, Chinese or JSON."""

import json

from app.domain.tokens import count_tokens
from app.notes.layering import (
    LAYERED_PREFIX,
    LINES_PER_SHAPE,
    LayeredSource,
    head,
    layered_values,
    layered_view,
    sampled_lines,
    tail,
)
from app.notes.values import Value, result_values

VIEW_TOKENS = 1_000


def log(lines: int) -> str:
    rows = [
        f"2026-12-06T03:00:{i % 60:02d}Z INFO worker-{i % 7} handled request_id=req{i:07d} "
        f"path=/api/items/{i} status=200"
        for i in range(lines)
    ]
    rows[lines // 2] += " order_id=ORD-7H2K9QX"
    return "\n".join(rows)


def view_of(text: str) -> str:
    source = LayeredSource(text, count_tokens(text), "5f0c1d2e-0000-4000-8000-000000000001", 42)
    return layered_view(source, VIEW_TOKENS)


def parts(view: str) -> tuple[str, str]:
    """The view's head and tail."""
    first = view.split("\nhead:\n", 1)[1].split("\n[… ", 1)[0]
    return first, view.split("\ntail:\n", 1)[1]


def test_a_log_keeps_its_first_and_last_lines_and_a_value_from_the_middle() -> None:
    text = log(5_000)
    view = view_of(text)
    assert view.startswith(LAYERED_PREFIX)
    assert count_tokens(view) <= VIEW_TOKENS
    assert f"{len(text.encode()):,} bytes" in view and "42 chunks from chunk 5f0c1d2e" in view
    first, last = parts(view)
    assert text.startswith(first) and text.endswith(last)
    assert first.endswith("status=200") and last.startswith("2026-12-06")  # whole lines
    values = view.split("\nvalues: ", 1)[1].split("\n", 1)[0]
    assert "order_id: ORD-7H2K9QX" in values and "status: 200" in values
    omitted = int(view.split("\n[… ", 1)[1].split(" bytes", 1)[0].replace(",", ""))
    assert len(first.encode()) + 1 + omitted + len(last.encode()) == len(text.encode())


def test_a_json_result_shows_the_fields_of_few_values_before_the_repeated_ones() -> None:
    items = [{"sku": f"SKU{i:06d}", "qty": i % 9} for i in range(3_000)]
    data = {"items": items, "deep": {"a": {"b": {"order_id": "ORD-DEEP-42", "total": 99.5}}}}
    view = view_of(json.dumps(data, indent=1))
    assert "JSON;" in view and count_tokens(view) <= VIEW_TOKENS
    values = view.split("\nvalues: ", 1)[1].split("\n", 1)[0]
    assert "order_id: ORD-DEEP-42" in values and "total: 99.5" in values
    assert values.count("SKU") <= 5  # one field's values at most five


def test_chinese_text_is_cut_on_whole_characters() -> None:
    rows = [f"订单号：DD{i:08d}，状态：已发货，备注：客户要求周末送达" for i in range(3_000)]
    rows[1_500] += "，退款单号：TK88231X"
    text = "\n".join(rows)
    view = view_of(text)
    assert "\ufffd" not in view and count_tokens(view) <= VIEW_TOKENS
    assert "退款单号: TK88231X" in view
    first, last = parts(view)
    assert text.startswith(first) and text.endswith(last)
    digits = "一二三四五六七八九十" * 50  # a character is one to three tokens: cuts inside
    end = tail(digits, 7)
    assert end and digits.endswith(end) and count_tokens(end) <= 7


def test_head_and_tail_stay_within_their_tokens() -> None:
    text = "x" * 10_000 + "\n" + "y" * 10_000
    assert count_tokens(head(text, 50)) <= 50 and text.startswith(head(text, 50))
    assert count_tokens(tail(text, 50)) <= 50 and text.endswith(tail(text, 50))
    assert tail(text, 0) == ""


def test_fields_of_few_values_come_first_and_log_lines_are_not_values() -> None:
    values = [
        Value("request_id", "req1"),
        Value("request_id", "req2"),
        Value("order_id", "ORD-1"),
        Value("", "ABC123"),
        Value("address", "975 Sunset Drive"),
        Value("status", "200 took 5ms path=/a order_id=ORD-2"),  # the rest of a log line
        Value("INFO worker-0 handled request_id", "req3"),
    ]
    assert layered_values(values) == [
        Value("order_id", "ORD-1"),
        Value("request_id", "req1"),
        Value("request_id", "req2"),
        Value("address", "975 Sunset Drive"),
        Value("", "ABC123"),
    ]


def test_settings_in_a_log_line_are_values_ending_at_a_space() -> None:
    found = result_values("INFO handled request_id=req0001 path=/a/b status=200 took 5ms")
    assert {Value("request_id", "req0001"), Value("path", "/a/b"), Value("status", "200")} <= set(
        found
    )


def test_values_come_from_a_sample_of_each_line_shape_and_every_odd_line() -> None:
    text = log(5_000)
    lines = sampled_lines(text).split("\n")
    assert len(lines) == LINES_PER_SHAPE + 1  # the lines alike once digits go, and the odd one
    assert any("order_id=ORD-7H2K9QX" in line for line in lines)
    chinese = (
        "\n".join(f"订单号：DD{i:08d}，状态：已发货" for i in range(500)) + "\n退款单号：TK88231X"
    )
    assert sampled_lines(chinese).split("\n")[-1] == "退款单号：TK88231X"
    assert len(sampled_lines(chinese).split("\n")) == LINES_PER_SHAPE + 1
    short = log(30)
    assert sampled_lines(short) == short
