"""Questions with no relevant history: how many does the memory tool answer with quoted items?

    .venv/bin/python -m benchmarks.no_history [--embedders e5,none] [--top-k 5] [--show]

The set (`tests/recall/no_history_set.json`) holds a scripted travel conversation (a two-week
trip to Japan planned in English and Chinese: rail, ryokan, hotels, food, flights, packing) and
50 questions, 25 English and 25 Chinese, that nothing in it answers ("What is the boiling point
of mercury in kelvin?", "git合并冲突怎么解决？"). Per embedder a fresh contextd (embedded stack,
API and worker) stores the conversation in one session, offloads it and waits for its vectors,
then asks each question through the memory tool's `recall`. Prints, per language and per half
of the set (tune: the questions at even positions, which set the relevance floor of
`app.recall.floor`; check: the odd ones), how many questions got at least one quoted item (one
above the floor) and how many items in all (every one of them is noise), and how many were
searched without their vector (the query embedding timed out).
`--show` prints each answered question with its first match and its relevance.
"""

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from benchmarks.scripted_recall import client, load_session, recall, served

DEFAULT_SET = Path(__file__).resolve().parent.parent / "tests" / "recall" / "no_history_set.json"


async def measure(
    url: str, key: str, data: dict[str, Any], top_k: int, embedded: bool
) -> list[tuple[dict[str, str], list[dict[str, Any]]]]:
    """(question, its matches) for every question of the set; a question searched without its
    vector (the query embedding timed out) is marked `without_vector`."""
    answers = []
    async with client(url, key) as http:
        await load_session(http, "no-history", data["conversation"], embedded=embedded)
        for position, q in enumerate(data["queries"]):
            matches, fallbacks = await recall(http, "no-history", q["query"], top_k)
            q = {**q, "half": "tune" if position % 2 == 0 else "check"}
            if embedded and any(f.startswith("vector_") for f in fallbacks):
                q = {**q, "without_vector": "yes"}
            answers.append((q, matches))
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=Path, default=DEFAULT_SET)
    parser.add_argument("--embedders", default="e5,none")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--show", action="store_true", help="each answered question, first match")
    args = parser.parse_args()
    data: dict[str, Any] = json.loads(args.set.read_text(encoding="utf-8"))
    turns, questions = len(data["conversation"]), len(data["queries"])
    print(f"{turns} turns of a travel conversation, {questions} questions it does not answer, "
          f"memory tool recall top_k {args.top_k}")  # fmt: skip
    print("| embedder | questions | answered with quoted items | items quoted | without vector |")
    print("|---|---|---|---|---|")
    for kind in args.embedders.split(","):
        with served(kind) as (url, key):
            answers = asyncio.run(measure(url, key, data, args.top_k, embedded=kind != "none"))
        for lang in ("en", "zh", "tune", "check", None):
            part = [(q, m) for q, m in answers if lang is None or lang in (q["lang"], q["half"])]
            answered = sum(bool(m) for _, m in part)
            lexical = sum("without_vector" in q for q, _ in part)
            print(
                f"| {kind} | {lang or 'all'} | {answered} / {len(part)} "
                f"({answered / len(part):.0%}) | {sum(len(m) for _, m in part)} | {lexical} |",
                flush=True,
            )
        if args.show:
            for q, matches in answers:
                if matches:
                    first = " ".join(matches[0]["text"].split())[:100]
                    relevance = matches[0].get("relevance")
                    print(f"  - {q['query']} → {len(matches)} ({relevance}): {first}")


if __name__ == "__main__":
    main()
