"""Erasure, step two: the `memory:erase` job behind a forget or a session delete (and a session
delete's erase run inline by its request, `erase_now`).

The receipt is claimed first (an attempt counted, its row locked: two runs of one receipt take
turns, and the second finds it complete). For a forget, then the notes, rebuilt from the
remaining raw turns in a transaction of their own (a generator that fails retries the job before
anything is erased), and the receipt locked again. Then, in one transaction (for a session
delete, the claim's): Postgres, the session rows locked first (the lock order of
`app.store`; the receipt row, which only erase runs lock, before them): forgotten
turns blanked, tombstoned chunks stripped of raw text, terms, tsvector and embedding (status
`erased`), tombstoned memories blanked, stored build manifests quoting the text deleted, a
deleted session's rows deleted, and erased remembered items taken out of other sessions' notes;
then Redis: the keys about the session deleted and a scan of the key prefix deletes any string
value that still quotes an erased text; then the receipt completed with what each store did,
and the commit. A failure anywhere rolls all of it back and retries the job (every step is
idempotent); each attempt is counted on the receipt.
"""

import contextlib
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from redis.asyncio import RedisCluster
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.core.cache import CACHE_ERRORS, Cache, Client
from app.core.config import Settings
from app.core.db import commit, retrying_transaction
from app.erasure.derived import drop_from_notes
from app.notes.service import refresh_notes
from app.store import builds as builds_store
from app.store import chunks as chunks_store
from app.store import memory_erasure as memory_erasure_store
from app.store import receipts as receipts_store
from app.store import scratchpads as scratchpads_store
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Session, SessionKey
from app.store.sessions import session_cache_key

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
    tenant_id: uuid.UUID,
    receipt_id: uuid.UUID,
) -> bool:
    """The job body. False when the receipt is gone or already complete."""
    async with maker() as db:
        claimed = await _counting_attempt(
            db,
            tenant_id,
            receipt_id,
            lambda: _claim_or_erase_session(db, settings, cache, tenant_id, receipt_id),
        )
        if not isinstance(claimed, tuple):
            return claimed
        session_pk = uuid.UUID(claimed[0]["session_pk"])
        # Notes from the remaining raw turns (the forgotten ones are marked since the request):
        # no item derived from an erased source survives. First, and on their own: a generator
        # that fails leaves the receipt pending and every erased text for the retry's hunt, and
        # no session row is held while an LLM answers.
        rebuilt = await refresh_notes(
            db, settings, cache, tenant_id, session_pk, rebuild=True, llm_client=llm_client
        )
        await commit(db)
        if rebuilt == "failed":
            raise NotesRebuildFailed(f"notes rebuild of session {session_pk} failed, will retry")
        notes = {"notes": _stamp({"rebuilt_from_raw_turns": rebuilt})}
        return await retrying_transaction(
            db, lambda: _erase_pending(db, settings, cache, tenant_id, receipt_id, notes)
        )


async def erase_now(
    db: AsyncSession, settings: Settings, cache: Cache, tenant_id: uuid.UUID, receipt_id: uuid.UUID
) -> bool:
    """A session delete's erase, inline in the request that tombstoned it (committed): True
    when the receipt is complete. The request's erase job stays queued, a little later, for a
    process that dies meanwhile; run twice, the second run finds the receipt complete."""
    done = await _counting_attempt(
        db,
        tenant_id,
        receipt_id,
        lambda: _claim_or_erase_session(db, settings, cache, tenant_id, receipt_id),
    )
    return done is True


Claimed = tuple[dict[str, Any], uuid.UUID]


async def _counting_attempt(
    db: AsyncSession,
    tenant_id: uuid.UUID,
    receipt_id: uuid.UUID,
    work: Callable[[], Awaitable[bool | Claimed]],
) -> bool | Claimed:
    """`work` in a retried transaction; one that fails is still counted on the receipt (its
    own count rolled back with it)."""
    try:
        return await retrying_transaction(db, work)
    except Exception:
        await db.rollback()
        db.info.pop("after_commit", None)  # actions of the rolled back attempt
        with contextlib.suppress(DBAPIError):  # the database is down: the job's retry counts
            await receipts_store.count_attempt(db, tenant_id, receipt_id)
            await commit(db)
        raise


async def _claim_or_erase_session(
    db: AsyncSession, settings: Settings, cache: Cache, tenant_id: uuid.UUID, receipt_id: uuid.UUID
) -> bool | Claimed:
    """One transaction: count an attempt on the receipt and lock it (a second run of the same
    receipt, the job's and the request's, waits here, then finds it complete). A session
    delete is erased and completed in the same transaction, returning True; a forget's
    target is returned (the attempt committed) for its notes rebuild; False: no receipt to
    erase."""
    target = await receipts_store.claim_attempt(db, tenant_id, receipt_id)
    if target is None:
        return False
    claimed = (target, tenant_id)
    if target["kind"] != "session":
        return claimed
    await _erase_and_complete(db, settings, cache, receipt_id, claimed, {})
    return True


async def _erase_pending(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    tenant_id: uuid.UUID,
    receipt_id: uuid.UUID,
    notes: dict[str, Any],
) -> bool:
    """A forget's rows, cached copies and completion, its receipt locked first."""
    target = await receipts_store.lock_pending(db, tenant_id, receipt_id)
    if target is None:
        return False
    await _erase_and_complete(db, settings, cache, receipt_id, (target, tenant_id), notes)
    return True


async def _erase_and_complete(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    receipt_id: uuid.UUID,
    claimed: Claimed,
    notes: dict[str, Any],
) -> None:
    """Rows, then cached copies, then the receipt, in the caller's transaction. The cache is
    hunted before the commit: a run that ends between the two leaves every erased text in its
    rows for the retry's hunt (after the commit, a retry would have nothing left to hunt
    with), and the receipt completes with the rows."""
    target, tenant_pk = claimed
    session_pk = uuid.UUID(target["session_pk"])
    stores, texts = await _erase_rows(db, settings, cache, tenant_pk, session_pk, target)
    redis_report = await _erase_cached(cache, session_pk, target, needles(texts))
    stores = {**stores, **notes, "redis": redis_report}
    await receipts_store.complete_receipt(db, tenant_pk, receipt_id, stores, datetime.now(UTC))


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
    first, together (the lock order of `app.store`); which ones is read before."""
    memory_ids = [uuid.UUID(m) for m in target.get("memory_ids", [])]
    if target["kind"] == "session":
        memories, quoted = await memory_erasure_store.session_memory_texts(
            db, tenant_pk, session_pk
        )
    else:
        quoted = await memory_erasure_store.tombstoned_texts(db, tenant_pk, memory_ids)
    quoting = await scratchpads_store.sessions_quoting_remembered(db, tenant_pk, quoted)
    locked = await sessions_store.lock_sessions(db, tenant_pk, [session_pk, *quoting])
    session = SessionKey(tenant_pk, session_pk)
    if target["kind"] == "session":
        present = any(s.id == session_pk for s in locked)
        stores, texts = await _delete_session_rows(db, session, present, memories, quoted)
    else:
        stores, texts = await _erase_targets(db, session, target, memory_ids)
    others = [s for s in locked if s.id != session_pk]
    stores["other_notes"] = await _drop_from_other_notes(db, settings, cache, others)
    return stores, texts


async def _erase_targets(
    db: AsyncSession, session: SessionKey, target: dict[str, Any], memory_ids: list[uuid.UUID]
) -> tuple[dict[str, Any], list[str]]:
    """Erase a forget's targets; returns the receipt's stores and every erased text."""
    turns, turn_texts = await turns_store.erase_turns(db, *session)
    chunks, embeddings, chunk_texts = await chunks_store.erase_chunks(db, *session)
    memories, memory_texts = await memory_erasure_store.erase_memories(
        db, session.tenant_id, memory_ids
    )
    texts = [*turn_texts, *chunk_texts, *memory_texts]
    ids = [*target.get("chunk_ids", []), *target.get("memory_ids", [])]
    builds = await builds_store.delete_builds_quoting(db, *session, [*needles(texts), *ids])
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
    db: AsyncSession, session: SessionKey, present: bool, memories: int, memory_texts: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """Delete a session's rows (its row locked by the caller, when `present`; `memories`: the
    items it holds, with their texts); returns as `_erase_targets` does. The texts are read
    first, to hunt their cached copies; the rows go with the session row, not blanked first."""
    if not present:  # a retry after the delete committed
        return {"session": _stamp({"deleted": True, "already": True})}, []
    turns, turn_texts = await turns_store.session_turn_texts(db, *session)
    chunks, embeddings, chunk_texts = await chunks_store.session_chunk_texts(db, *session)
    # Turns, chunks, notes, memories and metrics go with the row (ON DELETE CASCADE).
    await sessions_store.delete_session(db, *session)
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
        if not sessions_store.erasing(other):
            await drop_from_notes(db, settings, cache, other, set())
            updated += 1
    return _stamp({"sessions_updated": updated})


SCAN_PAGE = 500


def _key_text(key: Any) -> str:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)


async def _doomed(
    client: Client, keys: list[Any], about: tuple[str, ...], found: list[str]
) -> list[Any]:
    """Those of `keys` about the target (any of `about` in the key) or whose string value quotes
    any of `found` (MGET answers nil for a key that holds no string; on a cluster, one MGET per
    slot)."""
    if not keys:
        return []
    doomed = []
    values: list[Any]
    if not found:
        values = [None] * len(keys)
    elif isinstance(client, RedisCluster):
        values = await client.mget_nonatomic(keys)
    else:
        values = await client.mget(keys)
    for key, value in zip(keys, values, strict=True):
        if any(a in _key_text(key) for a in about):
            doomed.append(key)
        elif value is not None:
            body = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            if any(n in body for n in found):
                doomed.append(key)
    return doomed


async def _erase_cached(
    cache: Cache, session_pk: uuid.UUID, target: dict[str, Any], found: list[str]
) -> dict[str, Any]:
    """One scan of our key prefix (of every primary of a cluster), a page at a time: the keys
    about the session (its notes versions, which name its row id after the tag; for a deleted
    session, every key naming it or tagged with it) and any value quoting an erased text,
    deleted with one command (one per slot on a cluster)."""
    client = cache.client
    if client is None:
        return _stamp({"configured": False})
    prefix = cache.prefix
    about: tuple[str, ...] = (f"}}:{session_pk}:",)
    deleted = scanned = 0
    try:
        doomed: list[Any] = []
        if target["kind"] == "session":
            about = (str(session_pk),)
            tenant = target.get("tenant_id")
            if tenant:
                doomed.append(session_cache_key(cache, uuid.UUID(tenant), target["session_id"]))
                about += (cache.session_tag(uuid.UUID(tenant), target["session_id"]),)
        page: list[Any] = []
        async for key in client.scan_iter(match=f"{prefix}:*", count=SCAN_PAGE):
            page.append(key)
            if len(page) == SCAN_PAGE:
                doomed.extend(await _doomed(client, page, about, found))
                scanned, page = scanned + len(page), []
        doomed.extend(await _doomed(client, page, about, found))
        scanned += len(page)
        if doomed:
            deleted = int(await client.delete(*doomed))
    except CACHE_ERRORS as exc:
        raise RuntimeError(f"redis erase failed, will retry: {exc}") from exc
    return _stamp({"keys_deleted": deleted, "keys_scanned": scanned})
