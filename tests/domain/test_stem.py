from collections import Counter

from app.domain.stem import by_stem, stem
from app.domain.text import terms
from app.recall.bm25 import BM25Index


def test_inflections_share_a_stem() -> None:
    assert {stem(w) for w in ("research", "researching", "researched", "researches")} == {
        "research"
    }
    assert {stem(w) for w in ("love", "loved", "loving", "loves")} == {"lov"}
    assert stem("running") == "run"
    assert stem("parties") == "party"
    assert stem("tried") == "try"
    assert stem("classes") == "class"
    assert stem("paintings") == "painting"


def test_short_words_ids_numbers_and_chinese_stay() -> None:
    assert stem("bus") == "bus"
    assert stem("glass") == "glass"
    assert stem("thing") == "thing"  # "th" is too short a stem
    assert stem("ab-12345") == "ab-12345"
    assert stem("2023") == "2023"
    assert stem("女儿") == "女儿"
    assert terms("我女儿对花生过敏") == [stem(t) for t in terms("我女儿对花生过敏")]


def test_weights_and_counts_merge_under_the_stem() -> None:
    assert by_stem({"paint": 1.0, "painted": 0.25, "花生": 1.0}) == {
        "paint": 1.25,
        "花生": 1.0,
    }
    assert by_stem({"kids": 2, "kid": 1, "park": 1}) == {"kid": 3, "park": 1}


def test_a_stemmed_index_finds_another_inflection() -> None:
    docs = [
        ("a", "Caroline: I've been researching adoption agencies"),
        ("b", "Melanie: we went camping at the beach"),
    ]
    plain = BM25Index([(d, terms(t)) for d, t in docs])
    assert plain.score(dict.fromkeys(terms("What did Caroline research?"), 1.0))[0][0] == "a"
    assert plain.score({"research": 1.0}) == []
    stemmed = BM25Index.from_term_counts([(d, by_stem(Counter(terms(t)))) for d, t in docs])
    assert [d for d, _ in stemmed.score(by_stem({"research": 1.0}))] == ["a"]
    assert [d for d, _ in stemmed.score(by_stem({"camped": 1.0}))] == ["b"]
