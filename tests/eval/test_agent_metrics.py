"""Pure parts of `contextd eval agent`: dependencies, retention, labelled retention, prefix reuse,
validity, the truncation and clearing baselines and the aggregates (no server, no database)."""

import json
from typing import Any

import pytest

from app.domain.tokens import messages_tokens
from app.eval.agent import (
    AgentRun,
    argument_values,
    common_prefix,
    find_steps,
    labelled,
    parse_ranges,
    parse_run,
    present,
    prompt_text,
    serial_tokens,
    serialise,
    validity_problems,
)
from app.eval.agent_baselines import (
    CLEARED_PLACEHOLDER,
    cleared_turns,
    clearing,
    full_history,
    prompt_tokens,
    truncated_turns,
    truncation,
    turn_records,
)
from app.eval.agent_driver import BuildObservation, Replay
from app.eval.agent_score import StepFigures, score_replay, summarise

SYSTEM = "Airline policy. Reference code POLICY-77 applies to every booking."


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def result(call_id: str, name: str, content: Any) -> dict[str, Any]:
    text = content if isinstance(content, str) else json.dumps(content)
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": text}


USER_DETAILS = {
    "reservations": ["RES001", "RES002"],
    "name": "Amy",
    "payment_methods": {"card_7777": {"id": "card_7777", "brand": "visa"}},
    "balance": 1500,
}
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Hi, my user id is amy_1234."},
    call("c1", "get_user_details", user_id="amy_1234"),
    result("c1", "get_user_details", USER_DETAILS),
    {"role": "assistant", "content": "You have two reservations."},
    {"role": "user", "content": "Please pay the second one, RES002."},
    call(
        "c2",
        "pay",
        reservation_id="RES001",
        other="RES002",
        amount=1500,
        insured=True,
        note="POLICY-77",
        short="abc",
        nested={"methods": ["card_7777"], "missing": None},
    ),
    result("c2", "pay", {"status": "paid", "receipt": "RCPT-9"}),
]


def test_argument_values_are_leaves_numbers_as_text_booleans_and_short_ones_out() -> None:
    arguments = '{"a": "RES001", "n": 1500, "f": 12.50, "b": true, "z": null, "s": "ab", "l": [{"x": "card_7777"}]}'  # noqa: E501
    assert argument_values(arguments) == ["RES001", "1500", "12.50", "card_7777"]
    assert argument_values("not json {") == []
    assert argument_values('"RES001"') == []


def test_dependencies_come_from_earlier_tool_results_only() -> None:
    steps = find_steps(SYSTEM, MESSAGES)
    assert [s.index for s in steps] == [1, 5]
    assert steps[0].dependencies == ()  # amy_1234 came from the user
    # RES002 is in a user turn, POLICY-77 in the system prompt, "abc" is short, True no value.
    assert steps[1].dependencies == ("RES001", "1500", "card_7777")
    assert steps[1].labels == {
        "RES001": frozenset({"reservations", "get_user_details"}),
        "1500": frozenset({"balance", "get_user_details"}),
        "card_7777": frozenset({"payment_methods", "id", "get_user_details"}),
    }


def test_a_value_seen_in_a_tool_result_only_after_the_step_is_no_dependency() -> None:
    messages = [
        {"role": "user", "content": "search"},
        call("c1", "search", date="2024-05-20"),
        result("c1", "search", {"flight": "HAT069", "date": "2024-05-20"}),
        call("c2", "book", flight="HAT069", receipt="RCPT-9"),
        result("c2", "book", {"receipt": "RCPT-9"}),
    ]
    steps = find_steps(SYSTEM, messages)
    assert steps[0].dependencies == ()
    assert steps[1].dependencies == ("HAT069",)


def test_a_reused_call_id_labels_the_value_with_the_latest_call_of_that_id() -> None:
    messages = [
        {"role": "user", "content": "go"},
        call("call_0", "get_user_details", user_id="u1"),
        {"role": "tool", "tool_call_id": "call_0", "content": '{"x": "AAAA"}'},
        call("call_0", "search_direct_flight", origin="JFK"),
        {"role": "tool", "tool_call_id": "call_0", "content": '{"flight_number": "HAT136"}'},
        call("call_1", "book", flight="HAT136", x="AAAA"),
    ]
    step = find_steps(SYSTEM, messages)[-1]
    assert step.labels["HAT136"] == {"flight_number", "search_direct_flight"}
    assert step.labels["AAAA"] == {"x", "get_user_details"}


def test_present_reads_contents_call_names_and_arguments() -> None:
    prompt = [
        {"role": "system", "content": SYSTEM},
        call("c9", "get_reservation_details", reservation_id="RES001"),
        result("c9", "get_reservation_details", "[tool result cleared]"),
    ]
    text = prompt_text(prompt)
    assert present(["RES001", "1500", "get_reservation_details"], text) == [
        "RES001",
        "get_reservation_details",
    ]


def test_labelled_needs_a_json_key_or_a_label_before_the_value_on_its_line() -> None:
    labels = {
        "RES001": {"reservations", "get_user_details"},
        "card_7777": {"payment_methods", "id", "get_user_details"},
        "1500": {"balance", "get_user_details"},
    }
    deps = ["RES001", "card_7777", "1500"]

    def check(*messages: dict[str, Any]) -> list[str]:
        return labelled(deps, labels, [{"role": "system", "content": SYSTEM}, *messages])

    # (a) a tool message whose content is JSON holding the value under a key
    assert check(result("c1", "get_user_details", USER_DETAILS)) == deps
    # ... but not a JSON scalar, nor a stub
    assert check(result("c1", "x", '"RES001"'), result("c2", "x", "RES001 1500")) == []
    # (b) a label as a whole word, any case, before the value on the same line
    assert check({"role": "assistant", "content": "Reservations: RES001\nbalance 1500"}) == [
        "RES001",
        "1500",
    ]
    assert check({"role": "assistant", "content": "RES001 is in your reservations"}) == []
    assert check({"role": "assistant", "content": "reservations:\nRES001"}) == []
    assert check({"role": "assistant", "content": "Reservation RES001"}) == []
    # "paid" holds "id" but not as a word; the tool's name is a label too
    assert check({"role": "user", "content": "paid with card_7777"}) == []
    assert check({"role": "user", "content": "get_user_details said card_7777"}) == ["card_7777"]
    # a call is one line: its name, then its arguments
    assert check(call("c3", "pay", balance="1500")) == ["1500"]


def test_serialise_ignores_key_order_and_prefix_reuse_counts_shared_tokens() -> None:
    a = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": {}}]}
    b = {"tool_calls": [{"function": {}, "id": "c1"}], "content": None, "role": "assistant"}
    assert serialise([a]) == serialise([b])
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    earlier = [{"role": "system", "content": SYSTEM}, MESSAGES[0]]
    later = [*earlier, MESSAGES[1]]
    first, second = serial_tokens(earlier), serial_tokens(later)
    shared = common_prefix(first, second)
    # Everything but the last token or two (where the line break joins the next message) repeats.
    assert len(first) - 2 <= shared <= len(first) < len(second)
    changed = [{"role": "system", "content": "Other policy."}, MESSAGES[0]]
    assert common_prefix(serial_tokens(changed), second) < 10


def test_validity() -> None:
    system = {"role": "system", "content": SYSTEM}
    user = {"role": "user", "content": "hi"}
    two = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "a", "function": {"name": "f", "arguments": "{}"}},
            {"id": "b", "function": {"name": "g", "arguments": "{}"}},
        ],
    }
    ra, rb = result("a", "f", "1"), result("b", "g", "2")
    assert validity_problems([system, user, two, rb, ra, user]) == []
    assert validity_problems([system, *MESSAGES]) == []
    # a result without its call (its call left the prompt)
    assert validity_problems([system, user, ra]) == ["[2] tool result a not right after its call"]
    # a call whose result is missing before the next message, and one never answered
    assert validity_problems([system, two, ra, user]) == [
        "[3] calls b unanswered before a user message"
    ]
    assert validity_problems([system, user, two, ra]) == ["[end] calls b never answered"]
    # a result separated from its call by another message
    assert validity_problems([system, two, ra, user, rb]) == [
        "[3] calls b unanswered before a user message",
        "[4] tool result b not right after its call",
    ]
    # the same id twice in one message; the same id reused by a later message is fine
    doubled = {**two, "tool_calls": [two["tool_calls"][0], two["tool_calls"][0]]}
    assert validity_problems([system, doubled, ra, ra]) == ["[1] a call id repeated in one message"]
    again = call("a", "f")
    assert validity_problems([system, again, ra, again, ra]) == []
    assert validity_problems([system, again, ra, ra]) == [
        "[3] tool result a answers no pending call"
    ]


def test_truncation_keeps_the_newest_groups_that_fit_and_never_splits_a_call() -> None:
    turns = turn_records(MESSAGES)
    # Exactly the budget of the last three messages (an answered call and the user turn before).
    last_three = prompt_tokens(SYSTEM, turns[-3:])
    kept = truncated_turns(SYSTEM, turns, last_three)
    assert [t.seq for t in kept] == [5, 6, 7]
    prompt = truncation(SYSTEM, turns, last_three)
    assert messages_tokens(prompt) == last_three
    # One token less: the call and its result go together, so only... nothing fits but them.
    assert [t.seq for t in truncated_turns(SYSTEM, turns, last_three - 1)] == [6, 7]
    only_result = prompt_tokens(SYSTEM, turns[-1:])
    assert truncated_turns(SYSTEM, turns, only_result) == []  # the result alone is not a cut
    assert truncation(SYSTEM, turns, 10) == [{"role": "system", "content": SYSTEM}]
    everything = prompt_tokens(SYSTEM, turns)
    assert truncation(SYSTEM, turns, everything) == full_history(SYSTEM, turns)
    assert messages_tokens(full_history(SYSTEM, turns)) == everything
    for budget in range(prompt_tokens(SYSTEM, []), everything + 1, 7):
        prompt = truncation(SYSTEM, turns, budget)
        assert messages_tokens(prompt) <= budget
        assert validity_problems(prompt) == []


def test_clearing_replaces_all_but_the_newest_results_then_truncates() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "check five reservations"}]
    for i in range(5):
        messages += [
            call(f"c{i}", "get_reservation_details", reservation_id=f"R{i}"),
            result(f"c{i}", "get_reservation_details", {"flight": f"HAT10{i}"}),
        ]
    turns = turn_records(messages)
    cleared = cleared_turns(turns, keep=3)
    contents = [t.content for t in cleared if t.role == "tool"]
    assert contents[:2] == [CLEARED_PLACEHOLDER] * 2
    assert contents[2:] == [t.content for t in turns if t.role == "tool"][2:]
    assert (cleared[2].tool_call_id, cleared[2].name) == ("c0", "get_reservation_details")
    assert cleared[2].token_count < turns[2].token_count
    prompt = clearing(SYSTEM, turns, 100_000, keep=3)
    assert present(["HAT100", "HAT101", "HAT102", "HAT104"], prompt_text(prompt)) == [
        "HAT102",
        "HAT104",
    ]
    assert validity_problems(prompt) == []
    small = prompt_tokens(SYSTEM, cleared[-4:])
    assert clearing(SYSTEM, turns, small, keep=3) == full_history(SYSTEM, turns[-4:])
    assert messages_tokens(clearing(SYSTEM, turns, small, keep=3)) == small


def _run() -> AgentRun:
    return parse_run(
        {
            "task_id": 13,
            "trial": 2,
            "reward": 1.0,
            "traj": [{"role": "system", "content": SYSTEM}, *MESSAGES],
        }
    )


def test_score_replay_measures_every_system_on_the_builds_made() -> None:
    run = _run()
    history = turn_records(run.messages)
    available = 3000
    builds = [
        BuildObservation(0, full_history(SYSTEM, history[:1]), 111, 12.0, ["notes_stale"]),
        BuildObservation(
            1, full_history(SYSTEM, history[:2]), 222, 30.0, []
        ),  # the call, no result
    ]
    figures = score_replay(Replay(run, 3500, "s", builds, None, 7, 0.1), available, range(12))
    by = {(f.system, f.step): f for f in figures}
    assert {f.split for f in figures} == {"check"}
    assert len(figures) == 8
    ours = by[("contextd", 1)]
    assert (ours.dependencies, ours.present, ours.labelled) == (3, 0, 0)
    assert ours.missing == ["RES001", "1500", "card_7777"]
    assert ours.tokens == 222 and ours.latency_ms == 30.0
    assert ours.problems == ["[end] calls c1 never answered"]
    assert by[("contextd", 0)].fallbacks == ["notes_stale"]
    assert by[("contextd", 0)].prefix_tokens is None and ours.prefix_tokens is not None
    full = by[("full", 1)]
    assert (full.present, full.labelled, full.problems) == (3, 3, [])
    assert full.tokens == messages_tokens(full_history(SYSTEM, history[:5]))
    assert 0 < full.prefix_tokens < full.serial_tokens  # type: ignore[operator]
    assert by[("truncation", 1)].tokens <= available


def test_score_replay_skips_steps_never_built_and_failed_builds_score_nothing() -> None:
    run = _run()
    builds = [BuildObservation(0, None, 0, 5.0, [], "http_422 budget_exceeded")]
    figures = score_replay(Replay(run, 2500, "s", builds, None, 3, 0.1), 2000, range(20))
    assert {(f.system, f.step) for f in figures} == {
        ("contextd", 0),
        ("truncation", 0),
        ("clearing", 0),
        ("full", 0),
    }
    failed = next(f for f in figures if f.system == "contextd")
    assert failed.error == "http_422 budget_exceeded" and failed.split == "tune"
    assert summarise([failed])["errors"] == 1


def _figures(
    dependencies: int, present: int, labelled: int, tokens: int, prefix: int | None
) -> StepFigures:
    return StepFigures(
        system="contextd", split="tune", task_id=0, trial=0, limit=3500, step=0, available=3000,
        dependencies=dependencies, present=present, labelled=labelled, tokens=tokens,
        serial_tokens=100, prefix_tokens=prefix,
    )  # fmt: skip


def test_summarise_totals_over_steps() -> None:
    rows = [_figures(1, 1, 1, 1500, None), _figures(3, 0, 0, 3100, 80), _figures(0, 0, 0, 1400, 90)]
    rows[1].problems = ["[end] calls x never answered"]
    s = summarise(rows)
    assert s["retention"] == 0.25 and s["labelled_retention"] == 0.25
    assert s["retention_step_mean"] == 0.5  # steps with dependencies only
    assert s["dependencies"] == 4 and s["steps"] == 3 and s["steps_with_dependencies"] == 2
    assert s["tokens_mean"] == 2000 and s["tokens_max"] == 3100
    assert s["over_limit"] == 1 and s["invalid"] == 1
    assert s["budget_share"] == pytest.approx((1500 + 3100 + 1400) / 3 / 3000)
    assert s["prefix_reuse"] == 170 / 200


def test_parse_ranges() -> None:
    assert parse_ranges("0-2,5") == (0, 1, 2, 5)
    assert parse_ranges("12-24") == tuple(range(12, 25))
