"""Default deterministic reranker and the final top-k-within-budget selection.

`feature_rerank` is used when no cross-encoder is configured (and its order is what a failed
cross-encoder falls back from). score = Σ weight · feature, every feature in [0, 1]:

- fused    (`FUSED_WEIGHT` 1.0): fused score / best fused score. The retrieval evidence; the
  scale every other weight is set against.
- rank     (`RANK_WEIGHT` 0.463): 1 / √(fused rank). Where the fused score is flat (many
  candidates near the best), the order the arms agreed on still counts.
- adjacent (`ADJACENT_WEIGHT` 0.706): the better `fused` of the candidates whose turns end just
  before or start just after this one's (0 without turns). Evidence often sits next to the best
  hit: a stretch of conversation about the question ranks up together.
- coverage (`COVERAGE_WEIGHT` 0.281): share of the query's term stems in the text, each weighted
  by its IDF over the candidates (a stem most candidates hold counts little). Stems compare
  English inflections alike; CJK terms are their own stems, so both languages count the same way.
- exact    (`EXACT_WEIGHT` 6.0): share of the query's IDs and quoted strings found verbatim
  (case-insensitive) in the text (a tool result's with the text of its call); an identifier of
  code weighs by its rarity among the candidates (`_key_weights`), any other key 1. 6.0 exceeds the
  sum of all other weights (3.24), so a candidate containing every exact key outranks any
  candidate containing none: an order number or a quoted phrase found verbatim is almost
  certainly the turn asked about.
- entity   (`ENTITY_WEIGHT` 0.471): share of the query's names and numbers found verbatim.
- cjk      (`CJK_WEIGHT` 0.3): share of the query's CJK bigrams present in the text. Chinese words
  are mostly two characters; this restores word matching that unigram-heavy lexical scores blur.
- recency  (`RECENCY_WEIGHT` 0.015, half-life `RECENCY_HALF_LIFE_TURNS`): 0.5 ** (age / half-life).
  Small on purpose: only a tiebreak between equally relevant fragments, preferring the newer
  (more likely still valid) one.

The fused, rank, adjacent, coverage and entity weights were fitted together on the
LoCoMo tune split (conversations 0-3) by pairwise logistic regression (each evidence chunk
against every other candidate of its question), then checked on the packed budgets through the
assembler (docs/BENCHMARKS.md, tuning decisions: "Rerank fitted for what the budget packs");
fitted again once the chunk arm searched with the query adapter (`app.recall.adapter`; the
recency weight held, in proportion, where it was), which trusts the fused score more than before.

Pure: no I/O, no settings.
"""

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Literal

from app.domain.text import mostly_cjk, term_set
from app.domain.tokens import count_tokens
from app.recall.bm25 import idf
from app.recall.rewrite import RewrittenQuery, is_code_identifier
from app.recall.trim import line_stems

FUSED_WEIGHT = 1.0
RANK_WEIGHT = 0.463
ADJACENT_WEIGHT = 0.706
COVERAGE_WEIGHT = 0.281
EXACT_WEIGHT = 6.0
ENTITY_WEIGHT = 0.471
CJK_WEIGHT = 0.3
RECENCY_WEIGHT = 0.015
RECENCY_HALF_LIFE_TURNS = 50.0
DEFAULT_TOP_K = 5
# Reciprocal rank fusion of the feature order and the cross-encoder's (`cross_encoded`): set on
# the LoCoMo tune split (docs/BENCHMARKS.md, "A stronger ranking model").
CROSS_ENCODER_RRF_K = 5
CROSS_ENCODER_QUESTION_TOKENS = 64  # LoCoMo's longest question is 27 tokens

_CJK_RUN_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+")

DropReason = Literal["in_window", "duplicate", "near_duplicate", "over_budget", "below_k"]


@dataclass(frozen=True, slots=True)
class RerankCandidate:
    id: str
    text: str
    fused_score: float
    fused_rank: int
    turn_last: int
    turn_first: int | None = None  # None: the candidate covers turn_last only
    ranged: bool = True  # False: no turns (a remembered item), never adjacent to a candidate
    # A tool result's: the text of the call it answers, whose keys count as the result's (the
    # call names the file or record the result holds).
    call_text: str = ""

    @property
    def turn_range(self) -> tuple[int, int]:
        first = self.turn_last if self.turn_first is None else self.turn_first
        return (min(first, self.turn_last), max(first, self.turn_last))


@dataclass(frozen=True, slots=True)
class RerankFeatures:
    fused: float
    exact: float
    entity: float
    cjk: float
    recency: float
    rank: float = 0.0
    adjacent: float = 0.0
    coverage: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ScoredCandidate:
    candidate: RerankCandidate
    score: float
    features: RerankFeatures

    @property
    def id(self) -> str:
        return self.candidate.id


@dataclass(frozen=True, slots=True)
class Selection:
    """The chosen candidates (best first) and, in rank order, every one left out and why."""

    selected: list[ScoredCandidate] = field(default_factory=list)
    dropped: list[tuple[ScoredCandidate, DropReason]] = field(default_factory=list)
    tokens: int = 0


def _key_pattern(key: str) -> Callable[[str], bool]:
    """Case-insensitive verbatim match; Latin/digit keys must not sit inside a longer word or
    identifier (SECRET_CONST_3 is not in SECRET_CONST_30 nor MY_SECRET_CONST_3).

    The word-boundary regex runs only on a text that holds the key as a substring (one C-level
    scan): most candidates hold none of the query's keys."""
    needle = key.casefold()
    if _CJK_RUN_RE.search(needle):
        return lambda text: needle in text
    rx = re.compile(rf"(?<![0-9a-z_]){re.escape(needle)}(?![0-9a-z_])")
    return lambda text: needle in text and rx.search(text) is not None


def _matchers(keys: Sequence[str]) -> list[list[Callable[[str], bool]]]:
    """Per key, its accepted forms: "#4521" also matches a bare 4521."""
    out: list[list[Callable[[str], bool]]] = []
    for key in keys:
        variants = [key, key[1:]] if key.startswith("#") and len(key) > 1 else [key]
        out.append([_key_pattern(v) for v in variants])
    return out


def _found(matchers: Sequence[Sequence[Callable[[str], bool]]], folded_text: str) -> list[bool]:
    return [any(match(folded_text) for match in forms) for forms in matchers]


def _share_found(matchers: Sequence[Sequence[Callable[[str], bool]]], folded_text: str) -> float:
    if not matchers:
        return 0.0
    found = 0
    for forms in matchers:  # a loop, not `_found`: once per candidate of every build
        for match in forms:
            if match(folded_text):
                found += 1
                break
    return found / len(matchers)


def _key_weights(keys: Sequence[str], found: Sequence[Sequence[bool]]) -> list[float]:
    """Per exact key, its weight in the `exact` share: 1, or for an identifier of code its
    IDF over the candidates (`found`: per candidate, per key) relative to a key one candidate
    holds, at most 1. An order number or a quoted phrase names one thing; an identifier
    recurs across a codebase (`SECRET_CONST_3` in every module, `client.charge` in every step),
    and of two the query names the rarer tells the candidates apart (`billing/mod3.py`)."""
    n = len(found)
    weights: list[float] = []
    for k, key in enumerate(keys):
        if not is_code_identifier(key) or n < 2:
            weights.append(1.0)
            continue
        df = sum(1 for held in found if held[k])
        weights.append(min(1.0, idf(n, df) / idf(n, 1)))
    return weights


def cjk_bigrams(text: str) -> set[str]:
    return {run[i : i + 2] for run in _CJK_RUN_RE.findall(text) for i in range(len(run) - 1)}


def recency(turn_last: int, now_seq: int, half_life: float = RECENCY_HALF_LIFE_TURNS) -> float:
    age = max(0, now_seq - turn_last)
    return float(0.5 ** (age / half_life)) if half_life > 0 else 0.0


def _adjacent_fused(candidates: Sequence[RerankCandidate], fused: Sequence[float]) -> list[float]:
    """Per candidate, the better `fused` of the candidates whose turns end just before or start
    just after its own (0 when none does; candidates without turns have no neighbours)."""
    ends: dict[int, float] = {}
    starts: dict[int, float] = {}
    for cand, value in zip(candidates, fused, strict=True):
        if cand.ranged:
            first, last = cand.turn_range
            ends[last] = max(ends.get(last, 0.0), value)
            starts[first] = max(starts.get(first, 0.0), value)
    out: list[float] = []
    for cand in candidates:
        if not cand.ranged:
            out.append(0.0)
            continue
        first, last = cand.turn_range
        out.append(max(ends.get(first - 1, 0.0), starts.get(last + 1, 0.0)))
    return out


def _coverage(query: str, texts: Sequence[str]) -> list[float]:
    """Per text, the share of the query's term stems it holds, each stem weighted by its IDF
    over `texts`."""
    wanted = line_stems(query)
    if not wanted:
        return [0.0] * len(texts)
    found = [line_stems(text) & wanted for text in texts]
    df = {stem: sum(1 for held in found if stem in held) for stem in wanted}
    weight = {stem: idf(len(texts), df[stem]) for stem in wanted}
    total = sum(weight.values())
    return [sum(weight[stem] for stem in held) / total for held in found]


def feature_rerank(
    query: RewrittenQuery,
    candidates: Sequence[RerankCandidate],
    now_seq: int,
    *,
    fused_weight: float = FUSED_WEIGHT,
    rank_weight: float = RANK_WEIGHT,
    adjacent_weight: float = ADJACENT_WEIGHT,
    coverage_weight: float = COVERAGE_WEIGHT,
    exact_weight: float = EXACT_WEIGHT,
    entity_weight: float = ENTITY_WEIGHT,
    cjk_weight: float = CJK_WEIGHT,
    recency_weight: float = RECENCY_WEIGHT,
    half_life_turns: float = RECENCY_HALF_LIFE_TURNS,
) -> list[ScoredCandidate]:
    """Score candidates by the weighted features of the module docstring; best first.

    Ties keep fused order (fused_rank, then input order).
    """
    keys = [*query.ids, *query.quoted]
    exact_keys = _matchers(keys)
    entity_keys = _matchers([*query.entities, *query.numbers])
    query_bigrams = cjk_bigrams(query.rewritten)
    top_fused = max((c.fused_score for c in candidates), default=0.0)
    fused = [c.fused_score / top_fused if top_fused > 0 else 0.0 for c in candidates]
    adjacent = _adjacent_fused(candidates, fused)
    coverage = _coverage(query.raw, [c.text for c in candidates])
    folded = [c.text.casefold() for c in candidates]
    keyed = [
        f"{c.call_text.casefold()}\n{text}" if c.call_text else text
        for c, text in zip(candidates, folded, strict=True)
    ]
    # Most queries hold no exact key: nothing to look for then.
    found = [_found(exact_keys, text) for text in keyed] if exact_keys else []
    key_weights = _key_weights(keys, found)
    all_keys = sum(key_weights)
    scored: list[tuple[tuple[float, int, int], ScoredCandidate]] = []
    for position, cand in enumerate(candidates):
        features = RerankFeatures(
            fused=fused[position],
            exact=(
                sum(w for w, h in zip(key_weights, found[position], strict=True) if h) / all_keys
                if all_keys > 0
                else 0.0
            ),
            entity=_share_found(entity_keys, keyed[position]),
            cjk=(
                len(query_bigrams & cjk_bigrams(cand.text)) / len(query_bigrams)
                if query_bigrams
                else 0.0
            ),
            recency=recency(cand.turn_last, now_seq, half_life_turns),
            rank=1 / math.sqrt(max(1, cand.fused_rank)),
            adjacent=adjacent[position],
            coverage=coverage[position],
        )
        score = (
            fused_weight * features.fused
            + rank_weight * features.rank
            + adjacent_weight * features.adjacent
            + coverage_weight * features.coverage
            + exact_weight * features.exact
            + entity_weight * features.entity
            + cjk_weight * features.cjk
            + recency_weight * features.recency
        )
        item = ScoredCandidate(candidate=cand, score=score, features=features)
        scored.append(((-score, cand.fused_rank, position), item))
    scored.sort(key=lambda pair: pair[0])
    return [item for _, item in scored]


def cross_encoder_asked(query: RewrittenQuery, leading: Sequence[ScoredCandidate]) -> bool:
    """Whether the English cross-encoder may re-order `leading`. Only for a question as it was
    trained on (MS MARCO's search queries): one line of at most `CROSS_ENCODER_QUESTION_TOKENS`,
    not a conversation pasted as the query (MADial's dialogues lose by it: en check R@5 .593 ->
    .559); not for a question holding an ID or a quoted string (the exact feature already put
    what holds it first); not when the question or one of `leading` is written in Chinese (the
    model reads English only)."""
    raw = query.raw.strip()
    if "\n" in raw or count_tokens(raw) > CROSS_ENCODER_QUESTION_TOKENS:
        return False
    if query.ids or query.quoted or mostly_cjk(raw):
        return False
    return bool(leading) and not any(mostly_cjk(s.candidate.text) for s in leading)


def cross_encoded(
    scored: Sequence[ScoredCandidate], cross_scores: Sequence[float]
) -> list[ScoredCandidate]:
    """The first `len(cross_scores)` of `scored` re-ordered by their feature rank and the
    cross-encoder's rank together (reciprocal rank fusion, `CROSS_ENCODER_RRF_K`, equal weights;
    a tie keeps the feature order), the rest after them as they were. Each re-ordered one's score
    becomes its fused reciprocal rank, so the scores still fall down the list."""
    leading = list(scored[: len(cross_scores)])
    by_cross = sorted(range(len(leading)), key=lambda i: (-cross_scores[i], i))
    cross_rank = {i: rank for rank, i in enumerate(by_cross)}
    fused = [
        1 / (CROSS_ENCODER_RRF_K + i) + 1 / (CROSS_ENCODER_RRF_K + cross_rank[i])
        for i in range(len(leading))
    ]
    order = sorted(range(len(leading)), key=lambda i: (-fused[i], i))
    reordered = [replace(leading[i], score=fused[i]) for i in order]
    return [*reordered, *scored[len(leading) :]]


def _in_window(turn_range: tuple[int, int], window_seqs: Collection[int]) -> bool:
    first, last = turn_range
    return bool(window_seqs) and all(seq in window_seqs for seq in range(first, last + 1))


def text_key(text: str) -> str:
    """What two candidates share when their texts are duplicates: the text with its whitespace
    collapsed, case-folded."""
    return " ".join(text.split()).casefold()


# A candidate of which less than a tenth of the words are new against one chosen item, and none
# of them a number, says the same again (phatic turns: "Wow, amazing!", "Bye, take care"). Set
# from first principles, not tuned: a changed value ("900 EUR" → "1200 EUR") or one changed word
# in a short text ("window seats" → "aisle seats") keeps an item.
NEAR_DUPLICATE_SHARE = 0.9

# A candidate's words (`term_set`, ~20-30 µs for a chunk); chunks recur from build to build, so
# once per text. ~3.5 KB an entry (text and set): at most ~3.5 MB a process.
word_set = lru_cache(maxsize=1024)(term_set)


def repeats(
    words: frozenset[str], chosen: Iterable[frozenset[str]], chosen_union: frozenset[str]
) -> bool:
    """Whether an item of `words` says again what one of the `chosen` items' words say: more
    than `NEAR_DUPLICATE_SHARE` of its words are that item's, and the rest hold no digit.
    `chosen_union` (all of `chosen`'s words) settles most items in one step: what has too many
    words none of them holds cannot be in one of them."""
    if not words or len(words & chosen_union) <= NEAR_DUPLICATE_SHARE * len(words):
        return False
    for kept in chosen:
        new = words - kept
        if len(words) - len(new) > NEAR_DUPLICATE_SHARE * len(words) and not any(
            ch.isdigit() for word in new for ch in word
        ):
            return True
    return False


@dataclass
class _Kept:
    """What the candidates `select_within_budget` kept so far cover."""

    groups: set[str] = field(default_factory=set)
    texts: set[str] = field(default_factory=set)
    # For each turn a kept candidate covers, the furthest last turn of the kept ranges holding it:
    # a range lies inside a kept one exactly when the kept ranges holding its first turn reach
    # its last (one lookup instead of a pass over every kept range).
    reach: dict[int, int] = field(default_factory=dict)
    words: list[frozenset[str]] = field(default_factory=list)
    union: frozenset[str] = frozenset()

    def duplicates(
        self, turns: tuple[int, int], group: str | None, ranged: bool, key: str, keyed: bool
    ) -> bool:
        """Whether a kept candidate covers the content of a candidate of `turns` (first, last):
        its `group`'s, its range (when `ranged`), its text (`key`); a `keyed` piece of a split
        turn only by its text."""
        first, last = turns
        # Pieces of one split turn (grouped) share a turn range but hold different text: they are
        # deduplicated by group, not by range. Candidates without turns (remembered items) skip it.
        range_dup = group is None and ranged and self.reach.get(first, first - 1) >= last
        same_turn = (group is not None and group in self.groups) or range_dup
        return (same_turn and not keyed) or key in self.texts

    def repeated(self, text: str) -> bool:
        """Whether `text` `repeats` a kept candidate; if not, its words count as kept."""
        words = word_set(text)
        if repeats(words, self.words, self.union):
            return True
        self.words.append(words)
        self.union |= words
        return False

    def add(self, turns: tuple[int, int], group: str | None, ranged: bool, key: str) -> None:
        self.texts.add(key)
        if group is None and ranged:
            first, last = turns
            for seq in range(first, last + 1):
                if self.reach.get(seq, last - 1) < last:
                    self.reach[seq] = last
        if group is not None:
            self.groups.add(group)


def select_within_budget(
    scored: Sequence[ScoredCandidate],
    k: int = DEFAULT_TOP_K,
    budget_tokens: int | None = None,
    token_counts: Mapping[str, int] | None = None,
    *,
    window_seqs: Collection[int] = frozenset(),
    overlap_groups: Mapping[str, str] | None = None,
    rangeless: Collection[str] = frozenset(),
    text_keys: Mapping[str, str] | None = None,
    near_duplicates: bool = False,
    keyed_pieces: Collection[str] = frozenset(),
) -> Selection:
    """Take the best `k` candidates whose tokens fit `budget_tokens` together (None: no budget).

    Walking `scored` in order, a candidate is dropped as
    - "in_window": its whole turn range is already in C1 (`window_seqs`: seqs of the C1 turns);
    - "duplicate": a kept candidate covers the same content: same `overlap_groups` key (e.g. the
      pieces of one split turn), same normalised text, or a turn range inside a kept one's
      (ids in `rangeless`, e.g. remembered items, have no turns and skip the range checks);
    - "below_k": k candidates are already kept;
    - "over_budget": it does not fit the tokens left; smaller ones further down are still tried;
    - "near_duplicate" (with `near_duplicates`): it fits, but `repeats` a kept candidate.
    `keyed_pieces`: pieces of split turns that hold one of the query's exact keys; each is kept
    beside the other pieces of its turn (a long file's pieces hold different lines: the one
    that uses `SECRET_CONST_3` and the one that defines it), unless its text is the same.
    Tokens come from `token_counts` (what injecting the fragment costs, framing included), else
    `count_tokens(text)`; without a budget nothing is counted (`tokens` stays 0).
    `text_keys`: candidates' `text_key` by id, where the caller keeps them (a ~700-character
    text's key costs ~6 µs; others are worked out here).
    """
    keys = text_keys or {}
    groups = overlap_groups or {}
    selected: list[ScoredCandidate] = []
    dropped: list[tuple[ScoredCandidate, DropReason]] = []
    used = 0
    kept = _Kept()
    for item in scored:
        cand = item.candidate
        turns = cand.turn_range
        group = groups.get(cand.id)
        ranged = cand.id not in rangeless
        if ranged and _in_window(turns, window_seqs):
            dropped.append((item, "in_window"))
            continue
        duplicate_key = keys.get(cand.id) or text_key(cand.text)
        if kept.duplicates(turns, group, ranged, duplicate_key, cand.id in keyed_pieces):
            dropped.append((item, "duplicate"))
            continue
        if len(selected) >= k:
            dropped.append((item, "below_k"))
            continue
        cost = 0
        if budget_tokens is not None:
            known = token_counts.get(cand.id) if token_counts else None
            cost = count_tokens(cand.text) if known is None else known
            if used + cost > budget_tokens:
                dropped.append((item, "over_budget"))
                continue
        if near_duplicates and kept.repeated(cand.text):
            dropped.append((item, "near_duplicate"))
            continue
        selected.append(item)
        used += cost
        kept.add(turns, group, ranged, duplicate_key)
    return Selection(selected=selected, dropped=dropped, tokens=used)
