"""Notes-quality evaluation (`contextd eval notes`): pure parts — the suite, scores, report.

Two references, both read from a path given on the command line:

1. The scripted suite (`tests/eval/notes_suite.py` writes it): English and Chinese conversations
   whose user turns carry labelled must-keep items (kind + key terms) among questions, requests,
   chit-chat and assistant replies (non-facts). Scored on the final notes of each conversation:
   - recall: a must-keep item is kept when one notes item cites its turn (`seq`) and contains
     every key term (case-insensitive). Items replaced later (a changed decision, an updated code)
     are not must-keep; their latest version is.
   - non-fact precision: the share of notes items that do not cite a non-fact turn.
   - latest-only: a changed item shows only its latest version — the latest is kept and no notes
     item cites any earlier version's turn.
   Items whose turn was never offloaded (still in the window, so in the prompt verbatim) are
   counted apart and left out of recall.
2. LoCoMo `observation` entries (facts per speaker, with their source turns): the share whose key
   terms appear in the notes or the remembered items at the notes' token cap. Key terms of an
   observation are its `terms()` (English stopwords out) minus the speakers' names and a few
   reporting verbs; it is covered when one notes item holds at least half of them. The share
   whose source turn is cited by some notes item is reported beside it.
"""

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.domain.text import terms
from app.eval.locomo import normalise_evidence
from app.notes.schemas import NoteItem, Notes

NON_FACT_LABELS = frozenset({"question", "request", "chitchat", "reply"})
OBSERVATION_SHARE = 0.5  # share of an observation's key terms one notes item must hold
_GENERIC_TERMS = frozenset(
    "also really recently said says shared mentioned told talked feels felt found likes loves "
    "enjoys wants thinks".split()
)


# ---------------------------------------------------------------- the scripted suite


@dataclass(frozen=True, slots=True)
class SuiteTurn:
    role: str
    content: str
    label: str  # keep | question | request | chitchat | reply


@dataclass(frozen=True, slots=True)
class MustKeep:
    kind: str
    turn: int  # index into the conversation's turns
    terms: tuple[str, ...]
    supersedes: tuple[int, ...]  # earlier versions' turn indexes (a change of them)
    superseded: bool  # a later turn changes it: only the latest version is must-keep


@dataclass(frozen=True, slots=True)
class SuiteConversation:
    id: str
    language: str
    split: str
    turns: tuple[SuiteTurn, ...]
    items: tuple[MustKeep, ...]


def load_suite(path: str | Path, limit: int | None = None) -> list[SuiteConversation]:
    """The suite JSON; `limit` keeps the first N conversations of each (split, language)."""
    data = json.loads(Path(path).read_text())
    seen: dict[tuple[str, str], int] = {}
    out: list[SuiteConversation] = []
    for conv in data["conversations"]:
        group = (conv["split"], conv["language"])
        seen[group] = seen.get(group, 0) + 1
        if limit is not None and seen[group] > limit:
            continue
        out.append(
            SuiteConversation(
                id=conv["id"],
                language=conv["language"],
                split=conv["split"],
                turns=tuple(SuiteTurn(t["role"], t["content"], t["label"]) for t in conv["turns"]),
                items=tuple(
                    MustKeep(
                        kind=i["kind"],
                        turn=i["turn"],
                        terms=tuple(i["terms"]),
                        supersedes=tuple(i["supersedes"]),
                        superseded=bool(i["superseded"]),
                    )
                    for i in conv["items"]
                ),
            )
        )
    return out


@dataclass
class ItemResult:
    kind: str
    kept: bool
    in_window: bool  # its turn was never offloaded: not scored for recall
    changed: bool  # it replaces earlier versions
    latest_only: bool  # changed, kept, and no earlier version cited


@dataclass
class ConversationScore:
    id: str
    language: str
    split: str
    items: list[ItemResult]
    notes_items: int  # items in the notes (remembered ones excluded)
    non_fact_items: int  # of them, citing a non-fact turn
    non_fact_examples: list[str] = field(default_factory=list)  # texts, for the report
    missed_examples: list[str] = field(default_factory=list)  # "kind: turn text"
    token_count: int = 0
    dropped_items: int = 0


def _contains(text: str, term: str) -> bool:
    return " ".join(term.casefold().split()) in " ".join(text.casefold().split())


def score_conversation(
    conv: SuiteConversation,
    notes: Notes,
    seqs: Sequence[int],
    covers_until_seq: int,
    *,
    token_count: int = 0,
    dropped_items: int = 0,
) -> ConversationScore:
    """Score one conversation's final notes; `seqs[i]` is the stored seq of `conv.turns[i]`."""
    position = {seq: index for index, seq in enumerate(seqs)}
    cited: dict[int, list[NoteItem]] = {}
    items = [item for name, section in notes.sections() if name != "remembered" for item in section]
    for item in items:
        if item.seq is not None and item.seq in position:
            cited.setdefault(position[item.seq], []).append(item)
    results: list[ItemResult] = []
    missed: list[str] = []
    for must in conv.items:
        if must.superseded:
            continue
        in_window = seqs[must.turn] > covers_until_seq
        kept = any(
            all(_contains(item.text, term) for term in must.terms)
            for item in cited.get(must.turn, [])
        )
        changed = bool(must.supersedes)
        stale = any(index in cited for index in must.supersedes)
        results.append(
            ItemResult(must.kind, kept, in_window, changed, changed and kept and not stale)
        )
        if not kept and not in_window:
            missed.append(f"{must.kind}: {conv.turns[must.turn].content}")
    non_fact = [
        item
        for index, group in cited.items()
        if conv.turns[index].label in NON_FACT_LABELS
        for item in group
    ]
    return ConversationScore(
        id=conv.id,
        language=conv.language,
        split=conv.split,
        items=results,
        notes_items=len(items),
        non_fact_items=len(non_fact),
        non_fact_examples=[item.text for item in non_fact],
        missed_examples=missed,
        token_count=token_count,
        dropped_items=dropped_items,
    )


def _ratio(numerator: int, denominator: int) -> float:
    return numerator / denominator if denominator else math.nan


def summarise_suite(scores: Sequence[ConversationScore]) -> dict[str, dict[str, Any]]:
    """Figures per `split/language` (and `split/language/kind` for recall)."""
    groups: dict[str, list[ConversationScore]] = {}
    for score in scores:
        groups.setdefault(f"{score.split}/{score.language}", []).append(score)
    table: dict[str, dict[str, Any]] = {}
    for name, rows in sorted(groups.items()):
        scored = [i for s in rows for i in s.items if not i.in_window]
        changed = [i for i in scored if i.changed]
        decisions = [i for i in changed if i.kind == "decision"]
        notes_items = sum(s.notes_items for s in rows)
        table[name] = {
            "conversations": len(rows),
            "must_keep": len(scored),
            "in_window": sum(1 for s in rows for i in s.items if i.in_window),
            "recall": _ratio(sum(i.kept for i in scored), len(scored)),
            "notes_items": notes_items,
            "non_fact_items": sum(s.non_fact_items for s in rows),
            "precision": _ratio(notes_items - sum(s.non_fact_items for s in rows), notes_items),
            "decisions_changed": len(decisions),
            "decisions_latest_only": _ratio(sum(i.latest_only for i in decisions), len(decisions)),
            "updates_changed": len(changed) - len(decisions),
            "updates_latest_only": _ratio(
                sum(i.latest_only for i in changed if i.kind != "decision"),
                len(changed) - len(decisions),
            ),
            "tokens_median": statistics.median(s.token_count for s in rows),
            "dropped_items": sum(s.dropped_items for s in rows),
            "kinds": {
                kind: {
                    "n": len([i for i in scored if i.kind == kind]),
                    "recall": _ratio(
                        sum(i.kept for i in scored if i.kind == kind),
                        len([i for i in scored if i.kind == kind]),
                    ),
                }
                for kind in sorted({i.kind for i in scored})
            },
        }
    return table


# ---------------------------------------------------------------- LoCoMo observations


@dataclass(frozen=True, slots=True)
class Observation:
    speaker: str
    text: str
    dia_ids: tuple[str, ...]


def load_observations(sample: Mapping[str, Any], known: Iterable[str]) -> list[Observation]:
    """Observations of one LoCoMo sample, with their source turns normalised (bad ids dropped)."""
    known_ids = list(known)
    out: list[Observation] = []
    for _, per_speaker in sorted((sample.get("observation") or {}).items()):
        for speaker, entries in per_speaker.items():
            for text, evidence in entries:
                raw = evidence if isinstance(evidence, list) else [evidence]
                ids, _ = normalise_evidence(raw, known_ids)
                out.append(Observation(str(speaker), str(text), tuple(ids)))
    return out


def observation_terms(text: str, speakers: Iterable[str]) -> set[str]:
    names = {t for speaker in speakers for t in terms(speaker)}
    return {t for t in terms(text) if t not in names and t not in _GENERIC_TERMS}


@dataclass
class ObservationScore:
    sample_id: str
    speaker_role: dict[str, str]  # speaker -> "user" | "assistant" as ingested
    covered: dict[str, list[bool]]  # role -> one flag per observation (key terms)
    cited: dict[str, list[bool]]  # role -> one flag per observation (source turn cited)
    notes_items: int
    token_count: int
    dropped_items: int


def score_observations(
    sample_id: str,
    observations: Sequence[Observation],
    speaker_role: Mapping[str, str],
    notes: Notes,
    seq_to_dia: Mapping[int, str],
    *,
    token_count: int = 0,
    dropped_items: int = 0,
) -> ObservationScore:
    item_terms = [set(terms(item.text)) for item in notes.items()]
    cited_dias = {
        seq_to_dia[i.seq] for i in notes.items() if i.seq is not None and i.seq in seq_to_dia
    }
    covered: dict[str, list[bool]] = {}
    cited: dict[str, list[bool]] = {}
    for obs in observations:
        role = speaker_role.get(obs.speaker, "assistant")
        key = observation_terms(obs.text, speaker_role)
        need = max(1, math.ceil(OBSERVATION_SHARE * len(key)))
        hit = bool(key) and any(len(key & found) >= need for found in item_terms)
        covered.setdefault(role, []).append(hit)
        cited.setdefault(role, []).append(any(d in cited_dias for d in obs.dia_ids))
    return ObservationScore(
        sample_id=sample_id,
        speaker_role=dict(speaker_role),
        covered=covered,
        cited=cited,
        notes_items=len(notes.items()),
        token_count=token_count,
        dropped_items=dropped_items,
    )


def summarise_observations(scores: Sequence[ObservationScore]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for role in ("user", "assistant", "all"):
        covered = [
            f for s in scores for r, flags in s.covered.items() if role in (r, "all") for f in flags
        ]
        cited = [
            f for s in scores for r, flags in s.cited.items() if role in (r, "all") for f in flags
        ]
        if covered:
            table[role] = {
                "n": float(len(covered)),
                "key_terms": _ratio(sum(covered), len(covered)),
                "source_cited": _ratio(sum(cited), len(cited)),
            }
    return table


# ---------------------------------------------------------------- report


def _f(value: float, digits: int = 3) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


def suite_table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per part and language: recall, precision, latest-only, size."""
    head = ["part", "language", "conversations", "must-keep", "recall", "notes items",
            "non-fact items", "precision", "changed decisions", "latest-only",
            "updated codes", "latest-only", "tokens (median)", "dropped by cap"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in summary.items():
        part, language = name.split("/")
        cells = [
            "held-out" if part == "heldout" else part, language, str(row["conversations"]),
            str(row["must_keep"]), _f(row["recall"]), str(row["notes_items"]),
            str(row["non_fact_items"]), _f(row["precision"]), str(row["decisions_changed"]),
            _f(row["decisions_latest_only"]), str(row["updates_changed"]),
            _f(row["updates_latest_only"]), f"{row['tokens_median']:.0f}",
            str(row["dropped_items"]),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def kind_table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """Recall per kind of must-keep item, one column per part and language (n in brackets)."""
    groups = list(summary)
    kinds = sorted({kind for row in summary.values() for kind in row["kinds"]})
    head = ["kind", *(g.replace("heldout", "held-out") for g in groups)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kind in kinds:
        cells = [kind]
        for group in groups:
            entry = summary[group]["kinds"].get(kind)
            cells.append(f"{_f(entry['recall'])} ({entry['n']})" if entry else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def observations_table(table: Mapping[str, Mapping[str, float]]) -> str:
    head = ["speaker (ingested as)", "observations", "key terms in notes", "source turn cited"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for role, row in table.items():
        cells = [role, f"{row['n']:.0f}", _f(row["key_terms"]), _f(row["source_cited"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_notes_report(
    out: Path,
    summary: Mapping[str, Mapping[str, Any]],
    observations: Mapping[str, Mapping[str, float]],
    scores: Sequence[ConversationScore],
    observed: Sequence[ObservationScore],
    *,
    generators: Sequence[str],
    sources: tuple[str, str | None],
    label: str = "",
    offload_refused: int = 0,
    elapsed_s: float = 0.0,
) -> Path:
    """`notes_report.md` in `out`: the tables, the first misses and non-fact items, definitions."""
    refused = (
        f" {offload_refused} sessions could not be offloaded by the key (no memory:offload): "
        "their last turns stayed in the window and are counted apart."
        if offload_refused
        else ""
    )
    misses = [f"- {s.id} — {m}" for s in scores for m in s.missed_examples][:40]
    non_facts = [f"- {s.id} — {t}" for s in scores for t in s.non_fact_examples][:40]
    locomo = "\n".join(
        f"| {o.sample_id} | {o.notes_items} | {o.token_count} | {o.dropped_items} |"
        for o in observed
    )
    text = f"""# contextd notes-quality evaluation

Generator: **{", ".join(generators) or "–"}** (the server's), at the server's notes token cap.
Suite: `{sources[0]}`; LoCoMo: `{sources[1] or "not run"}`. {label}
Run time {elapsed_s:.0f} s.{refused}

## Scripted suite

{suite_table(summary)}

Recall per kind of must-keep item (n in brackets):

{kind_table(summary)}

## LoCoMo observations (reference, no target)

{observations_table(observations) if observations else "Not run (no `--locomo`)."}

{"| conversation | notes items | notes tokens | dropped by cap |" if observed else ""}
{"|---|---|---|---|" if observed else ""}
{locomo}

## Must-keep items missed (first 40)

{chr(10).join(misses) or "None."}

## Non-fact items in the notes (first 40)

{chr(10).join(non_facts) or "None."}

## Definitions

- **recall**: share of must-keep items (names, codes, IDs, amounts, dates, preferences, health
  facts, constraints, decisions, open questions, commitments, deadlines) for which one notes item
  cites the item's turn and holds all its key terms. Items changed later count by their latest
  version only; items whose turn was never offloaded are left out ("in the window").
- **precision**: share of notes items (remembered ones excluded) that do not cite a question,
  a request, chit-chat or an assistant reply.
- **latest-only**: a changed decision (or an updated code) is kept in its latest version and no
  notes item cites an earlier version's turn.
- **held-out**: conversations built only from templates and fillers held out while the rules
  were written, with their own seeds.
- **LoCoMo observations**: an observation is covered when one notes item (or remembered item)
  holds at least half of its key terms (its words minus stopwords, the speakers' names and a few
  reporting verbs); "source turn cited" counts observations one of whose evidence turns a notes
  item cites. Speaker A is ingested as the user, speaker B as the assistant: by design the rules
  keep only progress from assistant turns.
"""
    path = out / "notes_report.md"
    path.write_text(text)
    return path
