from app.recall.service import query_view


def test_a_long_query_is_embedded_by_its_last_lines_only() -> None:
    assert query_view("what is my budget?") == "what is my budget?"
    assert query_view("A: hi\nB: hello\nA: beach?") == "A: hi\nB: hello\nA: beach?"
    dialogue = "A: hi\nB: hello\n\nA: I went to the beach\nB: nice\nA: shells!"
    assert query_view(dialogue) == "A: I went to the beach\nB: nice\nA: shells!"
    assert query_view("我去了海边\n真好\n\n捡了贝壳\n好看吗？") == "真好\n捡了贝壳\n好看吗？"
