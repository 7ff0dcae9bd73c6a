"""Chunk-size distribution of the default chunker on LoCoMo conversations.

    .venv/bin/python -m benchmarks.chunk_sizes [../shared/eval/locomo/locomo_dev.json]

Each conversation becomes one list of turns as the eval protocol ingests it (content
`"<speaker>: <text>"` plus `[image: <blip_caption>]`; speaker_a is `user`, speaker_b `assistant`),
chunked in one go by `chunk_turns` with the default `ChunkingConfig`. Two timestamp variants: the
session dates (a new session is a time gap, so it starts a chunk) and one timestamp for every turn
(what an ingestion at wall-clock time sees: only size and topic shifts break chunks). Prints chunk
count, mean and p10/p50/p90/max tokens, and turns per chunk.
"""

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from app.domain.records import TurnRecord
from app.domain.tokens import message_tokens
from app.offload.chunking import ChunkingConfig, chunk_turns

DEFAULT_PATH = "../shared/eval/locomo/locomo_dev.json"
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    turns: list[TurnRecord]


def session_date(value: str | None) -> datetime | None:
    """LoCoMo's "1:56 pm on 8 May, 2023"."""
    try:
        return datetime.strptime(value or "", "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    except ValueError:
        return None


def _session_numbers(conversation: dict[str, Any]) -> list[int]:
    keys = (k.removeprefix("session_") for k in conversation if k.startswith("session_"))
    return sorted(
        int(k) for k in keys if k.isdigit() and isinstance(conversation[f"session_{k}"], list)
    )


def load_conversations(path: str | Path, *, dated: bool = True) -> list[Conversation]:
    """LoCoMo samples as turn lists, sessions in n order, seq from 1 per conversation."""
    samples = json.loads(Path(path).read_text())
    out: list[Conversation] = []
    for sample in samples:
        conv = sample["conversation"]
        roles = {conv["speaker_a"]: "user", conv["speaker_b"]: "assistant"}
        turns: list[TurnRecord] = []
        for n in _session_numbers(conv):
            start = (session_date(conv.get(f"session_{n}_date_time")) if dated else None) or EPOCH
            for i, raw in enumerate(conv[f"session_{n}"]):
                content = f"{raw['speaker']}: {raw['text']}"
                if raw.get("blip_caption"):
                    content += f" [image: {raw['blip_caption']}]"
                role = roles.get(raw["speaker"], "user")
                turns.append(
                    TurnRecord(
                        seq=len(turns) + 1,
                        role=role,
                        content=content,
                        token_count=message_tokens(role, content),
                        created_at=start + timedelta(seconds=30 * i) if dated else EPOCH,
                        metadata={"dia_id": raw["dia_id"]},
                    )
                )
        out.append(Conversation(sample["sample_id"], turns))
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def report(label: str, conversations: list[Conversation], cfg: ChunkingConfig) -> None:
    sizes: list[int] = []
    turns_per_chunk: list[int] = []
    for conversation in conversations:
        for chunk in chunk_turns(conversation.turns, cfg):
            sizes.append(chunk.token_count)
            turns_per_chunk.append(chunk.turn_last - chunk.turn_first + 1)
    turns = sum(len(c.turns) for c in conversations)
    print(
        f"{label:<14} convs {len(conversations)}  turns {turns}  chunks {len(sizes)}  "
        f"tokens mean {statistics.fmean(sizes):.1f}  p10 {percentile(sizes, 10):.0f}  "
        f"p50 {percentile(sizes, 50):.0f}  p90 {percentile(sizes, 90):.0f}  max {max(sizes)}  "
        f"| turns/chunk mean {statistics.fmean(turns_per_chunk):.2f}  "
        f"p50 {percentile(turns_per_chunk, 50):.0f}  p90 {percentile(turns_per_chunk, 90):.0f}  "
        f"max {max(turns_per_chunk)}  | below min {sum(s < cfg.min_tokens for s in sizes)}  "
        f"above max {sum(s > cfg.max_tokens for s in sizes)}"
    )


def main(argv: list[str]) -> None:
    path = argv[1] if len(argv) > 1 else DEFAULT_PATH
    cfg = ChunkingConfig()
    print(
        f"{path}: chunk_turns, min {cfg.min_tokens} / max {cfg.max_tokens} tokens, "
        f"time gap {cfg.time_gap_seconds:.0f}s, topic shift {cfg.topic_shift_threshold}"
    )
    report("session dates", load_conversations(path, dated=True), cfg)
    report("one timestamp", load_conversations(path, dated=False), cfg)


if __name__ == "__main__":
    main(sys.argv)
