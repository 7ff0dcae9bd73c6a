"""Pairing of tool calls and results in the shown turns (`blocks.paired_turns`, `tool_pairs`,
`tool_groups`), without a database: every shown result right after its call, every shown call
answered, reused ids paired with the latest call that has no result yet."""

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.domain.records import TurnRecord
from app.domain.tokens import message_tokens
from app.domain.tool_groups import atomic_units, tool_groups, tool_pairs
from app.eval.agent import validity_problems
from app.prompt.blocks import paired_turns, turn_message
from tests.support.pairing import anthropic_pairing_errors

T0 = datetime(2024, 5, 1, 9, 30, tzinfo=UTC)


def turn(seq: int, role: str, content: str = "", **extra: Any) -> TurnRecord:
    tokens = message_tokens(
        role, content, extra.get("name"), extra.get("tool_calls"), extra.get("tool_call_id")
    )
    return TurnRecord(seq, role, content, tokens, T0 + timedelta(minutes=seq), **extra)


def call(call_id: str, arguments: str = '{"user_id": "mia_li_3668"}') -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_user", "arguments": arguments},
    }


def calls(seq: int, *ids: str, content: str = "") -> TurnRecord:
    return turn(seq, "assistant", content, tool_calls=[call(i) for i in ids])


def result(seq: int, call_id: str, content: str = '{"ok": true}') -> TurnRecord:
    return turn(seq, "tool", content, tool_call_id=call_id)


def seqs(turns: list[TurnRecord]) -> list[int]:
    return [t.seq for t in turns]


def messages(turns: list[TurnRecord]) -> list[dict[str, Any]]:
    return [turn_message(t) for t in turns]


def test_parallel_calls_with_their_results_are_shown_as_they_are() -> None:
    turns = [turn(1, "user", "Book it"), calls(2, "a", "b"), result(3, "a"), result(4, "b")]
    shown = paired_turns(turns)
    assert shown == turns
    assert all(s is t for s, t in zip(shown, turns, strict=True))
    assert validity_problems(messages(shown)) == []


def test_reused_id_pairs_each_result_with_the_latest_unanswered_call() -> None:
    turns = [calls(1, "call_0"), result(2, "call_0"), calls(3, "call_0"), result(4, "call_0")]
    assert tool_pairs(turns) == {1: (0, 0), 3: (2, 0)}
    assert paired_turns(turns) == turns
    # Two calls of one id waiting: the first result answers the newer one, the second the older.
    nested = [calls(1, "call_0"), calls(2, "call_0"), result(3, "call_0"), result(4, "call_0")]
    assert tool_pairs(nested) == {2: (1, 0), 3: (0, 0)}
    shown = paired_turns(nested)
    assert seqs(shown) == [1, 4, 2, 3]
    assert validity_problems(messages(shown)) == []
    assert validity_problems(messages(nested)) != []  # as stored, a provider would refuse it


def test_tool_groups_keep_an_older_call_of_a_reused_id_with_its_result() -> None:
    nested = [turn(1, "user", "go"), calls(2, "c"), calls(3, "c"), result(4, "c"), result(5, "c")]
    # Turn 5 answers turn 2 (turn 4 answered turn 3): no cut between 2 and 5.
    assert [seqs(g) for g in tool_groups(nested)] == [[1], [2, 3, 4, 5]]
    reused = [calls(1, "c"), result(2, "c"), calls(3, "c"), result(4, "c")]
    assert [seqs(g) for g in tool_groups(reused)] == [[1, 2], [3, 4]]


def test_a_call_still_waiting_at_the_end_is_not_shown() -> None:
    turns = [turn(1, "user", "Find Mia"), calls(2, "a")]
    assert seqs(paired_turns(turns)) == [1]
    with_text = [turn(1, "user", "Find Mia"), calls(2, "a", content="Looking her up.")]
    shown = paired_turns(with_text)
    assert seqs(shown) == [1, 2]
    assert shown[1].tool_calls is None
    assert shown[1].token_count == message_tokens("assistant", "Looking her up.")
    assert validity_problems(messages(shown)) == []


def test_a_parallel_call_without_its_result_is_taken_out_of_its_turn() -> None:
    turns = [calls(1, "a", "b", "c"), result(2, "a"), result(3, "c")]
    shown = paired_turns(turns)
    assert seqs(shown) == [1, 2, 3]
    assert [c["id"] for c in shown[0].tool_calls or []] == ["a", "c"]
    assert shown[0].token_count == message_tokens(
        "assistant", "", None, [call("a"), call("c")], None
    )
    assert shown[0].token_count < turns[0].token_count
    assert shown[1] is turns[1]
    assert validity_problems(messages(shown)) == []


def test_a_result_whose_call_is_not_shown_is_left_out() -> None:
    # The call went to offloaded history; its result is still in the window.
    turns = [result(5, "a"), turn(6, "user", "And now?"), calls(7, "b"), result(8, "b")]
    assert seqs(paired_turns(turns)) == [6, 7, 8]
    # A second result for an answered call, and one for an id never called.
    extra = [calls(1, "a"), result(2, "a"), result(3, "a"), result(4, "zz")]
    assert seqs(paired_turns(extra)) == [1, 2]


def test_a_result_that_came_later_moves_up_to_its_call() -> None:
    # The agent appended the call, the user spoke, then the result came in a later append.
    turns = [calls(1, "a"), turn(2, "user", "hurry up"), result(3, "a")]
    shown = paired_turns(turns)
    assert seqs(shown) == [1, 3, 2]
    assert validity_problems(messages(shown)) == []
    crossed = [calls(1, "a"), calls(2, "b"), result(3, "b"), result(4, "a")]
    assert seqs(paired_turns(crossed)) == [1, 4, 2, 3]


def test_the_check_itself_finds_each_kind_of_break() -> None:
    def msgs(*turns: TurnRecord) -> list[dict[str, Any]]:
        return messages(list(turns))

    assert validity_problems(msgs(result(1, "a"))) != []  # result without its call
    assert validity_problems(msgs(calls(1, "a"))) != []  # call without its result
    assert validity_problems(msgs(calls(1, "a"), turn(2, "user", "x"), result(3, "a"))) != []
    assert validity_problems(msgs(calls(1, "a"), result(2, "a"), result(3, "a"))) != []
    assert validity_problems(msgs(calls(1, "a", "a"), result(2, "a"), result(3, "a"))) != []
    assert validity_problems(msgs(calls(1, "a"), result(2, "a"), result(3, "b"))) != []
    ok = msgs(calls(1, "a", "b"), result(2, "b"), result(3, "a"), turn(4, "user", "x"))
    assert validity_problems(ok) == []
    use = {"type": "tool_use", "id": "a", "name": "f", "input": {}}
    answer = {"type": "tool_result", "tool_use_id": "a", "content": "1"}
    assert anthropic_pairing_errors([{"role": "assistant", "content": [use]}]) != []
    assert anthropic_pairing_errors([{"role": "user", "content": [answer]}]) != []
    assert (
        anthropic_pairing_errors(
            [{"role": "assistant", "content": [use]}, {"role": "user", "content": [answer]}]
        )
        == []
    )


STEP = st.one_of(
    st.tuples(st.just("user"), st.just(())),
    st.tuples(st.just("assistant"), st.lists(st.sampled_from(["c0", "c1", "c2"]), max_size=3)),
    st.tuples(st.just("tool"), st.sampled_from(["c0", "c1", "c2", "zz"]).map(lambda i: (i,))),
)


def random_turns(steps: list[tuple[str, Any]]) -> list[TurnRecord]:
    out = []
    for seq, (role, ids) in enumerate(steps, start=1):
        if role == "assistant":
            out.append(calls(seq, *ids, content="" if ids else "ok"))
        elif role == "tool":
            out.append(result(seq, ids[0]))
        else:
            out.append(turn(seq, "user", "next"))
    return out


@given(st.lists(STEP, max_size=30))
def test_any_turns_come_out_valid_and_every_window_of_them_too(steps: list[Any]) -> None:
    turns = random_turns(steps)
    shown = paired_turns(turns)
    assert validity_problems(messages(shown)) == []
    assert paired_turns(shown) == shown  # nothing more to do on a valid list
    # What the assembler keeps is a suffix of whole groups: each is valid as it is.
    groups = tool_groups(shown)
    for start in range(len(groups)):
        suffix = [t for group in groups[start:] for t in group]
        assert validity_problems(messages(suffix)) == []
    # Nothing is shown twice, and only calls and results that had a partner are taken out.
    assert len(set(seqs(shown))) == len(shown)
    pairs = tool_pairs(turns)
    kept_results = sum(t.role == "tool" for t in shown)
    assert kept_results == len({(pairs[r][0], turns[r].tool_call_id) for r in pairs})
    assert kept_results == sum(len(t.tool_calls or []) for t in shown)


def test_an_offload_unit_of_a_reused_id_ends_with_its_own_result() -> None:
    # `call_0` at every step: each step is its own unit, not one unit to the last `call_0` result.
    steps = [calls(1, "call_0"), result(2, "call_0"), calls(3, "call_0"), result(4, "call_0")]
    assert atomic_units([turn(0, "user", "go"), *steps]) == [range(0, 1), range(1, 3), range(3, 5)]
