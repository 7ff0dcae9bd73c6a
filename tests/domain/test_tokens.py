from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.tokens import count_tokens, framing_tokens, message_tokens, spaced_tokens

# Starts that cl100k's pre-tokeniser treats differently after a space: letters, contractions,
# digits, punctuation, whitespace and newlines, CJK and fullwidth punctuation, other scripts.
PIECES = [
    "budget", "Lyon", "'s", "'ll", "don't", "42", "1234567", "3.5", ".", "...", "(", "\"", "—",
    "…", " ", "  ", "\n", "\r\n", "\t", "预算", "火车票", "。", "，", "！", "（", "é", "naïve",
    "Ωmega", "ﬁ", "½", "²", "🎉", "\u200b", "\u3000", "々", "한국", "の", "ー", "x1-y2", "a@b.c",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=40), st.sampled_from(["", " "]))
def test_spaced_tokens_equal_counting_again(pieces: list[str], sep: str) -> None:
    text = sep.join(pieces)
    assert spaced_tokens(text, count_tokens(text)) == count_tokens(" " + text)


def test_spaced_tokens_beyond_the_searched_start() -> None:
    digits = "7" * 100 + " then words"  # no word end within the first 64 characters
    assert spaced_tokens(digits, count_tokens(digits)) == count_tokens(" " + digits)
    assert spaced_tokens("budget train", 2) == 2  # " budget" is one token too
    assert spaced_tokens("'s fine", 2) == 3  # "'s", " fine" against " '", "s", " fine"


def test_framing_is_the_message_count_without_content() -> None:
    for role, name, call_id in [
        ("user", None, None),
        ("assistant", "Bob", None),
        ("tool", None, "c1"),
    ]:
        content = "我们决定采用方案B"
        framing = framing_tokens(role, name, call_id)
        assert message_tokens(role, content, name, None, call_id) - framing == count_tokens(content)
    assert framing_tokens("user") == 4
    assert framing_tokens("assistant", "Bob") == 6
