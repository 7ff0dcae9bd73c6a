"""Forget, step two (the `memory:erase` job), and the whole-session delete that shares it.

Postgres first, in one transaction: forgotten turns blanked, tombstoned chunks stripped of raw
text, terms, tsvector and embedding (status `erased`), tombstoned memories blanked, stored build
manifests quoting the text deleted, and the notes rebuilt from the remaining raw turns. Then Redis:
the session's notes cache keys deleted and a scan of the key prefix deletes any string value
that still quotes an erased text. Then the receipt is completed with what each store did. A failure
anywhere retries the job (every step is idempotent); each attempt is counted on the receipt.
"""

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.schemas import Caller
from app.core.cache import Cache
from app.core.config import Settings
from app.core.db import after_commit, unit_of_work
from app.db.models import Session
from app.jobs.queue import TaskName, enqueue, session_lock
from app.memory import repository
from app.notes.service import refresh_notes
from app.sessions.service import require_session, session_cache_key, write_session

NEEDLE_CHARS = 40
MAX_NEEDLES = 2_000
_CJK_CHARS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_DISTINCT = re.compile(rf"[{_CJK_CHARS}]{{4,}}|(?:(?![{_CJK_CHARS}])[^\W_]){{6,}}")
_CJK = re.compile(rf"[{_CJK_CHARS}]{{4,}}")
TOMBSTONE_PREFIX = "~erasing~"  # outside SESSION_ID_PATTERN: no request can name it


async def delete_session(db: AsyncSession, caller: Caller, cache: Cache, session_id: str) -> str:
    """Tombstone the whole session now (it is a 404 from this commit on, and its id free for
    reuse) and enqueue the job that erases it. Returns the erase receipt id."""
    session = await require_session(db, caller, session_id)
    now = datetime.now(UTC)
    await repository.tombstone_session_rows(db, session.id, now)
    key = session_cache_key(cache, caller.tenant_id, session_id)
    version = await write_session(
        db,
        cache,
        session,
        external_id=f"{TOMBSTONE_PREFIX}{session.id}",
        chunks_version=Session.chunks_version + 1,  # every active chunk was just tombstoned
    )

    async def _retire_cached_view() -> None:  # write_session saw the row's new external id
        await cache.invalidate_versioned(key, version)

    after_commit(db, _retire_cached_view)
    receipt = await repository.add_receipt(
        db,
        caller.tenant_id,
        session_id,
        {
            "kind": "session",
            "session_pk": str(session.id),
            "session_id": session_id,
            "tenant_id": str(caller.tenant_id),
        },
    )
    await enqueue(
        db, TaskName.ERASE, {"receipt_id": str(receipt.id)}, lock=session_lock(session.id)
    )
    return str(receipt.id)


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


async def run_erase(
    maker: async_sessionmaker[AsyncSession], settings: Settings, cache: Cache, receipt_id: uuid.UUID
) -> bool:
    """The job body. False when the receipt is gone or already complete."""
    async with unit_of_work(maker) as db:
        receipt = await repository.get_receipt(db, receipt_id)
        if receipt is None or receipt.status == "completed":
            return False
        await repository.count_attempt(db, receipt_id)
        target = dict(receipt.target)
    session_pk = uuid.UUID(target["session_pk"])
    async with unit_of_work(maker) as db:
        if target["kind"] == "session":
            stores, texts = await _erase_session_rows(db, session_pk)
        else:
            stores, texts = await _erase_targets(db, settings, cache, session_pk, target)
    redis_report = await _erase_cached(cache, session_pk, target, needles(texts))
    stores["redis"] = redis_report
    async with unit_of_work(maker) as db:
        await repository.complete_receipt(db, receipt_id, stores, datetime.now(UTC))
    return True


def _stamp(report: dict[str, Any]) -> dict[str, Any]:
    return {**report, "at": datetime.now(UTC).isoformat()}


async def _erase_targets(
    db: AsyncSession,
    settings: Settings,
    cache: Cache,
    session_pk: uuid.UUID,
    target: dict[str, Any],
) -> tuple[dict[str, Any], list[str]]:
    turns, turn_texts = await repository.erase_turns(db, session_pk)
    chunks, embeddings, chunk_texts = await repository.erase_chunks(db, session_pk)
    memory_ids = [uuid.UUID(m) for m in target.get("memory_ids", [])]
    memories, memory_texts = await repository.erase_memories(db, memory_ids)
    texts = [*turn_texts, *chunk_texts, *memory_texts]
    ids = [*target.get("chunk_ids", []), *target.get("memory_ids", [])]
    builds = await repository.delete_prompt_builds(db, session_pk, [*needles(texts), *ids])
    # Notes from the remaining raw turns: no item derived from an erased source survives.
    rebuilt = await refresh_notes(db, settings, cache, session_pk, rebuild=True)
    stores = {
        "turns": _stamp({"erased": turns}),
        "chunks": _stamp({"erased": chunks, "raw_text": "cleared"}),
        "embeddings": _stamp({"erased": embeddings}),
        "lexical": _stamp(
            {"tsvector": "cleared", "term_counts": "cleared", "rows": chunks + memories}
        ),
        "memories": _stamp({"erased": memories}),
        "notes": _stamp({"rebuilt_from_raw_turns": rebuilt}),
        "prompt_builds": _stamp({"deleted": builds}),
    }
    return stores, texts


async def _erase_session_rows(
    db: AsyncSession, session_pk: uuid.UUID
) -> tuple[dict[str, Any], list[str]]:
    session = await db.get(Session, session_pk)
    if session is None:  # a retry after the delete committed
        return {"session": _stamp({"deleted": True, "already": True})}, []
    _, turn_texts = await repository.erase_turns(db, session_pk)
    _, _, chunk_texts = await repository.erase_chunks(db, session_pk)
    memory_texts = await repository.session_memory_texts(db, session_pk)
    counts = await repository.delete_session_row(db, session_pk)
    stores = {
        "session": _stamp({"deleted": True}),
        "turns": _stamp({"deleted": counts["turns"]}),
        "chunks": _stamp({"deleted": counts["chunks"], "raw_text": "deleted"}),
        "embeddings": _stamp({"deleted": counts["embeddings"]}),
        "lexical": _stamp({"tsvector": "deleted", "term_counts": "deleted"}),
        "memories": _stamp({"deleted": counts["memories"]}),
        "notes": _stamp({"scratchpad": "deleted"}),
        "prompt_builds": _stamp({"deleted": "all of the session"}),
    }
    return stores, [*turn_texts, *chunk_texts, *memory_texts]


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
        # Anything else under our prefix that quotes an erased text.
        if found:
            async for key in client.scan_iter(match=f"{prefix}:*", count=500):
                scanned += 1
                if await client.type(key) not in (b"string", "string"):
                    continue
                value = await client.get(key)
                if value is None:
                    continue
                body = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
                if any(n in body for n in found):
                    doomed.append(key)
        if doomed:
            deleted = int(await client.delete(*doomed))
    except (RedisError, OSError) as exc:
        raise RuntimeError(f"redis erase failed, will retry: {exc}") from exc
    return _stamp({"keys_deleted": deleted, "keys_scanned": scanned})
