import math
import random
from collections import Counter

import pytest

from app.recall.bm25 import K1, B, BM25Index, bm25_rank, idf

DOCS = [
    ("d1", ["apple", "banana", "apple"]),
    ("d2", ["banana", "cherry"]),
    ("d3", ["cherry", "date", "egg", "fig"]),
]


def test_defaults_match_measured_configuration():
    assert (K1, B) == (1.2, 0.75)


def test_idf_formula():
    assert idf(3, 1) == pytest.approx(math.log(1 + 2.5 / 1.5))
    assert idf(10, 10) > 0  # never negative, unlike classic Robertson idf


def test_hand_computed_scores_on_three_docs():
    index = BM25Index(DOCS)
    assert index.avgdl == pytest.approx(3.0)
    # apple: df 1, d1 tf 2, dl 3 = avgdl -> weight 2 * 2.2 / (2 + 1.2)
    [(doc_id, score)] = index.score(["apple"])
    assert doc_id == "d1"
    assert score == pytest.approx(math.log(8 / 3) * 4.4 / 3.2)

    ranked = dict(index.score(["banana", "cherry"]))
    idf_2 = math.log(1 + 1.5 / 2.5)  # df 2 of 3
    assert ranked["d2"] == pytest.approx(2 * idf_2 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 2 / 3)))
    assert ranked["d1"] == pytest.approx(idf_2 * 2.2 / (1 + 1.2))
    assert ranked["d3"] == pytest.approx(idf_2 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 4 / 3)))
    assert [d for d, _ in index.score(["banana", "cherry"])] == ["d2", "d1", "d3"]


def test_zero_scores_excluded_and_unknown_terms_ignored():
    index = BM25Index(DOCS)
    assert index.score(["zebra"]) == []
    assert [d for d, _ in index.score(["fig", "zebra"])] == ["d3"]
    assert BM25Index([]).score(["apple"]) == []


def test_repeated_query_term_counts_twice():
    index = BM25Index(DOCS)
    once = dict(index.score(["apple"]))["d1"]
    assert dict(index.score(["apple", "apple"]))["d1"] == pytest.approx(2 * once)


def test_top_n_and_tie_order():
    index = BM25Index([("a", ["x"]), ("b", ["x"]), ("c", ["x"]), ("d", ["y"])])
    assert [d for d, _ in index.score(["x"])] == ["a", "b", "c"]
    assert [d for d, _ in index.score(["x"], top_n=2)] == ["a", "b"]
    assert index.score(["x"], top_n=0) == []


def test_from_term_counts_equals_term_lists():
    by_lists = BM25Index(DOCS).score(["banana", "cherry", "apple"])
    by_counts = BM25Index.from_term_counts([(d, Counter(t)) for d, t in DOCS]).score(
        ["banana", "cherry", "apple"]
    )
    assert [d for d, _ in by_counts] == [d for d, _ in by_lists]
    assert [s for _, s in by_counts] == pytest.approx([s for _, s in by_lists])


def test_duplicate_ids_rejected():
    with pytest.raises(ValueError):
        BM25Index([("a", ["x"]), ("a", ["y"])])


def test_english_corpus_ranks_right_doc_first():
    docs = [
        ("t1", "We booked the flight to Lisbon for the conference in May."),
        ("t2", "My order AB-12345 was delayed; the courier lost the parcel."),
        ("t3", "The cat knocked the plant over again this morning."),
        ("t4", "Let's review the database migration plan before Friday."),
    ]
    assert bm25_rank("what happened to the parcel from my order?", docs)[0][0] == "t2"
    assert bm25_rank("when is the Lisbon conference", docs)[0][0] == "t1"
    assert bm25_rank("AB-12345", docs)[0][0] == "t2"


def test_chinese_corpus_ranks_right_doc_first():
    docs = [
        ("z1", "我们决定用Redis做缓存方案，过期时间设为十分钟。"),
        ("z2", "明天下午三点在会议室讨论季度预算。"),
        ("z3", "我的猫最近不爱吃饭，可能需要去看兽医。"),
        ("z4", "数据库迁移计划推迟到下周。"),
    ]
    assert bm25_rank("缓存方案的过期时间是多少", docs)[0][0] == "z1"
    assert bm25_rank("预算会议几点", docs)[0][0] == "z2"
    assert bm25_rank("猫不吃饭怎么办", docs)[0][0] == "z3"


def test_any_of_keeps_only_documents_holding_one_of_its_terms():
    index = BM25Index(DOCS)
    assert [d for d, _ in index.score(["banana", "cherry"])] == ["d2", "d1", "d3"]
    assert [d for d, _ in index.score(["banana", "cherry"], any_of=["apple", "date"])] == [
        "d1",
        "d3",
    ]
    assert index.score(["banana"], any_of=["unknown"]) == []


def test_scoring_5000_zipf_docs_returns_top_n():
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(20_000)]
    weights = [1 / (i + 1) for i in range(len(vocab))]  # Zipf-like
    docs = [(f"d{i}", rng.choices(vocab, weights, k=100)) for i in range(5_000)]
    index = BM25Index(docs)
    query = [*rng.sample(vocab[:50], 4), *rng.sample(vocab[50:2000], 6)]
    # Speed is measured by benchmarks/bm25_speed.py, not asserted here.
    top = index.score(query, top_n=30)
    assert len(top) == 30
    assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)


def test_an_extended_index_scores_as_one_built_from_all_documents():
    rng = random.Random(11)
    vocab = [f"w{i}" for i in range(300)] + ["AB-12345", "预算"]
    docs = [(f"d{i}", Counter(rng.choices(vocab, k=rng.randint(1, 40)))) for i in range(400)]
    docs.append(("empty", Counter({"w1": 0})))  # a stored count of zero is no posting
    whole = BM25Index.from_term_counts(docs)
    grown = BM25Index.from_term_counts(docs[:150]).extended(docs[150:390]).extended(docs[390:])
    fresh = BM25Index.from_term_counts([]).extended(docs)
    for query in (["w1", "w7", "w7", "w250"], {"AB-12345": 1.0, "预算": 0.25, "nowhere": 1.0}):
        expected = whole.score(query)
        assert grown.score(query) == expected
        assert fresh.score(query) == expected
        assert len(expected) > 5
    assert grown.ids == whole.ids and grown.df("w7") == whole.df("w7") > 0
    assert grown.doc_lengths == whole.doc_lengths and grown.avgdl == whole.avgdl
    # The index it grew from is unchanged.
    first = BM25Index.from_term_counts(docs[:150])
    assert first.extended(docs[150:]).score(["w3"]) == whole.score(["w3"])
    assert first.score(["w3"]) == BM25Index.from_term_counts(docs[:150]).score(["w3"])
    assert len(first) == 150 and first.df("AB-12345") <= whole.df("AB-12345")
    with pytest.raises(ValueError):
        first.extended(docs[:1])  # an id it already holds
