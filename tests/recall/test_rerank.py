from app.domain.tokens import count_tokens
from app.recall.rerank import (
    RerankCandidate,
    RerankFeatures,
    ScoredCandidate,
    cross_encoded,
    cross_encoder_asked,
    feature_rerank,
    recency,
    select_within_budget,
    text_key,
)
from app.recall.rewrite import RewrittenQuery, rewrite_query


def _cand(cid: str, text: str, rank: int, turn: int, first: int | None = None) -> RerankCandidate:
    return RerankCandidate(
        id=cid, text=text, fused_score=1 / (60 + rank), fused_rank=rank, turn_last=turn,
        turn_first=first,
    )  # fmt: skip


def _query(raw: str, **kw: list[str]) -> RewrittenQuery:
    return RewrittenQuery(raw=raw, rewritten=raw, **kw)  # type: ignore[arg-type]


def test_exact_id_match_goes_first():
    query = rewrite_query("status of ab-12345?", [])
    assert query.ids == ["ab-12345"]
    cands = [
        _cand("c1", "Status update: the order status page is down, status unknown.", 1, 90),
        _cand("c2", "Order AB-12345 shipped on Monday.", 7, 10),
        _cand("c3", "Order AB-123456 is a different one.", 2, 95),
    ]
    ranked = feature_rerank(query, cands, now_seq=100)
    assert ranked[0].id == "c2"
    assert ranked[0].features.exact == 1.0
    assert next(s for s in ranked if s.id == "c3").features.exact == 0.0  # no partial-token match


def test_hash_id_matches_bare_number_and_quoted_strings_count():
    query = _query("ticket", ids=["#4521"], quoted=["blue banana"])
    cands = [_cand("a", "ticket 4521 about the Blue Banana bar", 3, 1), _cand("b", "ticket", 1, 1)]
    ranked = feature_rerank(query, cands, now_seq=5)
    assert [s.id for s in ranked] == ["a", "b"]
    assert ranked[0].features.exact == 1.0


def test_cjk_bigram_overlap_and_features_reported():
    query = _query("缓存方案")
    cands = [_cand("a", "数据库迁移计划", 1, 1), _cand("b", "我们选了缓存方案", 2, 1)]
    ranked = feature_rerank(query, cands, now_seq=1)
    assert ranked[0].id == "b"
    assert ranked[0].features.cjk == 1.0
    assert set(ranked[0].features.as_dict()) == {
        "fused", "exact", "entity", "cjk", "recency", "rank", "adjacent", "coverage",
    }  # fmt: skip


def test_recency_only_breaks_ties():
    query = _query("plain")
    tied = [
        RerankCandidate("old", "x", fused_score=0.5, fused_rank=1, turn_last=10),
        RerankCandidate("new", "y", fused_score=0.5, fused_rank=1, turn_last=90),
    ]
    assert [s.id for s in feature_rerank(query, tied, now_seq=100)] == ["new", "old"]
    apart = [_cand("old", "x", 1, 10), _cand("new", "y", 5, 99)]
    assert [s.id for s in feature_rerank(query, apart, now_seq=100)] == ["old", "new"]
    assert recency(100, 100) == 1.0
    assert recency(50, 100) == 0.5


def _scored(*cands: RerankCandidate) -> list[ScoredCandidate]:
    """The candidates as a rerank would return them, best first in the given order."""
    return [
        ScoredCandidate(c, 1.0 / (i + 1), RerankFeatures(c.fused_score, 0, 0, 0, 0))
        for i, c in enumerate(cands)
    ]


def test_select_respects_k():
    scored = _scored(*(_cand(f"c{i}", f"text {i}", i + 1, i * 10) for i in range(6)))
    sel = select_within_budget(scored, k=3, budget_tokens=None)
    assert [s.id for s in sel.selected] == ["c0", "c1", "c2"]
    assert [r for _, r in sel.dropped] == ["below_k"] * 3


def test_select_respects_budget_and_tries_smaller_next():
    scored = _scored(_cand("a", "a", 1, 10), _cand("b", "b", 2, 20), _cand("c", "c", 3, 30))
    sel = select_within_budget(
        scored, k=5, budget_tokens=100, token_counts={"a": 60, "b": 50, "c": 40}
    )
    assert [s.id for s in sel.selected] == ["a", "c"]
    assert [(s.id, r) for s, r in sel.dropped] == [("b", "over_budget")]
    assert sel.tokens == 100
    assert select_within_budget(scored, k=5, budget_tokens=0).selected == []


def test_select_counts_tokens_of_text_when_not_given():
    scored = _scored(_cand("a", "hello world, this is recalled text", 1, 1))
    sel = select_within_budget(scored, k=1, budget_tokens=1000)
    assert sel.tokens == count_tokens("hello world, this is recalled text")


def test_select_drops_in_window_and_duplicates():
    scored = _scored(
        _cand("in_c1", "recent", 1, 96, first=95),
        _cand("straddles", "partly recent", 2, 95, first=93),
        _cand("piece1", "first piece of turn 40", 3, 40),
        _cand("piece2", "second piece of turn 40", 4, 40),
        _cand("grouped", "overlap copy", 5, 60),
        _cand("group_best", "overlap copy, better", 6, 61),
        _cand("same_text", "first  piece of TURN 40", 7, 70),
        _cand("inside", "sub-range", 8, 94, first=94),
    )
    sel = select_within_budget(
        scored,
        k=10,
        budget_tokens=None,
        window_seqs=range(95, 101),
        overlap_groups={"grouped": "g", "group_best": "g"},
    )
    assert [s.id for s in sel.selected] == ["straddles", "piece1", "grouped"]
    assert {s.id: r for s, r in sel.dropped} == {
        "in_c1": "in_window",
        "piece2": "duplicate",
        "group_best": "duplicate",
        "same_text": "duplicate",
        "inside": "duplicate",
    }


def test_a_range_is_a_duplicate_only_inside_one_kept_range():
    scored = _scored(
        _cand("early", "turns 1-5", 1, 5, first=1),
        _cand("late", "turns 4-10", 2, 10, first=4),
        _cand("inside_late", "turns 4-9", 3, 9, first=4),
        _cand("across_both", "turns 3-7", 4, 7, first=3),
        _cand("inside_early", "turns 2-3", 5, 3, first=2),
    )
    sel = select_within_budget(scored, k=10, budget_tokens=None)
    # 3-7 lies in the union of 1-5 and 4-10, but inside neither: it is kept.
    assert [s.id for s in sel.selected] == ["early", "late", "across_both"]
    assert {s.id: r for s, r in sel.dropped} == {
        "inside_late": "duplicate",
        "inside_early": "duplicate",
    }


def test_a_key_inside_a_longer_word_is_not_found():
    q = _query("x", entities=["Cal", "gpt-4"], numbers=["45"])
    out = feature_rerank(
        q,
        [
            _cand("inside", "Calgary trip, gpt-4o and 4521", 1, 1),
            _cand("alone", "Cal said gpt-4 costs 45 dollars", 2, 2),
        ],
        now_seq=2,
    )
    by_id = {s.id: s.features for s in out}
    assert by_id["inside"].entity == 0.0
    assert by_id["alone"].entity == 1.0


def test_a_candidate_next_to_the_best_hit_ranks_above_an_equal_one_elsewhere():
    query = _query("plain")
    cands = [
        RerankCandidate("best", "x", fused_score=1.0, fused_rank=1, turn_first=10, turn_last=14),
        RerankCandidate("far", "y", fused_score=0.4, fused_rank=2, turn_first=40, turn_last=44),
        RerankCandidate("after", "z", fused_score=0.4, fused_rank=3, turn_first=15, turn_last=19),
        RerankCandidate("item", "w", fused_score=0.4, fused_rank=4, turn_last=9, ranged=False),
    ]
    by_id = {s.id: s for s in feature_rerank(query, cands, now_seq=50)}
    assert by_id["after"].features.adjacent == 1.0  # the best hit ends at 14, it starts at 15
    assert by_id["best"].features.adjacent == 0.4  # and the best hit has it as its neighbour
    assert by_id["far"].features.adjacent == 0.0
    assert by_id["item"].features.adjacent == 0.0  # no turns: never anyone's neighbour
    assert [s.id for s in feature_rerank(query, cands, now_seq=50)][:2] == ["best", "after"]
    assert by_id["far"].features.rank == 1 / 2**0.5


def test_coverage_weighs_query_stems_by_their_rarity_among_candidates_in_both_languages():
    query = _query("Melanie painting?")
    cands = [
        _cand("names", "Melanie: hi! Melanie here.", 1, 1),
        _cand("both", "Melanie: I painted a sunset last week.", 2, 2),
        _cand("again", "Melanie: see you, said Melanie.", 3, 3),
    ]
    by_id = {s.id: s.features for s in feature_rerank(query, cands, now_seq=3)}
    assert by_id["both"].coverage == 1.0  # "painted" and "painting" share a stem
    assert 0.0 < by_id["names"].coverage == by_id["again"].coverage < 0.5  # every one names her
    zh = _query("缓存方案")
    zh_cands = [_cand("a", "数据库迁移计划", 1, 1), _cand("b", "我们选了缓存方案", 2, 2)]
    zh_by_id = {s.id: s.features for s in feature_rerank(zh, zh_cands, now_seq=2)}
    assert zh_by_id["b"].coverage == 1.0
    assert zh_by_id["a"].coverage == 0.0


def test_duplicates_are_found_by_the_keys_given_or_worked_out_alike():
    scored = _scored(
        _cand("a", "Ferry at 9:40, platform 2.", 1, 10),
        _cand("b", "ferry at  9:40,\nPLATFORM 2.", 2, 20),  # the same text but for case and spaces
        _cand("c", "渡轮 九点四十分", 3, 30),
        _cand("d", "渡轮  九点四十分", 4, 40),
        _cand("e", "Ferry at 10:15.", 5, 50),
    )
    worked_out = select_within_budget(scored, k=10, budget_tokens=None)
    given = select_within_budget(
        scored,
        k=10,
        budget_tokens=None,
        text_keys={c.id: text_key(c.candidate.text) for c in scored if c.id != "d"},
    )
    for sel in (worked_out, given):
        assert [s.id for s in sel.selected] == ["a", "c", "e"]
        assert {s.id: r for s, r in sel.dropped} == {"b": "duplicate", "d": "duplicate"}
    assert text_key("ferry at  9:40,\nPLATFORM 2.") == "ferry at 9:40, platform 2."
    # The keys given are what the selection compares: a caller's key decides.
    told = select_within_budget(
        scored, k=10, budget_tokens=None, text_keys={"e": text_key("Ferry at 9:40, platform 2.")}
    )
    assert {s.id: r for s, r in told.dropped}["e"] == "duplicate"


def test_select_skips_near_duplicates_of_kept_candidates_when_asked():
    chat = "user: Haha, that is funny. Anyway, how was your day?\nassistant: Good, nothing special."
    scored = _scored(
        _cand("chat", chat, 1, 80, first=79),
        _cand("big", "x " * 400, 2, 70),  # does not fit: not kept, so nothing repeats it
        _cand("again", "user: Anyway, how was your day?\nassistant: Good, nothing special.", 3, 30),
        _cand("again_zh", "用户：对了，你今天过得怎么样？", 4, 20),
        _cand("same_zh", "对了，你今天过得怎么样？", 5, 22),
        _cand("value", "user: Haha, that is funny. Anyway, how was your day 2?", 6, 12),
    )
    kwargs = {"k": 10, "budget_tokens": 300}
    plain = select_within_budget(scored, **kwargs)
    assert [s.id for s in plain.selected] == ["chat", "again", "again_zh", "same_zh", "value"]
    sel = select_within_budget(scored, **kwargs, near_duplicates=True)
    # What a kept candidate already says is left out; a new number is new evidence.
    assert [s.id for s in sel.selected] == ["chat", "again_zh", "value"]
    assert {s.id: r for s, r in sel.dropped} == {
        "big": "over_budget",
        "again": "near_duplicate",
        "same_zh": "near_duplicate",
    }


def test_cross_encoded_fuses_the_two_orders_and_leaves_the_rest() -> None:
    scored = _scored(*(_cand(f"c{i}", f"text {i}", i + 1, i * 10) for i in range(5)))
    # The cross-encoder reads the first three: it puts the third first, the first last.
    out = cross_encoded(scored, [-5.0, 1.0, 3.0])
    # Reciprocal ranks (k 5): c0 1/5+1/7, c1 1/6+1/6, c2 1/7+1/5: c0 and c2 tie above c1, the
    # feature order breaks the tie; the two the cross-encoder did not read follow as they were.
    assert [s.id for s in out] == ["c0", "c2", "c1", "c3", "c4"]
    assert out[0].score == out[1].score > out[2].score
    assert out[3:] == scored[3:]
    assert cross_encoded(scored, []) == scored


def test_a_clear_cross_encoder_verdict_moves_a_candidate_up() -> None:
    scored = _scored(*(_cand(f"c{i}", f"text {i}", i + 1, i * 10) for i in range(10)))
    # The sixth by features is the cross-encoder's clear first: it comes up to third place.
    out = cross_encoded(scored, [0.0, -1.0, -2.0, -3.0, -4.0, 9.0, -6.0, -7.0, -8.0, -9.0])
    assert [s.id for s in out][:4] == ["c0", "c1", "c5", "c2"]


def test_the_cross_encoder_reads_only_english_questions_without_keys() -> None:
    leading = _scored(_cand("c1", "user: I am allergic to peanuts.", 1, 3))
    assert cross_encoder_asked(rewrite_query("What am I allergic to?", []), leading)
    # An ID or a quoted string: the exact feature already decided.
    assert not cross_encoder_asked(rewrite_query("status of ab-12345?", []), leading)
    assert not cross_encoder_asked(rewrite_query('Who said "see you in Lyon"?', []), leading)
    # Chinese, in the question or in a candidate: the model reads English only.
    assert not cross_encoder_asked(rewrite_query("我对什么过敏？", []), leading)
    mixed = [*leading, *_scored(_cand("c2", "user: 我对花生过敏。", 2, 5))]
    assert not cross_encoder_asked(rewrite_query("What am I allergic to?", []), mixed)
    assert not cross_encoder_asked(rewrite_query("What am I allergic to?", []), [])
    # A conversation pasted as the query, or a long text, is not the question it was trained on.
    dialogue = "Lisa: I brought a special handkerchief!\nAssistant: Oh? What does it look like?"
    assert not cross_encoder_asked(rewrite_query(dialogue, []), leading)
    assert not cross_encoder_asked(rewrite_query("Tell me what I said. " * 12, []), leading)
