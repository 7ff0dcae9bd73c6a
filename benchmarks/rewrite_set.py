"""The labelled rewrite set: self-contained questions left alone, dependent ones resolved.

    .venv/bin/python -m benchmarks.rewrite_set [--set tests/recall/rewrite_set.json] [--misses]

Each item of the set is a question with the two turns before it (travel, shopping, coding and
support conversations, English and Chinese), labelled self-contained or dependent; a dependent one
names the term(s) it must resolve to. Runs the rule rewrite recall uses (`rewrite_query`) on each
and prints, per language and overall: how many self-contained questions were rewritten (the
rewrite must equal the question) and how many dependent ones were resolved (every resolving term
among the appended terms). `--misses` lists the items that fail.
"""

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.domain.text import match_terms, terms
from app.recall.rewrite import RewrittenQuery, rewrite_query

DEFAULT_SET = Path(__file__).resolve().parent.parent / "tests" / "recall" / "rewrite_set.json"


@dataclass(frozen=True, slots=True)
class Outcome:
    item: dict[str, Any]
    rewritten: RewrittenQuery

    @property
    def dependent(self) -> bool:
        return bool(self.item["dependent"])

    @property
    def left_alone(self) -> bool:
        return self.rewritten.rewritten == str(self.item["question"])

    @property
    def resolved(self) -> bool:
        """Every resolving term among the appended ones: inside one of them ("TTLCache" in
        "cachetools.TTLCache"), or its words and CJK bigrams all there ("国宾馆": 国宾, 宾馆)."""
        joined = " ".join(self.rewritten.appended)
        appended = set(terms(joined))
        return all(
            term.casefold() in joined.casefold() or match_terms(terms(term)) <= appended
            for term in self.item["resolves_to"]
        )

    @property
    def correct(self) -> bool:
        return self.resolved if self.dependent else self.left_alone


def load_set(path: Path = DEFAULT_SET) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return items


def run_set(items: Sequence[dict[str, Any]]) -> list[Outcome]:
    return [Outcome(item, rewrite_query(item["question"], item["turns"])) for item in items]


def figures(outcomes: Sequence[Outcome]) -> tuple[int, int, int, int]:
    """(self-contained rewritten, self-contained, dependent resolved, dependent)."""
    alone = [o for o in outcomes if not o.dependent]
    dependent = [o for o in outcomes if o.dependent]
    return (
        sum(not o.left_alone for o in alone),
        len(alone),
        sum(o.resolved for o in dependent),
        len(dependent),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=Path, default=DEFAULT_SET)
    parser.add_argument("--misses", action="store_true", help="list the items that fail")
    args = parser.parse_args()
    outcomes = run_set(load_set(args.set))
    print("| language | self-contained rewritten | dependent resolved |")
    print("|---|---|---|")
    for lang in ("en", "zh", None):
        part = [o for o in outcomes if lang is None or o.item["lang"] == lang]
        rewritten, alone, resolved, dependent = figures(part)
        print(
            f"| {lang or 'all'} | {rewritten} / {alone} | {resolved} / {dependent} "
            f"({resolved / dependent:.1%}) |"
        )
    if args.misses:
        for o in outcomes:
            if not o.correct:
                need = o.rewritten.context_need
                print(
                    f"- {o.item['question']!r}: need {need.reason if need else None}, "
                    f"appended {o.rewritten.appended}, wanted {o.item['resolves_to']}"
                )


if __name__ == "__main__":
    main()
