"""The layered view of a huge tool result (pure, no I/O).

A tool result above `limits.layer_tool_result_tokens` (a log, a file, a JSON of megabytes) would
fill the window on its own. It is layered when it is appended: its whole text goes to the chunks
(C3), and the window's turn holds this view instead, within `limits.layered_view_tokens`:

    [tool result layered on arrival: 2,097,152 bytes, 524,301 tokens, text; the whole text is in
    3,412 chunks from chunk 5f0c…, one memory recall away; below: its values, head and tail]
    values: order_id: ORD-7H2K9; status: 200; …
    head:
    <the first lines>
    [… 2,080,512 bytes not shown …]
    tail:
    <the last lines>

The values are those of the result (`app.notes.values`, every JSON leaf walked), each after
its field name; of a text, lines of one shape (the same once their digits are dropped: the
lines of a log) are read up to `LINES_PER_SHAPE` of them, so a line unlike its neighbours (the
one order in a log of requests) is always read and a 2 MB log is not read whole.

A field with few distinct values in the result (an order's id, a status, a total) says more
about it than one repeated in every record of a list or every line of a log, so fields come by
how many distinct values they hold, fewest first (bare identifiers, with no field, and text with
spaces, a log line's rest, last); then the most identifying values (`identifying`), then in
order of appearance.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.tokens import count_tokens, cut_to_tokens, encoding
from app.notes.values import Value, identifying, parsed_json, render_values, result_values

LAYERED_PREFIX = "[tool result layered on arrival: "
# Every leaf of a JSON result is walked (a value deep inside is what the view is for); this only
# bounds a pathological one.
MAX_LEAVES = 1_000_000
HEAD_SHARE = 0.5  # of the tokens the header leaves; the tail gets a quarter, the values the rest
TAIL_SHARE = 0.25
MAX_VALUES_PER_FIELD = 5  # one field's values shown at most: the view holds many fields
FIELD_SAMPLE = 20  # the first values of a field among which its shown ones are chosen
# Lines of one shape whose values are read: more than FIELD_SAMPLE, so a field repeated on every
# line of a log still counts as one of many values.
LINES_PER_SHAPE = 2 * FIELD_SAMPLE
MAX_FIELD_WORDS = 3  # "flight number", "最终 金额"; not "INFO worker-0 handled request_id"
MAX_VALUE_WORDS = 4  # "975 Sunset Drive"; not the rest of a log line
# Characters read to cut a head or tail of n tokens: n * 8 (a token is rarely longer).
_CHARS_PER_TOKEN = 8
# A head ends at a line edge, a tail starts at one, when one is within this share of its end
# (start): whole lines read better than a line cut in two.
_LINE_SNAP = 0.3
_FRAMING_SLACK = 8  # tokens kept for the labels between the parts


@dataclass(frozen=True, slots=True)
class LayeredSource:
    """A huge tool result and where its whole text is stored."""

    text: str
    tokens: int  # what the result would cost in the prompt as sent
    chunk_id: str  # the chunk holding its start
    chunks: int  # how many chunks hold it


def _runs_on(value: Value) -> bool:
    """A pair read across a log line (a field of many words, or a value of many), not a value."""
    return len(value.key.split()) > MAX_FIELD_WORDS or len(value.value.split()) > MAX_VALUE_WORDS


def layered_values(values: Sequence[Value]) -> list[Value]:
    """The candidates of the view among a result's `values`, in the order it keeps them (module
    docstring): named fields before bare identifiers, values without spaces before those with,
    fields of fewer distinct values first, and at most `MAX_VALUES_PER_FIELD` of each, the most
    identifying of its first `FIELD_SAMPLE` values (a field of 30,000 request ids is ranked on
    a sample: ranking every value of a megabyte log takes seconds)."""
    by_field: dict[str, list[Value]] = {}
    for value in values:
        by_field.setdefault(value.key, []).append(value)
    fields = sorted(by_field, key=lambda key: (key == "", len(by_field[key])))
    ranked: list[Value] = []
    for bare in (False, True):
        for spaced in (False, True):
            for key in fields:
                if (key == "") != bare:
                    continue
                sample = [
                    v
                    for v in by_field[key][:FIELD_SAMPLE]
                    if any(c.isspace() for c in v.value) == spaced and not _runs_on(v)
                ]
                best = sorted(enumerate(sample), key=lambda nv: (-identifying(nv[1].value), nv[0]))
                ranked += [v for _, v in best[:MAX_VALUES_PER_FIELD]]
    return ranked


def sampled_lines(text: str) -> str:
    """`text` with only the first `LINES_PER_SHAPE` lines of each shape (module docstring)."""
    lines = text.split("\n")
    seen: dict[bytes, int] = {}
    kept: list[str] = []
    shapes = text.encode().translate(None, b"0123456789").split(b"\n")
    for line, shape in zip(lines, shapes, strict=True):
        count = seen.get(shape, 0)
        if count < LINES_PER_SHAPE:
            seen[shape] = count + 1
            kept.append(line)
    return text if len(kept) == len(lines) else "\n".join(kept)


def view_values(text: str) -> list[Value]:
    """The values a view chooses from: of every JSON leaf, or of the sampled lines."""
    if parsed_json(text) is not None:
        return result_values(text, max_leaves=MAX_LEAVES)
    return result_values(sampled_lines(text), max_leaves=MAX_LEAVES)


def head(text: str, max_tokens: int) -> str:
    """The start of `text` within `max_tokens`, ending at a line edge when one is near."""
    start = cut_to_tokens(text[: max_tokens * _CHARS_PER_TOKEN], max_tokens + 1, "")
    edge = start.rfind("\n")
    return start[: edge + 1] if edge >= len(start) * (1 - _LINE_SNAP) else start


def tail(text: str, max_tokens: int) -> str:
    """The end of `text` within `max_tokens`, starting at a line edge when one is near."""
    if max_tokens <= 0:
        return ""
    window = text[-max_tokens * _CHARS_PER_TOKEN :]
    tokens = encoding().encode(window, disallowed_special=())
    # A cut inside a multi-byte character decodes to U+FFFD: the partial character is dropped.
    end = window if len(tokens) <= max_tokens else encoding().decode(tokens[-max_tokens:])
    end = end.lstrip("\ufffd")
    edge = end.find("\n")
    return end[edge + 1 :] if 0 <= edge < len(end) * _LINE_SNAP else end


def _header(source: LayeredSource) -> str:
    shape = "JSON" if parsed_json(source.text) is not None else "text"
    pieces = "1 chunk" if source.chunks == 1 else f"{source.chunks:,} chunks from"
    return (
        f"{LAYERED_PREFIX}{len(source.text.encode()):,} bytes, {source.tokens:,} tokens, {shape}; "
        f"the whole text is in {pieces} chunk {source.chunk_id}, one memory recall away; "
        "below: its values, head and tail]"
    )


def _chosen(values: Sequence[Value], max_tokens: int) -> list[Value]:
    """The first of `values` whose rendering stays within `max_tokens` (estimated per value)."""
    chosen: list[Value] = []
    used = 0
    for value in values:
        cost = count_tokens(f"{value.key}: {value.value}; ")
        if used + cost > max_tokens:
            continue
        chosen.append(value)
        used += cost
    return chosen


def _render(header: str, values: Sequence[Value], first: str, last: str, omitted: int) -> str:
    lines = [header]
    if values:
        lines.append(f"values: {render_values(values)}")
    lines += ["head:", first.rstrip("\n"), f"[… {omitted:,} bytes not shown …]", "tail:", last]
    return "\n".join(lines)


def layered_view(source: LayeredSource, view_tokens: int) -> str:
    """The view the window holds of `source` (module docstring), within `view_tokens`."""
    text = source.text
    header = _header(source)
    room = max(0, view_tokens - count_tokens(header) - _FRAMING_SLACK)
    first = head(text, int(room * HEAD_SHARE))
    rest = text[len(first) :]
    last = tail(rest, int(room * TAIL_SHARE))
    omitted = len(rest.encode()) - len(last.encode())
    values_room = room - count_tokens(first) - count_tokens(last)
    values = view_values(text)
    chosen = _chosen(layered_values(values), values_room)
    while True:
        kept = set(chosen)
        # Shown in the result's own order.
        view = _render(header, [v for v in values if v in kept], first, last, omitted)
        if not chosen or count_tokens(view) <= view_tokens:
            return view
        chosen = chosen[: len(chosen) * 3 // 4]  # the estimate was short: the last ranked go
