from app.domain.text import holds_cjk, match_terms, mostly_cjk, shorten, terms, terms_document

MIXED = (
    'The ORD-4471 shipped to Berlin, alice@example.com said: "don\'t" e.g. 3.5%! '
    "我们决定采用方案B，预算不超过五万。Ünïcode naïve"
)
MIXED_TERMS = [
    "ord-4471", "shipped", "berlin", "alice@example.com", "said", "don", "t", "e.g", "3.5",
    "决", "定", "采", "用", "方", "案",
    "们决", "决定", "定采", "采用", "用方", "方案",
    "b", "预", "算", "不", "超", "五", "万", "预算", "算不", "不超", "超过", "过五", "五万",
    "ünïcode", "naïve",
]  # fmt: skip


def test_terms_of_mixed_text_in_order() -> None:
    assert terms(MIXED) == MIXED_TERMS
    assert terms(MIXED) == MIXED_TERMS  # the second time from the table of pieces seen
    assert terms("Is it THE one?", drop_stopwords=False) == ["is", "it", "the", "one"]
    assert terms("Is it THE one?") == ["one"]


def test_terms_do_not_depend_on_whitespace_between_pieces() -> None:
    spaced = "budget\t火车\n\nLyon\u3000酒店\xa0price"
    assert terms(spaced) == ["budget", "火", "车", "火车", "lyon", "酒", "店", "酒店", "price"]
    sentence = "方案" * 20  # a long piece, not kept in the table: same terms each time
    bigrams = (["方案", "案方"] * 20)[:-1]
    assert terms(sentence) == terms(sentence) == [*sentence, *bigrams]


def test_chinese_function_characters_are_left_out_alone_and_in_pairs() -> None:
    # "我", "的", "是" and "了" match nearly any Chinese text on their own, and so do "我的" and
    # "哪个" made of them; a bigram with a content character stays, and a negation stays as
    # English keeps "not".
    assert terms("我的酒店是哪个了") == ["酒", "店", "的酒", "酒店", "店是"]
    assert terms("我不去") == ["不", "去", "我不", "不去"]
    assert terms("什么时候") == ["时", "候", "么时", "时候"]
    assert terms("我的", drop_stopwords=False) == ["我", "的", "我的"]


def test_terms_document_splits_identifiers_only_when_present() -> None:
    assert terms_document(["budget", "lyon"]) == "budget lyon"
    assert terms_document(MIXED_TERMS[:9]) == (
        "ord-4471 ord 4471 shipped berlin alice@example.com alice example com said don t "
        "e.g e g 3.5 3 5"
    )


def test_match_terms_leave_out_single_characters_when_there_is_more() -> None:
    assert match_terms(terms("我们住在哪个酒店？")) == {"们住", "住在", "个酒", "酒店"}
    assert match_terms(terms("Kestrel 酒店")) == {"kestrel", "酒店"}
    assert match_terms(["住"]) == {"住"}  # nothing longer: the character is all there is
    assert match_terms(terms("which hotel?")) == {"hotel"}
    # The "s" of a possessive is chance, as a lone Chinese character is; a digit is a number.
    assert match_terms(terms("What is my company's revenue target?")) == {
        "company",
        "revenue",
        "target",
    }
    assert match_terms(terms("Is the meeting in room 3?")) == {"meeting", "room", "3"}
    assert match_terms(["s"]) == {"s"}


def test_shorten_cuts_between_words_never_inside_a_grapheme() -> None:
    assert shorten("court", 10) == "court"
    assert shorten("le musée de la Saône, à Lyon", 18) == "le musée de la…"
    assert shorten("Fourvière", 8) == "Fourviè…"  # one word longer than the room: by graphemes
    assert shorten("Fourvie\u0300re est là", 8) == "Fourvi…"  # never "e" without its accent
    family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # one emoji, five code points
    assert shorten(f"ok {family}{family}", 7) == "ok…"
    assert shorten("富维耶圣母院在山上", 6) == "富维耶圣母…"  # between two Chinese characters
    assert shorten("看 Fourvière 夜景", 10) == "看…"


def test_a_text_holds_cjk_or_is_mostly_cjk():
    assert holds_cjk("the 酒店 was fine") and not mostly_cjk("the 酒店 was fine")
    assert holds_cjk("我叫王小梅。") and mostly_cjk("我叫王小梅。")
    assert not holds_cjk("The JR Pass costs 50,000 yen (¥).")
