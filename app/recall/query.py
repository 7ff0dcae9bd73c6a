"""What recall searches with, worked out from the query's text alone: its weighted BM25 terms,
the rule rewrite, and the text to embed (the query, its last lines, the asker's lines). Pure: no
I/O."""

import re
from collections.abc import Sequence
from datetime import datetime

from app.domain.dates import query_date_terms
from app.domain.text import terms
from app.recall.rewrite import RewrittenQuery, content_term_count, rewrite_query

# Terms the rewrite borrowed from recent turns help resolve "that one", but must not outweigh what
# the user actually asked (recent small talk would otherwise drown the question).
BORROWED_TERM_WEIGHT = 0.25


def weighted_terms(
    query: str, rewritten: RewrittenQuery, llm_query: str | None = None
) -> dict[str, float]:
    """BM25 query weights: the user's own terms at 1 each, borrowed context terms (the rule
    rewrite's, then those the LLM rewrite added) at a quarter."""
    weights: dict[str, float] = {}
    for term in terms(query):
        weights[term] = weights.get(term, 0.0) + 1.0
    for term in terms(" ".join(rewritten.appended)):
        if term not in weights or weights[term] < 1.0:
            weights[term] = weights.get(term, 0.0) + BORROWED_TERM_WEIGHT
    for term in terms(llm_query or ""):
        weights.setdefault(term, BORROWED_TERM_WEIGHT)
    return weights


MIN_OWN_TERMS_TO_EMBED = 2


def own_words_suffice(query: str) -> bool:
    """Whether the user's words mean enough on their own to be embedded as they are."""
    return content_term_count(query) >= MIN_OWN_TERMS_TO_EMBED


def embedding_query(query: str, rewritten: RewrittenQuery) -> str:
    """What to embed: the user's words, unless they are too few to mean anything on their own
    ("and that one?"), then the rewrite with its borrowed context."""
    return query if own_words_suffice(query) else rewritten.rewritten


def rule_rewrite(
    query: str, recent_turns: Sequence[str], now: datetime
) -> tuple[RewrittenQuery, dict[str, float], list[str]]:
    """The rule rewrite, its weighted terms and the query's date terms (CPU only: run off the
    event loop for long text)."""
    rewritten = rewrite_query(query, recent_turns)
    return rewritten, weighted_terms(query, rewritten), query_date_terms(query, now)


# A query of several lines (a stretch of dialogue, say) is embedded by its last lines: what was
# said last is what the question is about, and encoding costs ~0.8 ms a token, so also embedding
# the whole dialogue (up to the model's 512 tokens) took longer than the 0.7 s query budget on a
# busy machine and left recall lexical only (MADial zh through the API: R@5 .533 instead of .612).
# MADial offline, BM25 + e5 fused as recall does, R@5 tune split (check split): whole + last 3
# lines zh .658 (.562), en .636 (.547); last 3 lines only zh .648 (.567), en .658 (.542); last 2
# lines zh .625, en .623; last 4 lines zh .631, en .595.
QUERY_TAIL_LINES = 3
# "Name: text" (a transcript line): a short label before a colon, then the words said.
_SPEAKER_LINE_RE = re.compile(r"^\s*(?P<speaker>[^:：\n]{1,40}?)\s*[:：]\s*\S")


def query_view(query: str) -> str:
    """What to embed for `query`: itself, or its last `QUERY_TAIL_LINES` lines when longer."""
    lines = [line for line in query.splitlines() if line.strip()]
    if len(lines) <= QUERY_TAIL_LINES:
        return query
    return "\n".join(lines[-QUERY_TAIL_LINES:])


def asker_view(query: str) -> str | None:
    """For a transcript longer than `QUERY_TAIL_LINES` lines (every line "Name: text"), the lines
    of its last line's speaker: what the asker said across the whole dialogue, which the last
    lines alone often miss (the topic was set at the start). None for any other query. MADial
    offline, R@5 tune / check, the two views' similarities averaged against the last lines
    alone: zh .656 / .552 -> .663 / .606, en .673 / .570 -> .678 / .592."""
    lines = [line for line in query.splitlines() if line.strip()]
    if len(lines) <= QUERY_TAIL_LINES:
        return None
    speakers = [
        m.group("speaker") if (m := _SPEAKER_LINE_RE.match(line)) else None for line in lines
    ]
    if None in speakers or len(set(speakers)) < 2:
        return None
    return "\n".join(line for line, who in zip(lines, speakers, strict=True) if who == speakers[-1])


def query_views(query: str) -> list[str]:
    """The texts embedded for `query` (their embeddings averaged): `query_view`, and the
    `asker_view` when there is one."""
    asker = asker_view(query)
    return [query_view(query)] + ([asker] if asker is not None else [])
