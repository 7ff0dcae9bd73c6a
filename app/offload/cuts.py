"""Where a turn longer than a chunk is cut into pieces (pure): its body is tokenised once, each cut
falls on a paragraph, line or sentence edge when one is near (else on a token edge), and a piece's
token count is read off that one tokenisation wherever cl100k's pre-tokeniser makes it exact."""

import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from functools import lru_cache
from itertools import accumulate

from app.domain.tokens import count_tokens, encoding

# A newline after which cl100k's pre-tokeniser always starts a new piece, in any text holding
# it and the character after it: the whitespace that follows it (if any) holds no other line
# break. Its pieces (`\s*[\r\n]`, punctuation then `[\r\n]*`) take every line break of a
# whitespace run, and no piece starts with a line break but those. The pre-tokeniser looks
# nowhere behind, so a text cut on such edges is tokenised piece by piece as the whole was, and
# its token count is read off the whole's tokenisation. Whitespace is every Unicode White_Space
# character (in UTF-8) and Python's \x1c-\x1f, so an edge found here is one for cl100k.
_WHITESPACE_BYTES = (
    rb"(?:[ \t\x0b\x0c\x1c-\x1f]|\xc2[\x85\xa0]|\xe1\x9a\x80|\xe2\x80[\x80-\x8a\xa8\xa9\xaf]"
    rb"|\xe2\x81\x9f|\xe3\x80\x80)"
)
_LINE_EDGE_RE = re.compile(rb"\n(?!" + _WHITESPACE_BYTES + rb"*[\r\n])")
_SENTENCE_EDGE_RE = re.compile(rb"[.!?][ \t\r\n\x0b\x0c]+|\xe3\x80\x82|\xef\xbc[\x81\x9f\x9b]")
# A piece's text that starts with a line break (after blanks): the header's last newline and it
# are one pre-tokeniser piece, so the raw text is counted whole.
_LEADING_BREAK_RE = re.compile(r"[^\S\r\n]*[\r\n]")


@lru_cache(maxsize=1)
def _token_bytes() -> list[int]:
    """The length in bytes of every token of the encoding (0 for unused ids)."""
    lengths = [0] * encoding().n_vocab
    for token in range(encoding().n_vocab):
        try:
            lengths[token] = len(encoding().decode_single_token_bytes(token))
        except KeyError:
            continue
    return lengths


class TokenisedBody:
    """A long body, its UTF-8 bytes and where its tokens start (tokenised once)."""

    def __init__(self, text: str, ids: Sequence[int] | None) -> None:
        self.data = text.encode()
        if ids is None:
            ids = encoding().encode(text, disallowed_special=())
        lengths = _token_bytes()
        self.starts = list(accumulate(map(lengths.__getitem__, ids), initial=0))  # and the end
        self.tokens = len(ids)
        self.lines = [m.end() for m in _LINE_EDGE_RE.finditer(self.data)]
        self.paragraphs = [e for e in self.lines if self._after_blank_line(e)]
        self.sentences = [m.end() for m in _SENTENCE_EDGE_RE.finditer(self.data)]

    def _after_blank_line(self, edge: int) -> bool:
        """The line that ends at `edge` holds only whitespace (a paragraph starts here)."""
        before = self.data.rfind(b"\n", 0, edge - 1)
        return before >= 0 and not self.data[before + 1 : edge - 1].strip()

    def token_at(self, offset: int) -> int:
        """The first token starting at or after byte `offset`."""
        return bisect_left(self.starts, offset)

    def is_edge(self, offset: int) -> bool:
        """A cut at `offset` splits the tokenisation in two (`_LINE_EDGE_RE`)."""
        if offset in (0, len(self.data)):
            return True
        at = bisect_left(self.lines, offset)
        return at < len(self.lines) and self.lines[at] == offset

    def char_start(self, offset: int, forward: bool) -> int:
        """`offset`, moved to the start of the character it falls in (or of the next one)."""
        step = 1 if forward else -1
        while 0 < offset < len(self.data) and 0x80 <= self.data[offset] < 0xC0:
            offset += step
        return offset

    def overlap(self, previous: int, start: int, tokens: int) -> str:
        """About the last `tokens` tokens of the piece `previous..start`, from a word edge when
        one is near."""
        if tokens <= 0:
            return ""
        first = max(self.token_at(previous), self.token_at(start) - tokens)
        begin = self.char_start(self.starts[first], forward=True)
        text = self.data[begin:start].decode() if begin < start else ""
        space = text.find(" ")
        return text[space + 1 :] if 0 <= space < len(text) // 2 else text


def _last_within(edges: list[int], low: int, high: int) -> int:
    """The last of `edges` (ascending) in `low < edge <= high`, else -1."""
    at = bisect_right(edges, high) - 1
    return edges[at] if at >= 0 and edges[at] > low else -1


def place_cuts(body: TokenisedBody, budget: int) -> list[tuple[int, int, int | None]]:
    """The pieces of `body` as (start byte, end byte, tokens when known exactly), each within
    `budget` tokens: a piece ends at the last paragraph edge, else line edge, else sentence
    end in the second half of its room, else at the last of those in its room, else on a token
    edge (never inside a character). Pieces between line edges are counted from the body's
    tokenisation; the others are tokenised again (and shortened if they came out long)."""
    cuts: list[tuple[int, int, int | None]] = []
    size = len(body.data)
    start = 0
    while start < size:
        first = body.token_at(start)
        limit = min(first + budget, body.tokens)
        while True:
            high = body.starts[limit]
            if limit == body.tokens:
                end = size
            else:
                half = body.starts[first + (limit - first) // 2]
                end = next(
                    (
                        edge
                        for edges in (body.paragraphs, body.lines, body.sentences)
                        if (edge := _last_within(edges, half, high)) > 0
                    ),
                    max(_last_within(e, start, high) for e in (body.lines, body.sentences)),
                )
                if end <= start:
                    end = body.char_start(high, forward=False)
                    if end <= start:
                        end = body.char_start(high, forward=True)
            if body.is_edge(start) and body.is_edge(end):
                tokens: int | None = body.token_at(end) - first
                break
            tokens = count_tokens(body.data[start:end].decode())
            if tokens <= budget or limit <= first + 1:
                break
            limit = max(first + 1, limit - (tokens - budget))
        cuts.append((start, end, tokens))
        start = end
    return cuts


def raw_tokens(
    header: str, overlap: str, overlap_tokens: int, piece: str, piece_tokens: int | None
) -> int:
    """Tokens of `header + overlap + piece`: the parts' sums where they meet on line edges
    (`_LINE_EDGE_RE`; the header ends with one, the overlap ends where the piece starts), else
    the whole counted."""
    text = overlap + piece
    if piece_tokens is None or _LEADING_BREAK_RE.match(text) or (overlap and overlap[-1] != "\n"):
        return count_tokens(header + text)
    return count_tokens(header) + overlap_tokens + piece_tokens
