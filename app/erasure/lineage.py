"""What a revocation took with it (pure): the derived items an erase receipt lists — each
chunk, notes line, remembered item, embedding, stored manifest and cached copy removed — and
the seconds until the last copy was gone (issue 36, item 7)."""

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from app.erasure.schemas import DerivedItem, EraseReceiptOut
from app.notes.schemas import Notes
from app.store.models import EraseReceipt


def lines_removed(before: Notes, after: Notes) -> int:
    """Notes lines of `before` that `after` no longer holds (a line: section, turn and text)."""
    kept = {(name, item.seq, item.text) for name, items in after.sections() for item in items}
    return sum(
        (name, item.seq, item.text) not in kept
        for name, items in before.sections()
        for item in items
    )


def derived_at_request(
    chunks: Iterable[uuid.UUID], notes_lines: int, memories: Iterable[uuid.UUID]
) -> list[dict[str, Any]]:
    """What the request took out of reach at once, for the receipt's target."""
    out: list[dict[str, Any]] = [{"kind": "chunk", "id": str(c), "count": 1} for c in chunks]
    out += [{"kind": "memory", "id": str(m), "count": 1} for m in memories]
    if notes_lines:
        out.append({"kind": "notes_line", "id": None, "count": notes_lines})
    return out


# (store of the receipt, its count, the kind of derived item): what the erase itself removed.
_ERASED: tuple[tuple[str, str, str], ...] = (
    ("embeddings", "erased", "embedding"),
    ("embeddings", "deleted", "embedding"),
    ("memories", "deleted", "memory"),
    ("prompt_builds", "deleted", "prompt_build"),
    ("redis", "keys_deleted", "cached_copy"),
    ("other_notes", "sessions_updated", "other_session_notes"),
)


def derived_items(target: Mapping[str, Any], stores: Mapping[str, Any]) -> list[DerivedItem]:
    """Each derived thing removed: those the request listed, then the erase's counts (a
    session's stored manifests are all deleted with it: counted as one entry, -1)."""
    items = [DerivedItem.model_validate(d) for d in target.get("derived", [])]
    for store, field, kind in _ERASED:
        value = (stores.get(store) or {}).get(field)
        if isinstance(value, bool) or value is None:
            continue
        count = value if isinstance(value, int) else -1
        if count:
            items.append(DerivedItem(kind=kind, id=None, count=count))
    return items


def receipt_out(receipt: EraseReceipt) -> EraseReceiptOut:
    """A receipt as callers see it (without the internal keys of its target)."""
    hidden = ("session_pk", "tenant_id", "derived")
    target = {k: v for k, v in receipt.target.items() if k not in hidden}
    done = receipt.completed_at
    return EraseReceiptOut(
        receipt_id=str(receipt.id),
        session_id=receipt.session_external_id,
        target=target,
        status=receipt.status,
        stores=receipt.stores,
        derived=derived_items(receipt.target, receipt.stores or {}),
        seconds_to_gone=None if done is None else (done - receipt.requested_at).total_seconds(),
        attempts=receipt.attempts,
        requested_at=receipt.requested_at,
        completed_at=done,
    )
