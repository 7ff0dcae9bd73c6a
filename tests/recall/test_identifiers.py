"""Identifiers of code and data: whole lexical terms, exact keys of the query, and the query a
build without one searches for in a tool loop."""

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from app.domain.records import TurnRecord
from app.domain.text import lexical_document, terms
from app.recall.fusion import FusedCandidate
from app.recall.rerank import RerankCandidate, feature_rerank, select_within_budget
from app.recall.rewrite import code_identifiers, rewrite_query, window_query
from app.recall.tool_results import CallChunk, ResultOfCall, calls_at_end, with_results_of_calls
from app.store.chunks import ShownChunk

SHAPES = [
    ("snake_case", "snake_case"),
    ("CamelCase", "camelcase"),
    ("client.charge", "client.charge"),
    ("billing/mod3.py", "billing/mod3.py"),
    ("SECRET_CONST_3", "secret_const_3"),
    ("HAT069", "hat069"),
    ("8ZC1KX", "8zc1kx"),
]


@pytest.mark.parametrize(("identifier", "term"), SHAPES)
def test_an_identifier_is_one_term_in_english_and_in_chinese(identifier: str, term: str) -> None:
    assert term in terms(f"Where is {identifier} set?")
    assert term in terms(f"{identifier} 在哪里设置？")
    assert term in terms(f"请看{identifier}的定义")  # no space between it and the Chinese


def test_a_path_is_a_term_and_so_are_its_segments() -> None:
    assert terms("read billing/mod3.py") == ["read", "billing/mod3.py", "billing", "mod3.py"]
    assert terms("路径：billing/mod3.py") == [
        "路",
        "径",
        "路径",
        "billing/mod3.py",
        "billing",
        "mod3.py",
    ]
    # The Postgres document holds the path, its segments and their parts.
    assert lexical_document("billing/mod3.py").split() == [
        "billing/mod3.py",
        "billing",
        "mod3",
        "py",
        "billing",
        "mod3.py",
        "mod3",
        "py",
    ]


@pytest.mark.parametrize("text", ["24/7", "5/7/2023", "artists/bands", "and/or"])
def test_numbers_dates_and_words_with_a_slash_are_indexed_as_before(text: str) -> None:
    assert not any("/" in t for t in terms(text))


def test_identifiers_are_exact_keys_of_the_query() -> None:
    q = rewrite_query("What is the value of SECRET_CONST_3 in billing/mod3.py?", [])
    assert q.ids == ["SECRET_CONST_3", "billing/mod3.py"]
    q = rewrite_query("billing/mod3.py 里 SECRET_CONST_3 的值是多少？", [])
    assert q.ids == ["billing/mod3.py", "SECRET_CONST_3"]
    q = rewrite_query("路径billing/mod3.py里SECRET_CONST_3的值", [])
    assert q.ids == ["billing/mod3.py", "SECRET_CONST_3"]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("call client.charge() in mod3.py.", ["client.charge", "mod3.py"]),
        ("set retry_limit and getUser", ["retry_limit", "getUser"]),
        ("raise BillingClientError from Mod3Client", ["BillingClientError", "Mod3Client"]),
        ("look in /etc/hosts and ~/src/app.ts", ["/etc/hosts", "~/src/app.ts"]),
        ("读取billing/mod3.py的SECRET_CONST_3", ["billing/mod3.py", "SECRET_CONST_3"]),
        # Names, words, numbers and abbreviations are not identifiers.
        ("Nate films for YouTube at McGee's bar, e.g. at 3.14 a.m. 24/7", []),
        ("Which artists/bands, and/or painters?", []),
    ],
)
def test_code_identifiers(text: str, found: list[str]) -> None:
    assert [value for _, _, value in code_identifiers(text)] == found


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def turn(seq: int, role: str, content: str = "", **fields: Any) -> TurnRecord:
    return TurnRecord(seq, role, content, 10, NOW, **fields)


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


ASK = turn(1, "user", "Which value does the charge step use as its key?")
GREP = turn(
    2,
    "assistant",
    tool_calls=[call("c1", "grep", pattern="SECRET_CONST_3", path="billing/mod3.py")],
)
FOUND = turn(
    3, "tool", "billing/mod3.py:13: client.charge(amount, SECRET_CONST_3)", tool_call_id="c1"
)


def test_a_tool_result_last_adds_the_calls_arguments_and_the_results_identifiers() -> None:
    assert window_query([ASK, GREP, FOUND]) == (
        "Which value does the charge step use as its key? SECRET_CONST_3 billing/mod3.py"
        " client.charge"
    )


def test_a_tool_call_last_adds_its_arguments() -> None:
    assert window_query([ASK, GREP]) == (
        "Which value does the charge step use as its key? SECRET_CONST_3 billing/mod3.py"
    )


def test_outside_a_tool_loop_the_query_is_the_latest_user_turn() -> None:
    answer = turn(4, "assistant", "It uses SECRET_CONST_3.")
    assert window_query([ASK, GREP, FOUND, answer]) == ASK.content
    assert window_query([ASK]) == ASK.content
    assert window_query([]) is None
    assert window_query([turn(1, "assistant", "Hello")]) is None


def test_only_the_latest_calls_count_and_every_parallel_result() -> None:
    older = turn(2, "assistant", tool_calls=[call("c0", "read_file", path="billing/mod1.py")])
    older_result = turn(3, "tool", "SECRET_CONST_1 = 'X'", tool_call_id="c0")
    parallel = turn(
        4,
        "assistant",
        tool_calls=[
            call("c1", "lookup", order_id="HAT069", verbose=True),
            call("c2", "lookup", order_id="8ZC1KX", fields=["status", "amount"]),
        ],
    )
    first = turn(5, "tool", '{"order": "HAT069", "flight": "UA512"}', tool_call_id="c1")
    second = turn(6, "tool", '{"order": "8ZC1KX", "flight": "DL2231"}', tool_call_id="c2")
    query = window_query([ASK, older, older_result, parallel, first, second])
    assert query == f"{ASK.content} HAT069 8ZC1KX status amount UA512 DL2231"


def test_chinese_user_turn_and_arguments_that_are_not_json() -> None:
    ask = turn(1, "user", "扣款步骤用的密钥值是什么？")
    raw = turn(2, "assistant", tool_calls=[{"id": "c1", "function": {"arguments": "grep 密钥"}}])
    result = turn(3, "tool", "在 billing/mod3.py 里找到：SECRET_CONST_3", tool_call_id="c1")
    assert window_query([ask, raw, result]) == (
        "扣款步骤用的密钥值是什么？ grep 密钥 billing/mod3.py SECRET_CONST_3"
    )


def test_results_whose_call_left_the_window_still_give_their_identifiers() -> None:
    assert window_query([FOUND]) == "billing/mod3.py client.charge SECRET_CONST_3"


def test_a_long_argument_is_cut() -> None:
    write = turn(2, "assistant", tool_calls=[call("c1", "write_file", body="x " * 5000)])
    query = window_query([ASK, write])
    assert query is not None and len(query) < len(ASK.content) + 250


def candidate(cid: str, text: str, score: float, call_text: str = "") -> RerankCandidate:
    return RerankCandidate(
        id=cid, text=text, fused_score=score, fused_rank=1, turn_last=7, call_text=call_text
    )


def test_a_result_is_matched_with_its_calls_keys() -> None:
    query = rewrite_query("What is SECRET_CONST_3 in billing/mod3.py?", [])
    call_text = 'assistant → tool_calls: [{"function": {"arguments": "billing/mod3.py"}}]'
    ranked = feature_rerank(
        query,
        [
            candidate("other", 'SECRET_CONST_3 = "AAAAAA"', 1.0),
            candidate("mod3", 'SECRET_CONST_3 = "BBBBBB"', 0.9, call_text),
        ],
        now_seq=100,
    )
    assert [s.id for s in ranked] == ["mod3", "other"]
    # Both hold SECRET_CONST_3: it tells them apart less than the path only one holds.
    assert ranked[0].features.exact == 1.0 and ranked[1].features.exact < 0.5


def test_identifiers_weigh_by_their_rarity_other_keys_alike() -> None:
    code = rewrite_query("Is SECRET_CONST_3 used in billing/mod3.py?", [])
    texts = ["SECRET_CONST_3 in billing/mod3.py", "SECRET_CONST_3", "SECRET_CONST_3", "none"]
    ranked = feature_rerank(
        code, [candidate(str(i), t, 1.0) for i, t in enumerate(texts)], now_seq=100
    )
    exact = {s.id: s.features.exact for s in ranked}
    assert exact["0"] == 1.0 and exact["3"] == 0.0
    assert 0.0 < exact["1"] == exact["2"] < 0.5  # held by three of four: worth less than half
    orders = rewrite_query("Were orders HAT069 and 8ZC1KX shipped?", [])
    texts = ["HAT069 8ZC1KX", "HAT069", "HAT069", "none"]
    ranked = feature_rerank(
        orders, [candidate(str(i), t, 1.0) for i, t in enumerate(texts)], now_seq=100
    )
    assert {s.id: s.features.exact for s in ranked} == {"0": 1.0, "1": 0.5, "2": 0.5, "3": 0.0}


def test_an_identifier_inside_a_longer_one_is_no_match() -> None:
    query = rewrite_query("What is SECRET_CONST_3?", [])
    ranked = feature_rerank(
        query,
        [
            candidate("longer", "SECRET_CONST_30 = 1", 1.0),
            candidate("prefixed", "MY_SECRET_CONST_3 = 1", 1.0),
            candidate("it", "SECRET_CONST_3 = 1", 0.5),
        ],
        now_seq=100,
    )
    assert [(s.id, s.features.exact) for s in ranked] == [
        ("it", 1.0),
        ("longer", 0.0),
        ("prefixed", 0.0),
    ]


def test_pieces_holding_a_key_are_kept_beside_their_sibling() -> None:
    query = rewrite_query("SECRET_CONST_3?", [])
    pieces = [
        candidate("uses", "charge(SECRET_CONST_3)", 1.0),
        candidate("defines", 'SECRET_CONST_3 = "B"', 0.9),
        candidate("other", "RETRY_LIMIT = 3", 0.8),
    ]
    scored = feature_rerank(query, pieces, now_seq=100)
    groups = dict.fromkeys(("uses", "defines", "other"), "turn:7")
    plain = select_within_budget(scored, k=5, overlap_groups=groups)
    assert [s.id for s in plain.selected] == ["uses"]
    keyed = select_within_budget(
        scored, k=5, overlap_groups=groups, keyed_pieces={"uses", "defines"}
    )
    assert [s.id for s in keyed.selected] == ["uses", "defines"]
    assert [(s.id, why) for s, why in keyed.dropped] == [("other", "duplicate")]


def test_a_json_result_gives_the_identifiers_of_its_values_not_its_keys() -> None:
    lookup = turn(2, "assistant", tool_calls=[call("c1", "get_reservation", code="8ZC1KX")])
    result = turn(
        3,
        "tool",
        json.dumps({"reservation_id": "8ZC1KX", "user_id": "mia_li_3668", "flight": "HAT069"}),
        tool_call_id="c1",
    )
    assert window_query([ASK, lookup, result]) == f"{ASK.content} 8ZC1KX mia_li_3668 HAT069"


def test_a_blob_is_no_identifier_and_a_long_result_is_read_only_so_far() -> None:
    blob = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNg"
    late = "plain words " * 5000 + "SECRET_CONST_9"
    result = turn(3, "tool", f"{blob} then {late}", tool_call_id="c1")
    assert window_query([ASK, GREP, result]) == (f"{ASK.content} SECRET_CONST_3 billing/mod3.py")


def test_calls_at_end_counts_the_calls_of_a_chunks_last_turn() -> None:
    calls = json.dumps([call("c1", "read_file", path="a.py"), call("c2", "read_file", path="b.py")])
    assert calls_at_end(f"user: read both\nassistant → tool_calls: {calls}") == 2
    assert calls_at_end(f"assistant → tool_calls: {calls}\ntool[c1]: x = 1") == 0
    assert calls_at_end('assistant [part 2/2]:\n → tool_calls: [{"id": "c1", "func') == 1
    assert calls_at_end("user: hello") == 0


def shown(cid: str) -> ShownChunk:
    text = f"tool[c1] [part 1/2]:\n{cid}"
    return ShownChunk(cid, "active", 7, 7, 1, 2, NOW, text, False, 10, ["tool"])


def test_a_result_ranks_with_its_call() -> None:
    call_chunk = FusedCandidate(id="call", score=2.0, rank=1)
    fused = [call_chunk, FusedCandidate("other", 1.5, 2), FusedCandidate("own", 0.5, 3)]
    answered = {
        "new": ResultOfCall(shown("new"), CallChunk(call_chunk, "call text")),
        "own": ResultOfCall(shown("own"), CallChunk(call_chunk, "call text")),
    }
    ranked = with_results_of_calls(fused, answered)
    assert [(f.id, f.score, f.rank) for f in ranked] == [
        ("call", 2.0, 1),
        ("new", 2.0, 1),  # no arm returned it: right after its call, with its score
        ("other", 1.5, 2),
        ("own", 2.0, 1),  # returned by an arm below its call: scored as the call
    ]
