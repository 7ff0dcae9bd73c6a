from app.recall.service import query_views


def test_query_views_add_the_last_lines_of_a_long_query() -> None:
    assert query_views("what is my budget?") == ["what is my budget?"]
    dialogue = "A: hi\nB: hello\n\nA: I went to the beach\nB: nice\nA: shells!"
    assert query_views(dialogue) == [dialogue, "A: I went to the beach\nB: nice\nA: shells!"]
