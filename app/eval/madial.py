"""MADial-Bench memory-recall evaluation (shared/eval/README.md), pure parts (no I/O).

Loading the Chinese or English files, pooling memories per user, parsing dialogue lines, the
query a dialogue asks with (its lines before the first test turn), R@k, and the offline BM25
baseline over the same memories. The HTTP driver is `app.eval.madial_driver`.

Protocol (issue "recall that earns its tokens"): each memory is stored with the memory tool's
`remember` (scope user) in a session of its user; each dialogue's lines before the first test
turn are appended to a fresh session of that user; one memory `recall` with those lines as the
query; R@k = |top-k ∩ relevant| / |relevant|, averaged over dialogues.

Split: the dialogues at an even position of the file (0, 2, 4, ...) are the **tune** split, the
only ones any setting may be tuned on; the odd ones are the **check** split, reported beside it
and never tuned on. Both users' dialogues are interleaved in the files, so each split holds both
users, and the dialogues that share a relevant memory are spread over both.
"""

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.domain.text import terms
from app.recall.bm25 import BM25Index

Lang = Literal["zh", "en"]
Split = Literal["tune", "check"]
SPLITS: tuple[Split, ...] = ("tune", "check")
QUERY_MAX_CHARS = 2_000  # the memory tool's query limit
_LINE_RE = re.compile(r"^<(?P<speaker>[^>]+)>\s*[:：]\s*(?P<text>.*?)\s*$", re.DOTALL)
_QUOTES = "\"“”「」'"


@dataclass(frozen=True, slots=True)
class MadialMemory:
    id: str
    user: str
    text: str
    time: str
    scene: str
    emotion: str

    @property
    def tags(self) -> list[str]:
        """The memory's labels, stored as the remembered item's tags: its scene and emotion."""
        return [label for label in (self.scene, self.emotion) if label]


@dataclass(frozen=True, slots=True)
class DialogueLine:
    speaker: str
    text: str

    @property
    def role(self) -> str:
        return "assistant" if self.speaker.lower() == "assistant" else "user"

    @property
    def rendered(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True, slots=True)
class MadialDialogue:
    index: int
    user: str
    lines: tuple[DialogueLine, ...]  # the lines before the first test turn, in order
    relevant: tuple[str, ...]  # memory ids
    reply: str = ""  # the assistant's line at the first test turn (the gold reply)

    @property
    def query(self) -> str:
        """The dialogue so far as one query, cut from the front to the tool's query limit."""
        text = "\n".join(line.rendered for line in self.lines)
        return text[-QUERY_MAX_CHARS:].lstrip()


def split_of(index: int) -> Split:
    """The split of the dialogue at `index` (its position in the dialogue file)."""
    return "tune" if index % 2 == 0 else "check"


def parse_line(raw: str) -> DialogueLine | None:
    """`<Name>:"text"` → DialogueLine; the `<BOD>` / `<EOD>` markers and blank lines → None."""
    stripped = raw.strip()
    match = _LINE_RE.match(stripped)
    if match is None:
        return None
    text = match.group("text").strip().strip(_QUOTES).strip()
    return DialogueLine(match.group("speaker").strip(), text) if text else None


def load_madial(folder: str | Path, lang: Lang) -> tuple[list[MadialMemory], list[MadialDialogue]]:
    """Memories and dialogues of one language. English memories carry no user id: it is taken
    from the Chinese memory of the same id (the two files share ids)."""
    base = Path(folder)
    raw_memories = json.loads((base / f"madial_{lang}_memory.json").read_text())
    owners = {
        str(m["id"]): str(m["user-id"])
        for m in json.loads((base / "madial_zh_memory.json").read_text())
    }
    memories = [
        MadialMemory(
            id=str(m["id"]),
            user=str(m.get("user-id") or owners[str(m["id"])]),
            text=" ".join(str(m["event"]).split()),
            time=str(m.get("time", "")),
            scene=str(m.get("scene", "")),
            emotion=str(m.get("emotion", "")),
        )
        for m in raw_memories
    ]
    known = {m.id for m in memories}
    dialogues = []
    for index, d in enumerate(json.loads((base / f"madial_{lang}_dialogue.json").read_text())):
        first_test = min(int(t) for t in d["test-turn"])
        lines = tuple(
            line for raw in d["dialogue"][:first_test] if (line := parse_line(raw)) is not None
        )
        relevant = tuple(dict.fromkeys(str(r) for r in d["relevant-id"] if str(r) in known))
        if lines and relevant:
            gold = (
                parse_line(d["dialogue"][first_test]) if first_test < len(d["dialogue"]) else None
            )
            reply = gold.text if gold is not None else ""
            dialogues.append(MadialDialogue(index, str(d["user-id"]), lines, relevant, reply))
    return memories, dialogues


def recall_at(relevant: Sequence[str], ranked: Sequence[Sequence[str]], k: int) -> float:
    """|top-k ∩ relevant| / |relevant|; each ranked unit holds the dataset ids it stands for."""
    top = {memory_id for unit in ranked[:k] for memory_id in unit}
    return sum(1 for r in relevant if r in top) / len(relevant) if relevant else 0.0


@dataclass
class DialogueResult:
    index: int
    user: str
    relevant: int
    at_k: dict[int, float] = field(default_factory=dict)
    returned: int = 0  # items the method returned
    latency_ms: float = 0.0
    fallbacks: tuple[str, ...] = ()  # the recall's fallbacks, e.g. vector_unavailable


def summarise_madial(results: Sequence[DialogueResult], ks: Sequence[int]) -> dict[str, float]:
    row: dict[str, float] = {"n": float(len(results))}
    for k in ks:
        row[f"R@{k}"] = statistics.fmean(r.at_k[k] for r in results) if results else 0.0
    row["returned"] = statistics.fmean(r.returned for r in results) if results else 0.0
    return row


def lexical_only(results: Sequence[DialogueResult]) -> int:
    """How many recalls went on without the query's embedding (`vector_unavailable`)."""
    return sum(1 for r in results if "vector_unavailable" in r.fallbacks)


def summarise_by_split(
    results: Sequence[DialogueResult], ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    """`summarise_madial` of all dialogues, then of each split."""
    out = {"all": summarise_madial(results, ks)}
    for split in SPLITS:
        out[split] = summarise_madial([r for r in results if split_of(r.index) == split], ks)
    return out


def bm25_madial(
    memories: Sequence[MadialMemory], dialogues: Sequence[MadialDialogue], ks: Sequence[int]
) -> list[DialogueResult]:
    """Plain BM25 (`terms()`: words, CJK unigrams + bigrams) over each user's memories, queried
    with the same text contextd gets."""
    by_user: dict[str, list[MadialMemory]] = {}
    for m in memories:
        by_user.setdefault(m.user, []).append(m)
    indexes = {
        user: BM25Index([(m.id, terms(m.text)) for m in pool]) for user, pool in by_user.items()
    }
    out = []
    for d in dialogues:
        ranked = [[doc] for doc, _ in indexes[d.user].score(terms(d.query), top_n=max(ks))]
        r = DialogueResult(d.index, d.user, len(d.relevant), returned=len(ranked))
        r.at_k = {k: recall_at(d.relevant, ranked, k) for k in ks}
        out.append(r)
    return out


def ranked_units(
    matches: Sequence[Mapping[str, Any]], stored: Mapping[str, Sequence[str]]
) -> list[list[str]]:
    """Per returned remembered item, in order, the dataset ids it stands for (one item stands for
    several when `remember` found them near-duplicates; a chunk match stands for none)."""
    return [list(stored.get(str(match.get("memory_id")), ())) for match in matches]
