import pytest

from app.recall.fusion import (
    RRF_K,
    ArmWeights,
    FusedCandidate,
    fuse_arms,
    relative_score_fusion,
    rrf,
)


def test_rrf_known_order_and_scores():
    fused = rrf([["a", "b", "c"], ["b", "c", "d"]])
    assert [d for d, _ in fused] == ["b", "c", "a", "d"]
    scores = dict(fused)
    assert scores["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 62)
    assert scores["a"] == pytest.approx(1 / 61)
    assert scores["d"] == pytest.approx(1 / 63)


def test_rrf_weights_shift_order():
    lists = [["a", "b"], ["b", "a"]]
    assert [d for d, _ in rrf(lists, weights=[2.0, 1.0])] == ["a", "b"]
    assert [d for d, _ in rrf(lists, weights=[1.0, 2.0])] == ["b", "a"]
    assert dict(rrf(lists, k=0, weights=[2.0, 1.0]))["a"] == pytest.approx(2 / 1 + 1 / 2)


def test_rrf_ties_broken_by_best_rank_then_first_seen():
    assert [d for d, _ in rrf([["a", "b"], ["b", "a"]])] == ["a", "b"]
    assert [d for d, _ in rrf([["x"], ["y"]])] == ["x", "y"]


def test_rrf_repeated_id_counts_once_per_list():
    assert dict(rrf([["a", "a", "b"]]))["a"] == pytest.approx(1 / (RRF_K + 1))


def test_rrf_validates_inputs():
    assert rrf([]) == []
    with pytest.raises(ValueError):
        rrf([["a"]], weights=[1.0, 1.0])
    with pytest.raises(ValueError):
        rrf([["a"]], weights=[-1.0])


def test_fuse_arms_carries_per_arm_ranks():
    fused = fuse_arms(exact=["c"], lexical=["a", "b", "c"], vector=["b", "a"], method="rrf")
    by_id = {f.id: f for f in fused}
    assert by_id["c"] == FusedCandidate(
        id="c", score=by_id["c"].score, rank=1, exact_rank=1, lexical_rank=3, vector_rank=None
    )
    assert by_id["a"].arms == ["lexical", "vector"]
    assert [f.rank for f in fused] == [1, 2, 3]


def test_exact_hit_within_wide_recall_beats_double_first_place():
    lexical = [f"l{i}" for i in range(30)]
    fused = fuse_arms(
        exact=[*("e" + str(i) for i in range(29)), "x"],
        lexical=lexical,
        vector=lexical,
        method="rrf",
    )
    assert fused[29].id == "x"  # exact rank 30 still ahead of "l0" (first in both other arms)
    assert fused[30].id == "l0"


def test_missing_vector_arm_is_lexical_order():
    fused = fuse_arms(lexical=["a", "b"], vector=[], weights=ArmWeights(vector=0.0), method="rrf")
    assert [f.id for f in fused] == ["a", "b"]


def test_relative_score_fusion_keeps_the_margin_that_rank_fusion_drops() -> None:
    lexical = {"fact": 14.0, "a": 5.0, "b": 4.0}
    vector = {"a": 0.90, "b": 0.89, "fact": 0.86, "c": 0.50}
    by_rank = fuse_arms(lexical=list(lexical), vector=list(vector), method="rrf")
    by_score = fuse_arms(
        lexical=list(lexical),
        vector=list(vector),
        method="relative",
        lexical_scores=lexical,
        vector_scores=vector,
    )
    assert by_rank[0].id == "a"  # first in one arm, second in the other
    assert by_score[0].id == "fact"  # 1.0 + 0.9 beats a (0.1 + 1.0) and b (0.0 + 0.975)
    assert round(by_score[0].score, 6) == 1.9
    assert [c.id for c in by_score] == ["fact", "a", "b", "c"]


def test_relative_score_fusion_normalises_each_list() -> None:
    fused = relative_score_fusion([{"x": 2.0, "y": 4.0}, {"x": 7.0}], [1.0, 0.5])
    assert fused == [("y", 1.0), ("x", 0.5)]  # x: 0 + 0.5 * 1 (a one-item list is all 1.0)
