from datetime import UTC, datetime, timedelta
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from app.domain.records import TurnRecord
from app.domain.text import terms
from app.domain.tokens import count_tokens, message_tokens
from app.domain.tool_groups import atomic_units
from app.domain.turn_text import render_turn, turn_body
from app.offload.chunking import (
    ChunkDraft,
    ChunkingConfig,
    chunk_turns,
    joined_pieces,
    summary_hint,
)

T0 = datetime(2024, 5, 1, tzinfo=UTC)
CFG = ChunkingConfig()

# fmt: off
EN_WORDS = [
    "the", "invoice", "ORD-4471", "was", "shipped", "to", "Berlin", "alice@example.com", "refund",
    "Paris", "budget", "42", "deploy", "server", "cache", "latency", "Docker", "meeting", "Tuesday",
    ".", "!", "?", ",", "\n", "\n\n",
]
ZH_WORDS = [
    "我们", "决定", "采用", "方案", "预算", "不超过", "五万", "。", "！", "？", "；", "\n\n",
]
# fmt: on


def make(seq: int, content: str, role: str = "user", seconds: int = 0, **kw: object) -> TurnRecord:
    tool_calls = kw.get("tool_calls")
    tokens = message_tokens(role, content, kw.get("name"), tool_calls, kw.get("tool_call_id"))  # type: ignore[arg-type]
    return TurnRecord(seq, role, content, tokens, T0 + timedelta(seconds=seconds), **kw)  # type: ignore[arg-type]


def body_of_piece(chunk: ChunkDraft) -> str:
    body = chunk.raw_text.split("\n", 1)[1]
    assert body.startswith(chunk.overlap_prefix)
    return body[len(chunk.overlap_prefix) :]


@st.composite
def texts(draw: st.DrawFn) -> str:
    vocab = draw(st.sampled_from([EN_WORDS, ZH_WORDS, EN_WORDS + ZH_WORDS]))
    size = draw(st.sampled_from([(0, 3), (1, 40), (30, 150), (100, 500)]))
    words = draw(st.lists(st.sampled_from(vocab), min_size=size[0], max_size=size[1]))
    sep = "" if vocab is ZH_WORDS else " "
    return sep.join(words) + draw(st.sampled_from(["", " ", "\n"]))


@st.composite
def conversations(draw: st.DrawFn) -> list[TurnRecord]:
    turns: list[TurnRecord] = []
    clock = 0
    for _ in range(draw(st.integers(0, 25))):
        clock += draw(st.sampled_from([0, 5, 60, 600, 2000, 7200]))
        seq = len(turns)
        if draw(st.integers(0, 4)) == 0:
            ids = [f"call_{seq}_{k}" for k in range(draw(st.integers(1, 2)))]
            calls = [{"id": i, "type": "function", "function": {"name": "lookup"}} for i in ids]
            turns.append(make(seq, draw(texts()), "assistant", clock, tool_calls=calls))
            for cid in ids:
                turns.append(make(len(turns), draw(texts()), "tool", clock, tool_call_id=cid))
        else:
            role = draw(st.sampled_from(["user", "assistant", "system", "tool"]))
            name = draw(st.sampled_from([None, None, "bob"]))
            turns.append(make(seq, draw(texts()), role, clock, name=name))
    return turns


@settings(max_examples=150, deadline=None)
@given(turns=conversations(), overlap=st.sampled_from([0, 20]))
def test_chunking_properties(turns: list[TurnRecord], overlap: int) -> None:
    cfg = ChunkingConfig(split_overlap_tokens=overlap)
    chunks = chunk_turns(turns, cfg)
    by_seq = {t.seq: t for t in turns}
    # In order, non-overlapping, every turn covered once (or by its pieces, numbered 1..n).
    covered: list[int] = []
    for c in chunks:
        seqs = list(range(c.turn_first, c.turn_last + 1))
        if c.is_piece:
            assert c.turn_first == c.turn_last
            if c.part > 1:
                continue
        covered.extend(seqs)
    assert covered == [t.seq for t in turns]
    for a, b in pairwise(chunks):
        assert a.turn_last < b.turn_first or (a.turn_first == b.turn_first and b.part == a.part + 1)
    for i, c in enumerate(chunks):
        members = [by_seq[s] for s in range(c.turn_first, c.turn_last + 1)]
        assert c.roles == tuple(sorted({t.role for t in members}))
        assert c.trusted == all(t.role != "tool" for t in members)
        assert c.token_count == count_tokens(c.raw_text)
        assert c.terms == tuple(terms(c.raw_text))
        # Only a whole tool-call group (call + results, none needing a split) may exceed max.
        if c.token_count > cfg.max_tokens:
            assert len(members) > 1
            assert any(t.tool_calls for t in members)
            assert all(count_tokens(render_turn(t)) <= cfg.max_tokens for t in members)
        assert len(c.summary_hint) <= 80
        # Undersized only at the end, before a time gap, when the next unit did not fit, or a piece.
        if c.token_count < cfg.min_tokens and i + 1 < len(chunks) and not c.is_piece:
            nxt = chunks[i + 1]
            gap = (nxt.ts_first - c.ts_last).total_seconds() > cfg.time_gap_seconds
            assert gap or nxt.is_piece or c.token_count + nxt.token_count + 2 > cfg.max_tokens
        if not c.is_piece:
            for t in members:
                assert t.content in c.raw_text
    # Split turns: pieces minus overlaps give back the body verbatim.
    for seq, turn in by_seq.items():
        pieces = [c for c in chunks if c.is_piece and c.turn_first == seq]
        if pieces:
            assert [p.part for p in pieces] == list(range(1, pieces[0].parts + 1))
            assert "".join(body_of_piece(p) for p in pieces) == turn_body(turn)
            assert all(p.overlap_prefix == "" for p in pieces[:1])
    # Tool groups share a chunk unless one of their turns had to be split.
    home = {
        c.turn_first + k: n
        for n, c in enumerate(chunks)
        for k in range(c.turn_last - c.turn_first + 1)
    }
    for unit in atomic_units(turns):
        group = [turns[i] for i in unit]
        if len({home[t.seq] for t in group}) > 1:
            assert any(count_tokens(render_turn(t)) > cfg.max_tokens for t in group)


def test_render_labels_and_verbatim_content() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}]
    turns = [
        make(0, "hi there", "user"),
        make(1, "", "assistant", tool_calls=calls),
        make(2, '{"ok": true}', "tool", tool_call_id="c1"),
        make(3, "done", "assistant", name="helper"),
    ]
    [chunk] = chunk_turns(turns)
    assert chunk.raw_text.splitlines() == [
        "user: hi there",
        "assistant → tool_calls: "
        '[{"function":{"arguments":"{}","name":"get"},"id":"c1","type":"function"}]',
        'tool[c1]: {"ok": true}',
        "assistant (helper): done",
    ]
    assert not chunk.trusted
    assert chunk.roles == ("assistant", "tool", "user")


def test_time_gap_breaks_even_below_min() -> None:
    turns = [make(0, "short note about Berlin"), make(1, "and Berlin again", seconds=3600)]
    assert [(c.turn_first, c.turn_last) for c in chunk_turns(turns)] == [(0, 0), (1, 1)]


def test_topic_shift_breaks_only_after_min_tokens() -> None:
    cache = "the cache latency on the deploy server is too high, cache misses on deploy " * 5
    turns = [
        make(0, cache),
        make(1, "cache latency fixed by warming the deploy cache server"),
        make(2, "Separately, my grandmother bakes wonderful apple pies every autumn."),
    ]
    chunks = chunk_turns(turns)
    assert [(c.turn_first, c.turn_last) for c in chunks] == [(0, 1), (2, 2)]
    # Below min tokens an unrelated turn still joins the chunk.
    assert len(chunk_turns([make(0, "cache latency"), turns[2]])) == 1


def test_long_chinese_turn_splits_on_sentence_ends_with_marked_overlap() -> None:
    text = "".join(f"第{i}个决定是采用方案{i}并且预算不超过{i}万元。" for i in range(60))
    chunks = chunk_turns([make(7, text, "assistant")])
    assert len(chunks) > 1 and {c.parts for c in chunks} == {len(chunks)}
    assert all(c.turn_first == c.turn_last == 7 for c in chunks)
    assert all(body_of_piece(c).endswith("。") for c in chunks)
    assert all(c.overlap_prefix and text.find(c.overlap_prefix) >= 0 for c in chunks[1:])
    assert "".join(body_of_piece(c) for c in chunks) == text
    assert all(c.token_count <= CFG.max_tokens for c in chunks)


def test_unbroken_text_is_hard_cut() -> None:
    text = "x" * 5000
    chunks = chunk_turns([make(0, text)])
    assert "".join(body_of_piece(c) for c in chunks) == text
    assert all(c.token_count <= CFG.max_tokens for c in chunks)


def test_summary_hint_prefers_ids_then_first_clause() -> None:
    assert summary_hint([make(0, "Refund ORD-991 for bob@x.io, ship to Berlin.")]) == (
        "ORD-991, bob@x.io, Berlin"
    )
    assert summary_hint([make(0, "我们决定用方案B，预算不超过五万。")]) == "我们决定用方案B"
    assert len(summary_hint([make(0, "word " * 100)])) <= 80


def test_summary_hint_keeps_accented_names_whole() -> None:
    """Names in any script's letters: not "Mus", "Fourvi" and "Sa" cut at the first accent."""
    french = "Demain on visite le Musée des Confluences, puis Fourvière et les quais de la Saône."
    assert summary_hint([make(0, french)]) == "Musée, Confluences, Fourvière, Saône"
    decomposed = "Rendez-vous au Cafe\u0301 Be\u0301chard avec Zoë."  # combining accents
    assert summary_hint([make(0, decomposed)]) == "Cafe\u0301 Be\u0301chard, Zoë"


def test_summary_hint_is_cut_between_words_and_graphemes() -> None:
    french = (
        "nous avons réservé une visite guidée du vieux quartier puis une table au bouchon et deux "
        "places pour l'opéra"
    )
    hint = summary_hint([make(0, french)])
    assert hint == "nous avons réservé une visite guidée du vieux quartier puis une table au…"
    decomposed = "on a re\u0301serve\u0301 " * 8  # the cut falls just before a combining accent
    hint = summary_hint([make(0, decomposed)])
    assert hint.endswith("…") and len(hint) <= 80
    assert decomposed.startswith(hint[:-1]) and decomposed[len(hint) - 1] == " "
    chinese = (
        "我们明天上午先去富维耶圣母院看看全景然后沿着索恩河一直散步到老城区吃午饭再去博物馆" * 2
    )
    hint = summary_hint([make(0, chinese)])
    assert hint == chinese[:79] + "…"


LINES = [
    "2026-12-06T03:00:01Z INFO handled request_id=req0001 status=200",
    "订单号：DD00000001，状态：已发货。备注：客户要求周末送达！",
    '  {"sku": "SKU00001", "qty": 3},',
    "",
    "   ",
    "\t\u3000\u00a0",
    "café e\u0301 Z\u0351\u0300 👨\u200d👩\u200d👧 🇫🇷",
    "The deploy failed. Then it worked! Did it?",
    "x" * 300,
]


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.sampled_from(LINES), min_size=10, max_size=120),
    ends=st.lists(st.sampled_from(["\n", "\r\n", "\r", "\n\n", " \n"]), min_size=1, max_size=4),
    overlap=st.sampled_from([0, 20]),
)
def test_a_long_turn_cut_on_lines_is_counted_exactly_and_joins_back(
    lines: list[str], ends: list[str], overlap: int
) -> None:
    """Pieces cut on line edges are counted from the whole text's tokens: the count must be the
    piece's own, whatever the line breaks and spaces around them (CRLF, bare CR, blank lines of
    spaces, ideographic and no-break spaces) and the characters (emoji, combining marks)."""
    text = "".join(line + ends[i % len(ends)] for i, line in enumerate(lines))
    cfg = ChunkingConfig(split_overlap_tokens=overlap)
    turn = make(3, text, "tool", tool_call_id="call_0")
    chunks = chunk_turns([turn], cfg)
    if len(chunks) == 1:
        return
    for c in chunks:
        assert c.token_count == count_tokens(c.raw_text) <= cfg.max_tokens
    pieces = [(c.raw_text, len(c.overlap_prefix)) for c in chunks]
    assert joined_pieces(pieces).encode() == text.encode()
