"""Erasure, step two: the `memory:erase` job behind a forget or a session delete.

For a forget, first the notes, rebuilt from the remaining raw turns in a transaction of their
own (a generator that fails retries the job before anything is erased). Then Postgres, in one
transaction that locks the session rows first (the lock order of `app.sessions.repository`):
forgotten turns blanked, tombstoned chunks stripped of raw text, terms, tsvector and embedding
(status `erased`), tombstoned memories blanked, stored build manifests quoting the text deleted,
a deleted session's rows deleted, and erased remembered items taken out of other sessions'
notes. Then Redis: the session's notes cache keys deleted and a scan of the key prefix deletes any
string value that still quotes an erased text. Then the receipt is completed with what each store
did. A failure anywhere retries the job (every step is idempotent); each attempt is counted on
the receipt.
"""

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import retrying_transaction, unit_of_work
from app.db.models import Session
from app.erasure import repository
from app.erasure.service import drop_from_notes
from app.memory import repository as memory_repository
from app.notes import repository as notes_repository
from app.notes.service import refresh_notes
from app.offload import repository as chunks_repository
from app.prompt import repository as builds_repository
from app.sessions import repository as sessions_repository
from app.sessions.service import session_cache_key

NEEDLE_CHARS = 40
MAX_NEEDLES = 2_000
_CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_DISTINCT = re.compile(rf"[{_CJK_CHARS}]{{4,}}|(?:(?![{_CJK_CHARS}])[^\W_]){{6,}}")
_CJK = re.compile(rf"[{_CJK_CHARS}]{{4,}}")


def needles(texts: list[str]) -> list[str]:
    """Fragments that betray a copy of an erased text: each line's start, and every word of 6+
    characters (or CJK run of 4+), raw and JSON-escaped. Over-matching only costs cache misses
    (Redis is a cache) and diagnostic manifests of the same session."""
    out: list[str] = []
    for text in texts:
        parts = [line.strip()[:NEEDLE_CHARS] for line in text.splitlines()]
        for found in _DISTINCT.findall(text):
            # A CJK run has no word breaks: any 4 characters of it may be what was copied.
            cjk = _CJK.match(found)
            parts.extend([found[i : i + 4] for i in range(len(found) - 3)] if cjk else [found])
        for part in parts:
            if len(part) >= 6 or (part and _CJK.match(part)):
                out.extend((part, json.dumps(part)[1:-1]))
    return list(dict.fromkeys(out))[:MAX_NEEDLES]


class NotesRebuildFailed(RuntimeError):
    """The notes could not be rebuilt from the remaining turns: the job is retried."""


async def run_erase(
    maker: async_sessionmaker[AsyncSession],
    settings: Settings,
    cache: Cache,
    llm_client: httpx.AsyncClient,
    receipt_id: uuid.UUID,
) -> bool:
    """The job body. False when the receipt is gone or already complete."""
    async with unit_of_work(maker) as db:
        claimed = await repository.claim_attempt(db, receipt_id)
    if claimed is None:
        return False
    target, tenant_pk = claimed
    session_pk = uuid.UUID(target["session_pk"])
    notes: dict[str, Any] = {}
    if target["kind"] != "session":
        # Notes from the remaining raw turns (the forgotten ones are marked since the request):
        # no item derived from an erased source survives. First, and on their own: a generator
        # that fails leaves the receipt pending and every erased text for the retry's hunt, and
        # no session row is held while an LLM answers.
        async with unit_of_work(maker) as db:
            rebuilt = await refresh_notes(
                db, settings, cache, session_pk, rebuild=True, llm_client=llm_client
            )
        if rebuilt == "failed":
            raise NotesRebuildFailed(f"notes rebuild of session {session_pk} failed, will retry")
        notes = {"notes": _stamp({"rebuilt_from_raw_turns": rebuilt})}
    async with maker() as db:
        stores, texts = await retrying_transaction(
            db, lambda: _erase_rows(db, settings, cache, tenant_pk, session_pk, target)
        )
    redis_report = await _erase_cached(cache, session_pk, target, needles(texts))
    stores = {**stores, **notes, "redis": redis_report}
    async with unit_of_work(maker) as db:
        await repository.complete_receipt(db, receipt_id, stores, datetime.now(UTC))
    return True


def _stamp(report: dict[str, Any]) -> dict[str, Any]:
    return {**report, "at": datetime.now(UTC).isoformat()}


async def _erase_rows(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    tenant_pk: uuid.UUID,
    session_pk: uuid.UUID,
    target: dict[str, Any],
) -> tuple[dict[str, Any], list[str]]:
    """The rows of the target, in one transaction: the receipt's stores and every erased text.

    The session and every other session whose notes quote an erased remembered item are locked
    first, together (the lock order of `app.sessions.repository`); which ones is read before."""
    memory_ids = [uuid.UUID(m) for m in target.get("memory_ids", [])]
    if target["kind"] == "session":
        memories, quoted = await memory_repository.session_memory_texts(db, session_pk)
    else:
        quoted = await memory_repository.tombstoned_texts(db, memory_ids)
    quoting = await notes_repository.sessions_quoting_remembered(db, tenant_pk, quoted)
    locked = await sessions_repository.lock_sessions(db, [session_pk, *quoting])
    if target["kind"] == "session":
        present = any(s.id == session_pk for s in locked)
        stores, texts = await _delete_session_rows(db, session_pk, present, memories, quoted)
    else:
        stores, texts = await _erase_targets(db, session_pk, target, memory_ids)
    others = [s for s in locked if s.id != session_pk]
    stores["other_notes"] = await _drop_from_other_notes(db, settings, cache, others)
    return stores, texts


async def _erase_targets(
    db: AsyncSession, session_pk: uuid.UUID, target: dict[str, Any], memory_ids: list[uuid.UUID]
) -> tuple[dict[str, Any], list[str]]:
    """Erase a forget's targets; returns the receipt's stores and every erased text."""
    turns, turn_texts = await sessions_repository.erase_turns(db, session_pk)
    chunks, embeddings, chunk_texts = await chunks_repository.erase_chunks(db, session_pk)
    memories, memory_texts = await memory_repository.erase_memories(db, memory_ids)
    texts = [*turn_texts, *chunk_texts, *memory_texts]
    ids = [*target.get("chunk_ids", []), *target.get("memory_ids", [])]
    builds = await builds_repository.delete_builds_quoting(db, session_pk, [*needles(texts), *ids])
    stores = {
        "turns": _stamp({"erased": turns}),
        "chunks": _stamp({"erased": chunks, "raw_text": "cleared"}),
        "embeddings": _stamp({"erased": embeddings}),
        "lexical": _stamp(
            {"tsvector": "cleared", "term_counts": "cleared", "rows": chunks + memories}
        ),
        "memories": _stamp({"erased": memories}),
        "prompt_builds": _stamp({"deleted": builds}),
    }
    return stores, texts


async def _delete_session_rows(
    db: AsyncSession, session_pk: uuid.UUID, present: bool, memories: int, memory_texts: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """Delete a session's rows (its row locked by the caller, when `present`; `memories`: the
    items it holds, with their texts); returns as `_erase_targets` does. The texts are read
    first, to hunt their cached copies; the rows go with the session row, not blanked first."""
    if not present:  # a retry after the delete committed
        return {"session": _stamp({"deleted": True, "already": True})}, []
    turns, turn_texts = await sessions_repository.session_turn_texts(db, session_pk)
    chunks, embeddings, chunk_texts = await chunks_repository.session_chunk_texts(db, session_pk)
    # Turns, chunks, notes, memories and metrics go with the row (ON DELETE CASCADE).
    await sessions_repository.delete_session(db, session_pk)
    stores = {
        "session": _stamp({"deleted": True}),
        "turns": _stamp({"deleted": turns}),
        "chunks": _stamp({"deleted": chunks, "raw_text": "deleted"}),
        "embeddings": _stamp({"deleted": embeddings}),
        "lexical": _stamp({"tsvector": "deleted", "term_counts": "deleted"}),
        "memories": _stamp({"deleted": memories}),
        "notes": _stamp({"scratchpad": "deleted"}),
        "prompt_builds": _stamp({"deleted": "all of the session"}),
    }
    return stores, [*turn_texts, *chunk_texts, *memory_texts]


async def _drop_from_other_notes(
    db: AsyncSession, settings: Settings, cache: Cache, others: list[Session]
) -> dict[str, Any]:
    """Erased remembered items out of every other session's notes still quoting them (`others`,
    locked): the request took them out of the user's most recent sessions only
    (`app.erasure.service.delete_session`); here go the rest, and sessions since moved to
    another user. A notes version written concurrently retries the job (`Conflict`)."""
    updated = 0
    for other in others:
        if not sessions_repository.erasing(other):
            await drop_from_notes(db, settings, cache, other, set())
            updated += 1
    return _stamp({"sessions_updated": updated})


SCAN_PAGE = 500


async def _quoting(client: Redis, keys: list[Any], found: list[str]) -> list[Any]:
    """Those of `keys` whose string value quotes any of `found`."""
    if not keys:
        return []
    quoting = []
    for key, value in zip(keys, await client.mget(keys), strict=True):
        if value is None:
            continue
        body = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if any(n in body for n in found):
            quoting.append(key)
    return quoting


async def _erase_cached(
    cache: Cache, session_pk: uuid.UUID, target: dict[str, Any], found: list[str]
) -> dict[str, Any]:
    client = cache.client
    if client is None:
        return _stamp({"configured": False})
    prefix = cache.key("")[: -len(":")]  # "<prefix>:v1"
    deleted = scanned = 0
    try:
        # Keys about the session: its notes versions (and, for a deleted session, everything).
        pattern = f"{prefix}:notes:{session_pk}:*"
        if target["kind"] == "session":
            pattern = f"{prefix}:*{session_pk}*"
        doomed = [k async for k in client.scan_iter(match=pattern, count=500)]
        if target["kind"] == "session":
            tenant = target.get("tenant_id")
            if tenant:
                doomed.append(session_cache_key(cache, uuid.UUID(tenant), target["session_id"]))
        # Anything else under our prefix that quotes an erased text: read a page of keys at a
        # time (MGET answers nil for a key that holds no string), not two round trips a key.
        if found:
            page: list[Any] = []
            async for key in client.scan_iter(match=f"{prefix}:*", count=SCAN_PAGE):
                page.append(key)
                if len(page) == SCAN_PAGE:
                    doomed.extend(await _quoting(client, page, found))
                    scanned, page = scanned + len(page), []
            doomed.extend(await _quoting(client, page, found))
            scanned += len(page)
        if doomed:
            deleted = int(await client.delete(*doomed))
    except (RedisError, OSError) as exc:
        raise RuntimeError(f"redis erase failed, will retry: {exc}") from exc
    return _stamp({"keys_deleted": deleted, "keys_scanned": scanned})
