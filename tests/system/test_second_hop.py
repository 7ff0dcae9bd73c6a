"""The second hop's extraction and merge (`benchmarks.second_hop`): pure, no database."""

from collections import Counter

from app.domain.text import terms
from benchmarks.second_hop import HOP_SOURCES, hop_terms, merged_hops

SESSION = [
    "Caroline: I went to the LGBTQ support group yesterday in Boston.",
    "Melanie: That's great, Caroline! Did you see Jordan there?",
    *(f"Caroline: small talk number {i}, lovely weather today." for i in range(40)),
    "Melanie: 我上周去了杭州看西湖。",
]


def df_of(texts: list[str]) -> Counter[str]:
    return Counter(term for text in texts for term in set(terms(text)))


def test_names_the_first_results_hold_that_the_question_does_not_rarest_first():
    df = df_of(SESSION)
    found = hop_terms(
        "Where did Caroline go to the support group?", SESSION[:2], df.__getitem__, len(SESSION)
    )
    assert "boston" in found and "jordan" in found
    assert "caroline" not in found  # in the question, and in most chunks
    assert "melanie" not in found  # opens the turn: a speaker, not a name the turn gives


def test_chinese_terms_the_session_holds_rarely():
    df = df_of(SESSION)
    found = hop_terms("她上周去了哪里？", [SESSION[-1]], df.__getitem__, len(SESSION))
    assert "杭州" in found


def test_merged_hops_keep_the_first_results_then_alternate_without_repeats():
    first = ["a", "b", "c", "d", "e"]
    second = ["x", "a", "y", "d"]
    merged = merged_hops(first, second, lambda item: item)
    assert merged[:HOP_SOURCES] == first[:HOP_SOURCES]
    assert merged == ["a", "b", "c", "x", "d", "e", "y"]
