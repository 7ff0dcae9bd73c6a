from collections import Counter

import pytest

from app.core.text import terms
from app.recall.bm25 import BM25Index, idf
from app.recall.feedback import feedback_terms, name_stems, second_hop, second_hop_query
from app.recall.stem import by_stem

# A session's chunks: the question names "Caroline" and "events", the evidence of its second part
# ("the parade") shares no word with it but shares "Pride" with the first hit.
CHUNKS = {
    "c1": "Caroline: I went to a Pride event with my support group last weekend.",
    "c2": "Melanie: The Pride parade downtown was loud and colourful, Caroline marched in it.",
    "c3": "Melanie: I painted a sunset with the kids at the lake.",
    "c4": "Caroline: My pottery class was so relaxing this week.",
    "c5": "Melanie: We went camping in the mountains with the kids.",
    "c6": "Caroline: I read a book about adoption agencies.",
    "c7": "Melanie: Dinner with friends was fun, Caroline.",
    "c8": "Caroline: The weather has been nice lately.",
    "c9": "Melanie: Work has been busy, the kids too.",
    "c10": "Caroline: I started running in the mornings.",
}


def index() -> BM25Index:
    return BM25Index.from_term_counts(
        [(cid, by_stem(Counter(terms(text)))) for cid, text in CHUNKS.items()]
    )


def query(text: str) -> dict[str, float]:
    return by_stem(dict.fromkeys(terms(text), 1.0))


def test_names_are_capitalised_words_inside_a_sentence() -> None:
    text = "Caroline: I went to Sweden with Melanie. Then we saw Paris!\nMel: Wow, cool"
    assert name_stems(text) == {"sweden", "melani", "paris"}  # not the line or sentence starts


def test_feedback_terms_are_the_first_hits_distinctive_terms_weighted_by_score() -> None:
    idx = index()
    n = len(idx)
    got = feedback_terms(
        [CHUNKS["c1"]],
        query("What events did Caroline go to?"),
        idx.df,
        n,
        lambda t: idf(n, idx.df(t)),
        max_df_share=0.3,
    )
    # "Pride" (stem "prid") is in two chunks (searchable again) and written as a name: the best
    # term, at the full feedback weight; "went" (also in c5) weighs 1 / NAME_BOOST of it. Words
    # only c1 holds ("weekend"), the query's own and "Caroline" (in 6 of 10) are left out.
    assert got == {"prid": 0.5, "went": pytest.approx(0.5 / 1.5)}


def test_common_terms_and_query_terms_are_not_fed_back() -> None:
    idx = index()
    n = len(idx)
    got = feedback_terms(
        [CHUNKS["c9"]],
        query("How is work?"),
        idx.df,
        n,
        lambda t: idf(n, idx.df(t)),
        max_df_share=0.2,
    )
    assert got == {}  # "kids" is in 3 of 10 chunks (over the 20 % cap); "busy" only in c9


def test_weights_follow_the_score_and_the_rank_of_the_hit() -> None:
    got = feedback_terms(
        ["alpha beta", "gamma"], {}, lambda t: 2, 100, lambda t: 1.0, term_weight=1.0
    )
    # alpha and beta: half of the first hit each; gamma: all of the second hit, at rank 2.
    assert got == {"alpha": 1.0, "beta": 1.0, "gamma": 1.0}
    got = feedback_terms(["alpha beta gamma delta", "omega"], {}, lambda t: 2, 100, lambda t: 1.0)
    # omega: all of the second hit at rank 2 (1/2) beats a quarter of the first hit (1/4).
    assert got == {"omega": 0.5, "alpha": 0.25, "beta": 0.25, "gamma": 0.25, "delta": 0.25}


def test_second_hop_finds_the_evidence_the_question_shares_no_word_with() -> None:
    idx = index()
    q = query("What events did Caroline go to?")
    first = dict(idx.score(q, top_n=2))
    assert "c2" not in first or first["c2"] < first["c1"]
    found = second_hop(idx, q, [CHUNKS["c1"]], 3, docs=1)
    assert list(found)[:2] == ["c1", "c2"]  # the parade, through "Pride", now second


def test_the_query_keeps_its_own_weights_over_feedback() -> None:
    assert second_hop_query({"prid": 1.0, "event": 1.0}, {"prid": 0.5, "parad": 0.3}) == {
        "prid": 1.0,
        "parad": 0.3,
        "event": 1.0,
    }


def test_no_feedback_term_means_no_second_hop() -> None:
    idx = index()
    assert second_hop(idx, query("weather"), ["zzz qqq"], 5) == {}
