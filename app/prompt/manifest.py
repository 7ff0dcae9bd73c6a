"""A build's manifest and recalled items as the response lists them, made from what assembly
decided: every item the build weighed, in order, with why it was left out. Pure: no I/O.

An item of untrusted text (a tool result, recalled or remembered text from tool output) that gives
orders to the model (`app.domain.injection`) is flagged `injection`: the prompt carries it only as
quoted data, and the notes never take its orders. A cleared result's stub shows values only, so
it is not flagged."""

import hashlib
from collections.abc import Mapping, Sequence
from typing import Protocol

from pydantic import TypeAdapter

from app.domain.injection import gives_orders
from app.domain.records import RecalledItem, TurnRecord
from app.notes.schemas import DroppedNote
from app.prompt.assembly import AssembledPrompt, ManifestEntry
from app.prompt.schemas import ManifestItem, RecalledItemOut

_MANIFEST_ITEMS = TypeAdapter(list[ManifestItem])

# Whether a text gives orders, under a digest of it, per process: a tool loop rebuilds its window
# at every step, and checking a 55 KB result again each time cost ~7 ms a build. Digests, not the
# texts, are kept (results can be megabytes); the oldest goes first once full.
_GIVES_ORDERS: dict[bytes, bool] = {}
_GIVES_ORDERS_KEPT = 4096


def _gives_orders_once(text: str) -> bool:
    digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
    found = _GIVES_ORDERS.get(digest)
    if found is None:
        found = _GIVES_ORDERS[digest] = gives_orders(text)
        if len(_GIVES_ORDERS) > _GIVES_ORDERS_KEPT:
            _GIVES_ORDERS.pop(next(iter(_GIVES_ORDERS)), None)
    return found


class KeptTurnItems(Protocol):
    """Where the manifest items of a kept window's turns are kept (`snapshot.KeptWindow`)."""

    turn_items: list[ManifestItem] | None


def untrusted_texts(turns: Sequence[TurnRecord], items: Sequence[RecalledItem]) -> dict[str, str]:
    """The text of each untrusted turn and item, under its manifest id (read only when the
    manifest item is made)."""
    texts = {f"turn:{t.seq}": t.content for t in turns if not t.trusted}
    texts.update((item.chunk_id, item.text) for item in items if not item.trusted)
    return texts


def build_manifest(
    assembled: AssembledPrompt,
    kept: KeptTurnItems | None,
    notes_dropped: Sequence[DroppedNote],
    about_dropped: Sequence[RecalledItem],
    untrusted: Mapping[str, str],
) -> list[ManifestItem]:
    """The assembler's entries, each item the notes' token cap left out right after the notes
    entry, then the remembered items left out because the notes hold them. `untrusted`: the
    texts `untrusted_texts` gives, checked for orders."""
    manifest = _manifest_items(assembled, kept, untrusted)
    # After the notes entry: each item the notes' token cap left out (no text, its turn has it).
    at = next((n + 1 for n, m in enumerate(manifest) if m.id == "notes"), len(manifest))
    manifest[at:at] = [
        ManifestItem(
            id=f"notes:{d.section}:{'memory' if d.seq is None else d.seq}",
            layer="c2",
            source=d.source,
            tokens=d.tokens,
            score=None,
            included=False,
            reason="notes_cap",
            trusted=d.source != "tool",
        )
        for d in notes_dropped
    ]
    manifest.extend(
        ManifestItem(
            id=item.chunk_id,
            layer="c2",
            source=item.source,
            tokens=0,
            score=item.score,
            included=False,
            reason="in_notes",
        )
        for item in about_dropped
    )
    return manifest


def _manifest_items(
    assembled: AssembledPrompt, kept: KeptTurnItems | None, untrusted: Mapping[str, str]
) -> list[ManifestItem]:
    """The assembler's entries as response items, in one validation of plain dicts (a recall
    build has one per window turn, ~300: pydantic-core builds the list ~3x faster than
    `model_construct` builds each item in Python, and ~25x faster than the constructor). When
    the build's window is a kept one and every turn is in the prompt, the turns' items are the
    ones made for it before (validating them was ~0.5 ms a build; checking a 55 KB tool result
    for orders ~7 ms on a busy 2-core machine, `python -m tests.domain.injection_cases`)."""
    entries = assembled.manifest
    if kept is None or assembled.excluded_turns or assembled.tail_turns or assembled.cleared_turns:
        return _validated(entries, untrusted)
    first = next((n for n, e in enumerate(entries) if e.layer == "c1"), len(entries))
    last = first + len(assembled.included_turns)
    if kept.turn_items is None:
        kept.turn_items = _validated(entries[first:last], untrusted)
    return [
        *_validated(entries[:first], untrusted),
        *kept.turn_items,
        *_validated(entries[last:], untrusted),
    ]


def _injection(entry: ManifestEntry, untrusted: Mapping[str, str]) -> bool:
    text = untrusted.get(entry.id)
    return text is not None and entry.source != "tool_result_stub" and _gives_orders_once(text)


def _validated(entries: list[ManifestEntry], untrusted: Mapping[str, str]) -> list[ManifestItem]:
    return _MANIFEST_ITEMS.validate_python(
        [
            {
                "id": e.id,
                "layer": e.layer,
                "source": e.source,
                "tokens": e.tokens,
                "score": None if e.score is None else float(e.score),
                "included": e.included,
                "reason": e.reason,
                "chunk_id": e.chunk_id,
                "injection": _injection(e, untrusted),
                "trusted": e.id not in untrusted,
            }
            for e in entries
        ]
    )


def recall_items(assembled: AssembledPrompt, recalled: list[RecalledItem]) -> list[RecalledItemOut]:
    """The recalled items the prompt includes, with the turns each covers and shows."""
    included = {item.chunk_id for item in assembled.recalled}
    return [
        RecalledItemOut(
            chunk_id=e.id,
            source="memory" if e.source == "memory" else "chunk",
            turn_range=_turn_range(recalled, e.id),
            turns=_shown_turns(assembled.recalled, e.id),
            score=e.score or 0.0,
            tokens=e.tokens,
        )
        for e in assembled.manifest
        if e.layer == "c3" and e.included and e.id in included
    ]


def _turn_range(items: list[RecalledItem], item_id: str) -> list[int] | None:
    for item in items:
        if item.chunk_id == item_id and item.turn_first is not None and item.turn_last is not None:
            return [item.turn_first, item.turn_last]
    return None


def _shown_turns(items: list[RecalledItem], item_id: str) -> list[int] | None:
    for item in items:
        if item.chunk_id == item_id and item.seqs is not None:
            return list(item.seqs)
    return None
