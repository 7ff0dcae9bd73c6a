from app.domain.stem import by_stem
from app.domain.text import terms
from app.recall.trim import ELISION, trim_chunk, turn_score

LINES = [
    (10, "user: Caroline: Hey Mel! Good to see you! How have you been?"),
    (11, "assistant: Melanie: Hey Caroline! I'm swamped with the kids & work."),
    (12, "user: Caroline: I went to a LGBTQ support group yesterday and it was so powerful."),
    (13, "assistant: Melanie: Wow, that's cool, Caroline! What happened that was so awesome?"),
    (14, "user: Caroline: The transgender stories were so inspiring!"),
]


def idf(term: str) -> float:
    return 1.0 if term in {"caroline", "melanie", "user", "assistant"} else 3.0


def weights(query: str) -> dict[str, float]:
    """Query weights keyed by stem, as recall passes them."""
    return by_stem({t: 1.0 for t in terms(query)})


def test_keeps_the_matching_turn_verbatim_and_marks_the_gaps() -> None:
    out = trim_chunk(LINES, weights("When did Caroline go to the LGBTQ support group?"), idf)
    assert out.trimmed and out.seqs == (12,)
    assert out.text == f"{ELISION}\n{LINES[2][1]}\n{ELISION}"


def test_a_kept_question_brings_its_answer() -> None:
    out = trim_chunk(LINES, weights("what happened that was so awesome"), idf)
    assert out.seqs == (13, 14)
    assert out.text.endswith(LINES[4][1]) and out.text.startswith(ELISION)


def test_no_shared_term_keeps_the_whole_chunk() -> None:
    out = trim_chunk(LINES, weights("pottery class"), idf)
    assert not out.trimmed and out.seqs == (10, 11, 12, 13, 14)
    assert out.text == "\n".join(text for _, text in LINES)


def test_turn_score_counts_each_term_once_with_its_weight() -> None:
    assert turn_score("group group support", {"group": 2.0, "support": 1.0}, idf) == 9.0
    assert turn_score("nothing here", {"group": 2.0}, idf) == 0.0


def test_inflections_of_a_query_word_match() -> None:
    out = trim_chunk(LINES, weights("What stories inspired Caroline?"), idf)
    assert out.seqs == (14,)
