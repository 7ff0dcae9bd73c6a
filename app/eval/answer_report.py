"""The report sections of `--answer-llm` (judged accuracy per category, beside evidence recall
and tokens) and `--ablate` (what each fragment kind was worth), per split."""

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal, TypeVar

from app.eval.ablation import KindRow, kind_rows, rank_rows
from app.eval.answer_eval import AblationResult, AnswerResult, answer_summary
from app.eval.locomo import CATEGORIES, SCORED_CATEGORIES

Row = TypeVar("Row", AnswerResult, AblationResult)
Splits = Sequence[tuple[str, set[str]]]


def _f(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3f}"


def _per_split(rows: Sequence[Row], splits: Splits, table: Callable[[Sequence[Row]], str]) -> str:
    parts = []
    for title, ids in splits:
        kept = [r for r in rows if r.sample_id in ids]
        if kept:
            parts.append(f"### {title}\n\n{table(kept)}")
    return "\n\n".join(parts)


def answer_table(answers: Sequence[AnswerResult]) -> str:
    """Per category: the published judge's accuracy (J), the strict judge's, the evidence recall
    of the builds the model read, their prompt and recalled tokens, failed calls."""
    summary = answer_summary(answers)
    head = "| category | n | J (published judge) | strict | evidence recall | prompt tokens |"
    head += " recalled tokens | failed calls |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for name in [*(CATEGORIES[c] for c in SCORED_CATEGORIES), "overall"]:
        if (row := summary.get(name)) is not None:
            lines.append(
                f"| {name} | {int(row['n'])} | {_f(row['published'])} | {_f(row['strict'])} | "
                f"{_f(row['evidence_recall'])} | {row['prompt_tokens']:.0f} | "
                f"{row['recalled_tokens']:.0f} | {int(row['errors'])} |"
            )
    return "\n".join(lines)


def ablation_table(
    ablations: Sequence[AblationResult], *, rows_by: Literal["kind", "rank", "category"] = "kind"
) -> str:
    """Per fragment kind (`rank`: per place of a recalled item in the recall order; `category`:
    per kind and question category): how many, their tokens, the evidence recall lost without
    one, the share of them (and of their tokens) that lost any, and with judged answers the
    change of each verdict."""
    per_question = [a.outcomes for a in ablations]
    rows: list[KindRow]
    if rows_by == "rank":
        rows = rank_rows(per_question)
    elif rows_by == "category":
        rows = kind_rows(
            [
                [replace(o, kind=f"{o.kind}, {CATEGORIES[a.category]}") for o in a.outcomes]
                for a in ablations
            ]
        )
    else:
        rows = kind_rows(per_question)
    judged = any(r.published_delta_mean is not None for r in rows)
    head = "| fragment | fragments | builds with one | tokens each | tokens a build |"
    head += " evidence recall lost without one | share that lost evidence | their tokens |"
    head += " J lost without one | strict lost without one |" if judged else ""
    lines = [head, "|" + "---|" * (10 if judged else 8)]
    for r in rows:
        line = (
            f"| {r.kind} | {r.fragments} | {r.questions} | {r.tokens_mean:.0f} | "
            f"{r.tokens_per_question:.0f} | {_signed(r.evidence_delta_mean)} | "
            f"{_f(r.earned_evidence)} | {_f(r.earned_tokens)} |"
        )
        if judged:
            line += f" {_signed(r.published_delta_mean)} | {_signed(r.strict_delta_mean)} |"
        lines.append(line)
    return "\n".join(lines)


def answer_section(answers: Sequence[AnswerResult], splits: Splits, budget: int) -> str:
    """The report's answer section ("" without answers)."""
    if not answers:
        return ""
    return f"""
## Answers judged (`--answer-llm`, the build at B{budget})

An answering model read each build (its instructions first, then the build's messages, the
question last); two judges graded the answer against LoCoMo's gold answer: **J**, the published
LLM-as-a-Judge prompt of the Mem0 paper's LoCoMo evaluation (generous: an answer on the same
topic counts), and **strict** (every fact of the gold answer required; an on-topic wrong answer,
a hedge or "I don't know" is wrong). Prompts and sources: `app/eval/prompts/`. A failed call
counts the question as wrong.

{answer_table(answers)}

{_per_split(answers, splits, answer_table)}
"""


def ablation_section(ablations: Sequence[AblationResult], splits: Splits, budget: int) -> str:
    """The report's ablation section ("" without `--ablate`)."""
    if not ablations:
        return ""
    return f"""
## What each fragment was worth (`--ablate`, the build at B{budget})

Each fragment the build included (a notes section, each recalled item, the user-memory block,
the entity table) removed in turn from the returned prompt, the question scored again. "Evidence
recall lost" is the build's evidence recall minus that without the fragment (notes, user memory
and the table cover no evidence turn by definition: 0); "share that lost evidence" the fragments
whose removal lost any, "their tokens" the share of the kind's tokens those fragments cost; with
`--answer-llm`, "J / strict lost" is the judged verdict with the
fragment minus without it (+1: right only with it; −1: right only without it).

{ablation_table(ablations)}

{_per_split(ablations, splits, ablation_table)}

Recalled items by their place in the recall order (all conversations):

{ablation_table(ablations, rows_by="rank")}

Per question category (all conversations):

{ablation_table(ablations, rows_by="category")}
"""
