"""LoCoMo evidence-recall evaluation (spec §8, shared/eval/README.md).

Pure parts (no I/O): loading a LoCoMo file, evidence-id normalisation, the seq ↔ dia_id mapping,
the metrics, and the offline baselines (plain BM25 over single turns, truncation). The driver
(`app.eval.driver.run_locomo`) talks to a *running* contextd over HTTP only.

Metric definitions (categories 1-4 make "overall"; category 5 is adversarial and excluded):
- evidence recall @B: fraction of a question's evidence dia_ids that are in the prompt built with an
  injected-recall budget of B tokens — covered by an included recalled item (its turn range) or
  already in the C1 window (those turns are in the prompt verbatim, and recall drops them by
  design). The window share is also reported on its own, and a "recalled only" variant.
- Recall@k: fraction of evidence dia_ids covered by the first k recalled items in rank order,
  regardless of budget (read from a build with a very large budget and context limit).
- injected tokens per query: `usage.recall` of the build (framing included).
Each question's figures are averaged (macro over questions), as in the LoCoMo paper.
"""

import json
import re
import statistics
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.domain.records import RecalledItem
from app.domain.text import terms
from app.domain.tokens import count_tokens, message_tokens
from app.prompt.blocks import counted_item, render_recalled_block
from app.recall.bm25 import BM25Index

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SCORED_CATEGORIES = (1, 2, 3, 4)
_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE_RE = re.compile(r"D:?(\d+):0*(\d+)")
# Fallback flags that mean a degraded build (the others describe budget decisions).
DEGRADED_FLAGS = frozenset(
    {
        "vector_unavailable",
        "vector_timeout",
        "recall_unavailable",
        "rerank_unavailable",
        "cross_encoder_unavailable",
        "cache_bypass",
        "emergency_offload_failed",
        "rewrite_unavailable",
    }
)
RANKING_LIMIT = 1_000_000  # context limit and budget of the build that reads the full ranking


# ---------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    date: str
    image_caption: str | None = None

    @property
    def content(self) -> str:
        body = f"{self.speaker}: {self.text}"
        if self.image_caption:
            body += f" [image: {self.image_caption}]"
        return body


@dataclass(frozen=True, slots=True)
class Question:
    question: str
    category: int
    evidence: tuple[str, ...]  # normalised, existing dia_ids
    raw_evidence: tuple[str, ...]
    dropped: tuple[str, ...]  # evidence parts that could not be mapped to a turn
    answer: str = ""  # the gold answer (category 5 has none: its `adversarial_answer` is a trap)


@dataclass(frozen=True, slots=True)
class Conversation:
    sample_id: str
    speaker_a: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]


def normalise_evidence(raw: Iterable[str], known: Iterable[str]) -> tuple[list[str], list[str]]:
    """Map LoCoMo evidence strings to existing dia_ids; return (ids, dropped parts).

    Each string may hold several ids joined by `;`, `,` or spaces ('D8:6; D9:17'); an id may carry
    a stray colon after D ('D:11:26' → 'D11:26') or a zero-padded turn ('D30:05' → 'D30:5').
    Anything that does not parse ('D'), or names a turn that does not exist, is dropped; duplicates
    are kept once, in order.
    """
    known_ids = set(known)
    ids: list[str] = []
    dropped: list[str] = []
    for entry in raw:
        for part in re.split(r"[;,\s]+", str(entry).strip()):
            if not part:
                continue
            match = _EVIDENCE_RE.fullmatch(part)
            dia_id = f"D{int(match.group(1))}:{int(match.group(2))}" if match else None
            if dia_id is None or dia_id not in known_ids:
                dropped.append(part)
            elif dia_id not in ids:
                ids.append(dia_id)
    return ids, dropped


def parse_conversation(sample: Mapping[str, Any]) -> Conversation:
    conv = sample["conversation"]
    numbers = sorted(
        int(m.group(1)) for key in conv if (m := _SESSION_KEY.fullmatch(key)) is not None
    )
    turns: list[Turn] = []
    for n in numbers:
        date = str(conv.get(f"session_{n}_date_time", ""))
        for t in conv[f"session_{n}"]:
            turns.append(
                Turn(
                    dia_id=str(t["dia_id"]),
                    session=n,
                    speaker=str(t["speaker"]),
                    text=str(t.get("text", "")),
                    date=date,
                    image_caption=t.get("blip_caption") or None,
                )
            )
    known = [t.dia_id for t in turns]
    questions = []
    for qa in sample.get("qa", []):
        raw = tuple(str(e) for e in qa.get("evidence", []))
        ids, dropped = normalise_evidence(raw, known)
        questions.append(
            Question(
                question=str(qa["question"]),
                category=int(qa["category"]),
                evidence=tuple(ids),
                raw_evidence=raw,
                dropped=tuple(dropped),
                answer=str(qa.get("answer", "")),
            )
        )
    return Conversation(
        sample_id=str(sample.get("sample_id", "")),
        speaker_a=str(conv.get("speaker_a", "")),
        turns=tuple(turns),
        questions=tuple(questions),
    )


def load_locomo(path: str | Path, limit: int | None = None) -> list[Conversation]:
    samples = json.loads(Path(path).read_text())
    if limit is not None:
        samples = samples[:limit]
    return [parse_conversation(s) for s in samples]


def dia_ids_of_range(first: int, last: int, seq_to_dia: Mapping[int, str]) -> set[str]:
    """dia_ids of the turns with seq in first..last (seqs not ingested by us are ignored)."""
    return {seq_to_dia[s] for s in range(first, last + 1) if s in seq_to_dia}


# ---------------------------------------------------------------- metrics


def coverage(evidence: Sequence[str], covered: set[str]) -> float:
    return sum(1 for e in evidence if e in covered) / len(evidence) if evidence else 0.0


def recall_at_k(evidence: Sequence[str], ranked: Sequence[set[str]], k: int) -> float:
    """Fraction of evidence covered by the first k ranked units (each a set of dia_ids)."""
    covered: set[str] = set().union(*ranked[:k]) if ranked[:k] else set()
    return coverage(evidence, covered)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class QuestionResult:
    """One question's figures for one method (recall values in [0, 1])."""

    sample_id: str
    category: int
    evidence: int
    budget_recall: dict[int, float] = field(default_factory=dict)
    budget_recall_recalled_only: dict[int, float] = field(default_factory=dict)
    injected: dict[int, int] = field(default_factory=dict)
    at_k: dict[int, float] = field(default_factory=dict)
    in_window: float = 0.0  # share of evidence already in the C1 window


def summarise(
    results: Sequence[QuestionResult], budgets: Sequence[int], ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    """Mean figures per category name and 'overall' (categories 1-4), plus counts."""
    groups: dict[str, list[QuestionResult]] = {}
    for r in results:
        groups.setdefault(CATEGORIES.get(r.category, str(r.category)), []).append(r)
    groups["overall"] = [r for r in results if r.category in SCORED_CATEGORIES]
    table: dict[str, dict[str, float]] = {}
    for name, rows in groups.items():
        if not rows:
            continue
        row: dict[str, float] = {"n": float(len(rows))}
        for b in budgets:
            if all(b in r.budget_recall for r in rows):
                row[f"B{b}"] = statistics.fmean(r.budget_recall[b] for r in rows)
            if all(b in r.budget_recall_recalled_only for r in rows):
                row[f"B{b}_recalled"] = statistics.fmean(
                    r.budget_recall_recalled_only[b] for r in rows
                )
            if all(b in r.injected for r in rows):
                row[f"tokens{b}"] = statistics.fmean(r.injected[b] for r in rows)
        for k in ks:
            if all(k in r.at_k for r in rows):
                row[f"R@{k}"] = statistics.fmean(r.at_k[k] for r in rows)
        row["in_window"] = statistics.fmean(r.in_window for r in rows)
        table[name] = row
    return table


# ---------------------------------------------------------------- offline baselines

_FAKE_TS = datetime(2023, 1, 1, tzinfo=UTC)


def _framed_item(i: int, turn: Turn) -> RecalledItem:
    # A uuid-length id and a turn range like contextd's headers, for the framed variant.
    return RecalledItem(
        chunk_id=str(uuid.UUID(int=i)), text=turn.content, ts=_FAKE_TS, turn_first=i, turn_last=i
    )


def fill_budget(
    ranked: Sequence[int],
    costs: Sequence[int],
    budget: int,
) -> list[int]:
    """Units in rank order while their summed cost stays within budget (a unit that does not fit
    is skipped and the next one tried — the assembler's policy)."""
    chosen: list[int] = []
    used = 0
    for i in ranked:
        if used + costs[i] <= budget:
            chosen.append(i)
            used += costs[i]
    return chosen


def fill_budget_framed(
    ranked: Sequence[int], turns: Sequence[Turn], budget: int, per_item_max_tokens: int
) -> tuple[list[int], int]:
    """Like the assembler: the whole recalled block (frame, headers) must fit within budget."""
    chosen: list[RecalledItem] = []
    picked: list[int] = []
    used = 0
    for i in ranked:
        item = _framed_item(i, turns[i])
        if used + counted_item(item, per_item_max_tokens)[1] > budget:
            continue
        cost = message_tokens("system", render_recalled_block([*chosen, item], per_item_max_tokens))
        if cost <= budget:
            chosen.append(item)
            picked.append(i)
            used = cost
    return picked, used


def bm25_baseline(
    conv: Conversation,
    budgets: Sequence[int],
    ks: Sequence[int],
    *,
    framed: bool = False,
    per_item_max_tokens: int = 300,
) -> list[QuestionResult]:
    """Plain BM25 (k1 1.2, b .75, `terms()`: lower-cased words, English stopwords) over single
    turns of the whole conversation. Cost of a turn: its content's tokens (the README's offline
    setting), or with `framed` the tokens it adds to a contextd-style recalled block."""
    index = BM25Index([(str(i), terms(t.content)) for i, t in enumerate(conv.turns)])
    costs = [count_tokens(t.content) for t in conv.turns]
    dia = [t.dia_id for t in conv.turns]
    out: list[QuestionResult] = []
    for q in conv.questions:
        if not q.evidence:
            continue
        ranked = [int(doc) for doc, _ in index.score(terms(q.question))]
        r = QuestionResult(conv.sample_id, q.category, len(q.evidence))
        for b in budgets:
            if framed:
                chosen, used = fill_budget_framed(ranked, conv.turns, b, per_item_max_tokens)
            else:
                chosen = fill_budget(ranked, costs, b)
                used = sum(costs[i] for i in chosen)
            covered = {dia[i] for i in chosen}
            r.budget_recall[b] = coverage(q.evidence, covered)
            r.budget_recall_recalled_only[b] = r.budget_recall[b]
            r.injected[b] = used
        units = [{dia[i]} for i in ranked]
        for k in ks:
            r.at_k[k] = recall_at_k(q.evidence, units, k)
        out.append(r)
    return out


def truncation_baseline(conv: Conversation, window_tokens: int) -> list[QuestionResult]:
    """Keep only the last turns whose message tokens fit in `window_tokens` (no recall)."""
    kept: set[str] = set()
    used = 0
    for t in reversed(conv.turns):
        cost = message_tokens("user", t.content)
        if used + cost > window_tokens:
            break
        kept.add(t.dia_id)
        used += cost
    out = []
    for q in conv.questions:
        if not q.evidence:
            continue
        r = QuestionResult(conv.sample_id, q.category, len(q.evidence))
        r.in_window = coverage(q.evidence, kept)
        r.budget_recall[0] = r.in_window
        r.injected[0] = used
        out.append(r)
    return out
