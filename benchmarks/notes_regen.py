"""Time of the default (rules) notes generator on LoCoMo conversations.

    .venv/bin/python -m benchmarks.notes_regen [../shared/eval/locomo/locomo_dev.json] [--runs 5]

The CPU part of a notes job, as `compute_notes` runs it (`rules.extract` + `policy.merge` +
`policy.cap` at the default 400-token cap), without the database:
- rebuild: from every turn of a conversation at once (the periodic rebuild from raw turns);
- step: incremental, 100 turns at a time, each step folding into the previous notes (the job that
  follows an offload).
Prints p50/p95 milliseconds per conversation (rebuild), per 100 turns (rebuild time scaled by
turn count) and per 100-turn step, plus the notes size at the end.
"""

import argparse
import statistics
import time

from app.domain.records import TurnRecord
from app.notes.policy import DEFAULT_MAX_TOKENS, cap, merge
from app.notes.rules import extract
from app.notes.schemas import Notes
from benchmarks.chunk_sizes import DEFAULT_PATH, load_conversations, percentile

STEP = 100


def regenerate(previous: Notes, turns: list[TurnRecord]) -> tuple[Notes, float, int, int]:
    """One notes generation; returns (capped notes, seconds, tokens, dropped items)."""
    started = time.perf_counter()
    result = cap(merge(previous, extract(turns, previous)), DEFAULT_MAX_TOKENS)
    elapsed = time.perf_counter() - started
    return result.notes, elapsed, result.token_count, len(result.dropped)


def line(label: str, values_ms: list[float]) -> str:
    return (
        f"{label:<26} n {len(values_ms):>4}  p50 {percentile(values_ms, 50):8.2f} ms  "
        f"p95 {percentile(values_ms, 95):8.2f} ms  max {max(values_ms):8.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path", nargs="?", default=DEFAULT_PATH)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    conversations = load_conversations(args.path)
    per_conversation: list[float] = []
    per_100_turns: list[float] = []
    per_step: list[float] = []
    for conversation in conversations:
        turns = conversation.turns
        for _ in range(args.runs):
            notes, seconds, tokens, dropped = regenerate(Notes(), turns)
            per_conversation.append(seconds * 1000)
            per_100_turns.append(seconds * 1000 * STEP / len(turns))
            previous = Notes()
            for start in range(0, len(turns), STEP):
                previous, seconds, _, _ = regenerate(previous, turns[start : start + STEP])
                per_step.append(seconds * 1000)
        print(
            f"{conversation.sample_id:<10} turns {len(turns):>4}  rebuild "
            f"{statistics.median(per_conversation[-args.runs :]):7.2f} ms  notes {tokens} tokens, "
            f"{len(notes.items())} items, {dropped} dropped by the cap"
        )
    print(f"{len(conversations)} conversations x {args.runs} runs, cap {DEFAULT_MAX_TOKENS} tokens")
    print(line("rebuild per conversation", per_conversation))
    print(line("rebuild per 100 turns", per_100_turns))
    print(line(f"incremental {STEP}-turn step", per_step))


if __name__ == "__main__":
    main()
