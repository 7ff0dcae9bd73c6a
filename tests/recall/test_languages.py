from app.domain.text import mostly_cjk
from app.recall.languages import ADAPTED_OFFSETS, RAW_OFFSETS, calibrated, in_other_language

TEXTS = {
    "address": "我的公司地址在世纪大道100号。",
    "swim": "我每周三晚上去游泳。",
    "dentist": "My dentist is Dr. Okafor on Baker Street.",
}


def test_a_text_is_mostly_cjk_when_its_cjk_characters_outnumber_its_other_words() -> None:
    assert mostly_cjk("Bart在圣诞节晚会上跳舞，感觉非常开心。")
    assert mostly_cjk("我的公司地址在世纪大道100号")
    assert not mostly_cjk("We stayed at the 酒店 near the station.")
    assert not mostly_cjk("ORD-4471")
    assert not mostly_cjk("")


def test_the_offset_goes_to_a_text_in_the_other_language_only() -> None:
    for offsets in (RAW_OFFSETS, ADAPTED_OFFSETS):
        assert offsets.offset(True, True) == offsets.offset(False, False) == 0.0
        assert offsets.offset(True, False) == offsets.cjk_query > offsets.other_query > 0
        assert offsets.offset(False, True) == offsets.other_query


def test_calibration_lifts_the_fact_in_the_other_language_above_same_language_texts() -> None:
    # The cosines e5 gives "我的牙医是谁？" against these three texts.
    cosines = {"address": 0.852, "swim": 0.828, "dentist": 0.806}
    assert in_other_language(True, TEXTS)
    scores = calibrated(cosines, True, TEXTS, limit=2)
    assert list(scores) == ["dentist", "address"]
    assert abs(scores["dentist"] - (0.806 + RAW_OFFSETS.cjk_query)) < 1e-12
    assert scores["address"] == 0.852
    adapted = calibrated(cosines, True, TEXTS, limit=1, offsets=ADAPTED_OFFSETS)
    assert adapted == {"dentist": 0.806 + ADAPTED_OFFSETS.cjk_query}


def test_a_pool_in_the_querys_language_keeps_its_scores() -> None:
    chinese = {k: v for k, v in TEXTS.items() if k != "dentist"}
    assert not in_other_language(True, chinese)
    cosines = {"swim": 0.8, "address": 0.9}
    assert calibrated(cosines, True, chinese, limit=5) == {"address": 0.9, "swim": 0.8}
    assert list(calibrated({"a": 0.5, "b": 0.5}, False, {"a": "one", "b": "two"}, 5)) == ["a", "b"]
