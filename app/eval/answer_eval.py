"""One LoCoMo question's answer and ablation, from the build the driver made at the answer budget
(`--answer-llm`, `--ablate`): the answering model and judges of `app.eval.answering`, the
fragments and their removal of `app.eval.ablation`."""

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.eval.ablation import (
    RECALLED_ITEM,
    RECALLED_MEMORY,
    FragmentOutcome,
    coverage_without,
    fragments,
    without_fragment,
)
from app.eval.answering import LOCOMO_ANSWER, AnswerSetup, Graded, grade, prompt_text
from app.eval.locomo import CATEGORIES, SCORED_CATEGORIES, Conversation, Question


@dataclass
class AnswerResult:
    """A question answered from the build at the answer budget, and its two judgments."""

    sample_id: str
    category: int
    question: str
    gold: str
    answer: str
    published: bool
    strict: bool
    error: str | None
    evidence_recall: float  # of the build the model read
    prompt_tokens: int  # `usage.total` of that build (the model's instructions not counted)
    recalled_tokens: int  # `usage.recall`


@dataclass
class AblationResult:
    """One question's build at the answer budget: each fragment and what removing it changed."""

    sample_id: str
    category: int
    outcomes: list[FragmentOutcome] = field(default_factory=list)


def shown_lines(conv: Conversation, seq_to_dia: Mapping[int, str]) -> dict[int, str]:
    """seq → the line a recalled item shows for that turn (`role: content`, as offload writes
    it: speaker_a is the user)."""
    by_dia = {t.dia_id: t for t in conv.turns}
    lines = {}
    for seq, dia in seq_to_dia.items():
        turn = by_dia[dia]
        role = "user" if turn.speaker == conv.speaker_a else "assistant"
        lines[seq] = f"{role}: {turn.content}"
    return lines


async def answer_and_ablate(
    llm: httpx.AsyncClient | None,
    setup: AnswerSetup | None,
    ablate: bool,
    conv: Conversation,
    q: Question,
    resp: Mapping[str, Any],
    units: Mapping[str, set[str]],
    window: set[str],
    lines: Mapping[int, str],
) -> tuple[AnswerResult | None, AblationResult | None]:
    """The answer to `q` from `resp` (with a model) and each fragment's removal (with
    `ablate`). `units`: recalled item id → the dia_ids it shows; `window`: the dia_ids in C1.
    Category 5 (adversarial: no gold answer) is not answered, as in the published protocol."""
    full = coverage_without(q.evidence, units, window, None)
    answered = setup is not None and llm is not None and q.category in SCORED_CATEGORIES
    graded: Graded | None = None
    answer: AnswerResult | None = None
    system = prompt_text(LOCOMO_ANSWER)
    if answered:
        assert setup is not None and llm is not None
        graded = await grade(llm, setup, system, resp["messages"], q.question, q.answer)
        answer = AnswerResult(
            conv.sample_id,
            q.category,
            q.question,
            q.answer,
            graded.answer,
            graded.published,
            graded.strict,
            graded.error,
            full,
            int(resp["usage"]["total"]),
            int(resp["usage"]["recall"]),
        )
    if not ablate:
        return answer, None
    ablation = AblationResult(conv.sample_id, q.category)
    rank = 0
    for fragment in fragments(resp):
        recalled = fragment.kind in (RECALLED_ITEM, RECALLED_MEMORY)
        without = coverage_without(q.evidence, units, window, fragment.id) if recalled else full
        rank += recalled
        outcome = FragmentOutcome(
            fragment.kind, fragment.tokens, full - without, rank=rank if recalled else None
        )
        if graded is not None:
            assert setup is not None and llm is not None
            messages = without_fragment(resp["messages"], fragment, lines)
            other = await grade(llm, setup, system, messages, q.question, q.answer)
            outcome.published_delta = int(graded.published) - int(other.published)
            outcome.strict_delta = int(graded.strict) - int(other.strict)
        ablation.outcomes.append(outcome)
    return answer, ablation


def answer_summary(results: Sequence[AnswerResult]) -> dict[str, dict[str, float]]:
    """Per category name and 'overall' (categories 1-4): n, each judge's accuracy, the evidence
    recall and tokens of the builds read, and how many answers or judgments failed."""
    groups: dict[str, list[AnswerResult]] = {}
    for r in results:
        groups.setdefault(CATEGORIES.get(r.category, str(r.category)), []).append(r)
    groups["overall"] = [r for r in results if r.category in SCORED_CATEGORIES]
    table: dict[str, dict[str, float]] = {}
    for name, rows in groups.items():
        if rows:
            table[name] = {
                "n": float(len(rows)),
                "published": statistics.fmean(r.published for r in rows),
                "strict": statistics.fmean(r.strict for r in rows),
                "evidence_recall": statistics.fmean(r.evidence_recall for r in rows),
                "prompt_tokens": statistics.fmean(r.prompt_tokens for r in rows),
                "recalled_tokens": statistics.fmean(r.recalled_tokens for r in rows),
                "errors": float(sum(r.error is not None for r in rows)),
            }
    return table
