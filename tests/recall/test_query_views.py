from app.recall.query import asker_view, query_view, query_views


def test_a_long_query_is_embedded_by_its_last_lines_only() -> None:
    assert query_view("what is my budget?") == "what is my budget?"
    assert query_view("A: hi\nB: hello\nA: beach?") == "A: hi\nB: hello\nA: beach?"
    dialogue = "A: hi\nB: hello\n\nA: I went to the beach\nB: nice\nA: shells!"
    assert query_view(dialogue) == "A: I went to the beach\nB: nice\nA: shells!"
    assert query_view("我去了海边\n真好\n\n捡了贝壳\n好看吗？") == "真好\n捡了贝壳\n好看吗？"


def test_a_transcript_is_also_embedded_by_its_askers_own_lines() -> None:
    dialogue = (
        "Bart: I will do a magic trick\nAssistant: great\n"
        "Bart: what to wear?\nAssistant: red\nBart: so excited"
    )
    assert (
        asker_view(dialogue)
        == "Bart: I will do a magic trick\nBart: what to wear?\nBart: so excited"
    )
    assert query_views(dialogue) == [
        "Bart: what to wear?\nAssistant: red\nBart: so excited",
        "Bart: I will do a magic trick\nBart: what to wear?\nBart: so excited",
    ]
    zh = "小明：我要表演魔术\n助手：太好了\n小明：穿什么？\n助手：红色\n小明：好期待"
    assert asker_view(zh) == "小明：我要表演魔术\n小明：穿什么？\n小明：好期待"


def test_other_queries_have_no_asker_view() -> None:
    assert query_views("what is my budget?") == ["what is my budget?"]
    assert asker_view("A: hi\nB: hello\nA: beach?") is None  # short: the last lines are all of it
    assert asker_view("A: one\nA: two\nA: three\nA: four") is None  # one speaker: not a dialogue
    assert asker_view("A: one\nB: two\nplain line\nA: three\nB: four") is None  # not all labelled
