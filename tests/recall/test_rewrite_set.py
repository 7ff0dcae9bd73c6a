"""The labelled rewrite set (`tests/recall/rewrite_set.json`): self-contained questions go to recall
as asked, context-dependent ones get the term(s) they point at appended."""

from collections import Counter

from app.recall.rewrite import rewrite_query
from benchmarks.rewrite_set import figures, load_set, run_set


def test_the_set_is_balanced_across_labels_and_languages():
    items = load_set()
    assert len(items) >= 100
    counts = Counter((item["lang"], item["dependent"]) for item in items)
    assert set(counts) == {("en", True), ("en", False), ("zh", True), ("zh", False)}
    assert len(set(counts.values())) == 1  # as many in each language and label
    for item in items:
        assert len(item["turns"]) == 2
        assert bool(item["resolves_to"]) == item["dependent"], item["question"]


def test_no_self_contained_question_is_rewritten_and_nine_in_ten_dependent_ones_resolve():
    outcomes = run_set(load_set())
    rewritten, alone, resolved, dependent = figures(outcomes)
    print(
        f"self-contained rewritten {rewritten}/{alone}, dependent resolved {resolved}/{dependent}"
    )
    assert rewritten == 0, [
        o.item["question"] for o in outcomes if not o.dependent and not o.left_alone
    ]
    assert resolved >= 0.9 * dependent
    for outcome in outcomes:
        if not outcome.dependent:
            assert outcome.rewritten.context_need is None
            assert outcome.rewritten.appended == []


def test_the_issue_questions_go_to_recall_as_asked():
    turns = [
        "Tell me about rail passes please, part 12.",
        "The Eurail Global Pass covers 33 countries; the 7-day flexi version suits most trips.",
    ]
    for question in ("What is my name?", "What am I allergic to?", "我叫什么名字？"):
        rewritten = rewrite_query(question, turns)
        assert rewritten.rewritten == question
        assert rewritten.appended == [] and rewritten.context_need is None
