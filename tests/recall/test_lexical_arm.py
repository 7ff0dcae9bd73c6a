from collections import Counter

from app.domain.text import terms
from app.recall.arms import CJK_CHARACTER_WEIGHT, lexical_arm
from app.recall.bm25 import BM25Index

DOCS = {
    "remember": "好的，我会记住花生过敏。",
    "hotel": "我们住的酒店在市中心，离车站很近。",
    "station": "车站门口有一家咖啡店。",
    "english": "We stayed at the Kestrel Inn, room 418.",
    "address": "我的公司地址在世纪大道100号。",
}


def arm(query: str) -> dict[str, float]:
    index = BM25Index.from_term_counts([(d, Counter(terms(t))) for d, t in DOCS.items()])
    return lexical_arm(index, dict.fromkeys(terms(query), 1.0), limit=10)


def test_a_document_sharing_only_single_characters_with_the_query_is_no_hit() -> None:
    # 住 of 记住 is not 住 of 住在; 店 of 咖啡店 is not 店 of 酒店.
    assert list(arm("我们住在哪个酒店？")) == ["hotel"]
    # A question of single characters only is matched by them.
    assert set(arm("住")) == {"remember", "hotel"}
    # English is scored as before: any shared word.
    assert list(arm("Which inn did we stay at?")) == ["english"]


def test_a_document_sharing_only_function_words_with_the_query_is_no_hit() -> None:
    # 我的 ("my") is a pair of function characters: no more a match than "my" is in English.
    assert arm("我的牙医是谁？") == {}
    assert list(arm("我的公司在哪里？")) == ["address"]


def test_single_characters_weigh_less_than_the_bigrams_beside_them() -> None:
    assert 0 < CJK_CHARACTER_WEIGHT < 1
    full = BM25Index.from_term_counts([(d, Counter(terms(t))) for d, t in DOCS.items()])
    scores = arm("车站近吗")  # terms 车站, 站近, 近吗 and 车, 站, 近 (吗 is a stop character)
    assert set(scores) == {"hotel", "station"}
    w = CJK_CHARACTER_WEIGHT
    expected = dict(full.score({"车站": 1, "站近": 1, "近吗": 1, "车": w, "站": w, "近": w}))
    unweighted = dict(full.score(terms("车站近吗")))
    for doc in scores:
        assert abs(scores[doc] - expected[doc]) < 1e-9
        assert scores[doc] < unweighted[doc]
