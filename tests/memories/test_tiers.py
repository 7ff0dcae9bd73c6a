"""The pure rules of the user's memory in tiers: which statements of a user turn are captured
(English and Chinese), the stability and tier evidence earns, the weight in ranking and its
decay, and precedence between contradictory statements."""

from datetime import UTC, datetime, timedelta

import pytest

from app.memories.tiers import (
    CANDIDATE,
    CONFIRMED,
    LONG_TERM,
    SAID,
    SESSION,
    WRITTEN,
    Claim,
    Evidence,
    compacted,
    dispute,
    disputed_fact,
    on_the_record,
    prevails,
    profile_statements,
    ranking_weight,
    same_statement,
    shown_tier,
    stability,
)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
WEEK = timedelta(days=7)


@pytest.mark.parametrize(
    ("text", "slot", "value"),
    [
        ("I live in Paris.", "home", "paris"),
        ("Good news: we moved to Lyon last month!", "home", "lyon"),
        ("I'm allergic to peanuts.", "allergy", "peanut"),
        ("I prefer aisle seats.", "preference:seat", "aisle"),
        ("Call me Sam.", "name", "sam"),
        ("我住在巴黎。", "home", "巴黎"),
        ("我们上个月搬到了里昂，现在住得很好。", "home", "里昂"),
        ("我对花生过敏。", "allergy", "花生"),
        ("我喜欢靠窗的座位。", "preference:靠窗的座位", "靠窗的座位"),
        ("叫我小王。", "name", "小王"),
        ("我的名字是小王。", "name", "小王"),
    ],
)
def test_a_profile_statement_of_the_user_is_captured(text: str, slot: str, value: str) -> None:
    [(clause, said)] = profile_statements(text)
    assert (said.slot, said.value, said.holds) == (slot, value, True)
    assert clause in text


@pytest.mark.parametrize(
    "text",
    [
        "Where do I live?",
        "If I moved to Lyon, would the rent be lower?",
        "We might move to Lyon next year.",
        "The user lives in Berlin.",
        "My budget is 5000 EUR.",  # a task's figure, for the notes
        "My email is sam@example.com.",  # contact details only on purpose
        "你知道我住在哪吗？",
        "我们打算搬到杭州。",
        "如果我住在上海，通勤会更方便。",
        "我朋友搬到了杭州。",
        "他住在北京。",
    ],
)
def test_questions_wishes_and_other_peoples_facts_are_not_captured(text: str) -> None:
    assert profile_statements(text) == []


def test_each_clause_is_one_statement_and_the_last_of_a_slot_wins() -> None:
    both = profile_statements("I'm allergic to peanuts and I prefer aisle seats.")
    assert [(c, s.slot) for c, s in both] == [
        ("I'm allergic to peanuts", "allergy"),
        ("I prefer aisle seats.", "preference:seat"),
    ]
    zh = profile_statements("我住在上海，我朋友住在北京。")
    assert [(c, s.value) for c, s in zh] == [("我住在上海", "上海")]
    corrected = profile_statements("I prefer aisle seats. Actually, I prefer window seats.")
    assert [s.value for _, s in corrected] == ["window"]


def test_the_same_statement_in_other_words() -> None:
    assert same_statement("I live in Lyon.", "We moved to Lyon!")
    assert same_statement("我住在里昂。", "我们搬到了里昂")
    assert not same_statement("I live in Lyon.", "I live in Paris.")
    assert not same_statement("I live in Lyon.", "Lyon is nice.")


def said(session: str, at: datetime, kind: str = SAID) -> Evidence:
    return Evidence(kind, session, at, (3,))


def test_seen_once_is_a_candidate_and_each_kind_of_evidence_promotes() -> None:
    once = stability([said("s1", T0)], WEEK)
    assert (once.tier, once.score, once.reasons) == (CANDIDATE, 0.25, ())
    again = stability([said("s1", T0), said("s1", T0 + timedelta(days=1))], WEEK)
    assert again.tier == CANDIDATE  # the same session a day later is not new evidence
    sessions = stability([said("s1", T0), said("s2", T0 + timedelta(hours=1))], WEEK)
    assert (sessions.tier, sessions.score, sessions.reasons) == (LONG_TERM, 0.5, ("sessions",))
    later = stability([said("s1", T0), said("s1", T0 + timedelta(days=8))], WEEK)
    assert (later.tier, later.reasons) == (LONG_TERM, ("time",))
    contexts = stability([said("s1", T0), said("s1", T0, WRITTEN)], WEEK)
    assert (contexts.tier, contexts.reasons) == (LONG_TERM, ("contexts",))
    confirmed = stability([said("s1", T0, CONFIRMED)], WEEK)
    assert (confirmed.tier, confirmed.score, confirmed.reasons) == (LONG_TERM, 0.75, ("confirmed",))
    everything = [said("s1", T0), said("s2", T0 + WEEK), said("s2", T0 + WEEK, CONFIRMED)]
    assert stability(everything, WEEK).score == 1.0


def test_the_tier_a_session_sees() -> None:
    mine = [said("s1", T0)]
    assert shown_tier(CANDIDATE, mine, "s1") == SESSION
    assert shown_tier(CANDIDATE, mine, "s2") == CANDIDATE
    assert shown_tier(LONG_TERM, mine, "s1") == LONG_TERM
    assert shown_tier(None, [], "s1") is None


def test_an_item_unseen_for_the_decay_period_loses_weight() -> None:
    decay = timedelta(days=90)
    fresh = ranking_weight(0.5, T0, T0 + timedelta(days=89), decay, 0.5)
    stale = ranking_weight(0.5, T0, T0 + timedelta(days=91), decay, 0.5)
    assert (fresh, stale) == (pytest.approx(0.9), pytest.approx(0.45))
    assert ranking_weight(0.25, T0, T0, decay, 0.5) == pytest.approx(0.85)
    assert ranking_weight(1.0, T0, T0, decay, 0.5) == pytest.approx(1.0)


def test_precedence_explicit_over_inference_then_newer_over_older() -> None:
    stated, inferred = Claim(True, T0), Claim(False, T0 + WEEK)
    assert prevails(stated, inferred) and not prevails(inferred, stated)
    correction = Claim(True, T0 + timedelta(minutes=5))
    assert prevails(correction, stated) and not prevails(stated, correction)


def test_a_dispute_is_dated_and_never_current() -> None:
    fact = disputed_fact("We moved to Lyon.", T0)
    assert fact == "We moved to Lyon. (stated 2026-03-01; an unconfirmed item below says otherwise)"
    shown = dispute("We moved to Berlin.", "tool_result", "crm", T0 + WEEK, "We moved to Lyon.")
    assert shown.startswith("Unconfirmed, not current (from tool_result crm, 2026-03-08): ")
    assert "We moved to Berlin." in shown and "'We moved to Lyon.'" in shown


def test_a_turn_is_off_the_record_only_when_its_metadata_says_remember_false() -> None:
    assert on_the_record(None) and on_the_record({}) and on_the_record({"remember": True})
    assert on_the_record({"remember": "no"})  # only the JSON false counts
    assert not on_the_record({"remember": False})


def test_evidence_is_compacted_without_changing_what_it_earns() -> None:
    same_session = [said("s1", T0 + timedelta(days=d)) for d in range(10)]
    assert compacted(same_session) == [same_session[0], same_session[-1]]
    every_session = [
        said(f"s{n}", T0 + timedelta(hours=n), WRITTEN if n == 5 else SAID) for n in range(100)
    ]
    kept = compacted(every_session)
    assert len(kept) == 32 and kept[0] == every_session[0] and kept[-1] == every_session[-1]
    assert every_session[5] in kept  # the only one of its kind
    assert stability(kept, WEEK) == stability(every_session, WEEK)
