"""The revocation, expiry and budget scenarios of `contextd eval trust` (`app.eval.trust`), run
over HTTP against a running contextd and worker."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from app.eval.driver import check_response
from app.eval.notes_driver import _final_offload, _wait_notes
from app.eval.trust import (
    BUDGET_LIMITS,
    BudgetCase,
    BudgetResult,
    ExpiryCase,
    ExpiryResult,
    RevocationCase,
    RevocationResult,
    filler,
    holds,
    notes_texts,
)
from app.eval.trust_http import (
    POLL_S,
    TrustConfig,
    append,
    build,
    configure,
    memory_call,
    notes_block,
    prompt_text,
    tool_turns,
)

LOOKUP = {"en": "Look up my parcel, please.", "zh": "帮我查一下包裹。"}
EXPIRY_SECONDS = 4.0  # how far ahead the expiring item's `valid_until` is set
KEEP_IN_OPEN = ("untrusted_source",)  # kinds whose raw turn and chunk stay (labelled untrusted)


def _showing(texts: list[str], values: tuple[str, ...]) -> int:
    return sum(any(holds(t, v) for v in values) for t in texts)


async def _json_or_none(http: Any, path: str, what: str) -> Any | None:
    """The answer of a GET, None when the thing is gone (404)."""
    resp = await http.get(path)
    return None if resp.status_code == 404 else check_response(resp, what)


async def _in_force_texts(http: Any, sid: str) -> list[str]:
    listed = await _json_or_none(http, f"/v1/sessions/{sid}/memories", f"memories {sid}")
    return [] if listed is None else [m["text"] for m in listed["memories"] if m["in_force"]]


async def _served(
    http: Any, sid: str, probe: str, values: tuple[str, ...], query: str, kind: str
) -> list[str]:
    """The places serving a value: notes, active chunks, recall, items in force, prompts."""
    found: list[str] = []
    pad = await _json_or_none(http, f"/v1/sessions/{sid}/scratchpad", f"scratchpad {sid}")
    if pad is not None:
        found += ["notes"] * _showing(notes_texts(pad["notes"]), values)
    for where in dict.fromkeys((sid, probe)):
        found += ["memories"] * _showing(await _in_force_texts(http, where), values)
    if kind not in KEEP_IN_OPEN:
        found += await _raw_places(http, sid, values, query)
    for where in (probe,) if kind in ("session", "user") else (sid, probe):
        # A deleted session is not built: a build would create it again, empty. Of a session
        # whose source stays in the open, the notes block: its recalled history may quote the
        # raw turn, labelled untrusted.
        built = await build(http, where, query)
        shown = notes_block(built) if where == sid and kind in KEEP_IN_OPEN else prompt_text(built)
        if _showing([shown], values):
            found.append(f"prompt {'probe' if where == probe else 'session'}")
    return found


async def _raw_places(http: Any, sid: str, values: tuple[str, ...], query: str) -> list[str]:
    """Active chunks and recall matches of the session holding a value."""
    found: list[str] = []
    listed = await _json_or_none(http, f"/v1/sessions/{sid}/chunks", f"chunks {sid}")
    for chunk in [] if listed is None else listed["chunks"]:
        if chunk["status"] == "active":
            one = await _json_or_none(
                http, f"/v1/sessions/{sid}/chunks/{chunk['chunk_id']}", "chunk"
            )
            if one is not None and _showing([one["raw_text"]], values):
                found.append("chunk")
    recall = await http.post(f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": query})
    if recall.status_code != 404:
        matches = check_response(recall, f"recall {sid}")["data"].get("matches", [])
        found += ["recall"] * _showing([m["text"] for m in matches], values)
    return found


async def _stored(http: Any, sid: str, values: tuple[str, ...], kind: str) -> list[str]:
    """The inspector's page of the session: stored manifests, notes and items (404: none)."""
    if kind in KEEP_IN_OPEN:
        return []
    page = await http.get(f"/inspect/sessions/{sid}")
    return ["inspector"] if page.status_code != 404 and _showing([page.text], values) else []


async def _until_none(
    cfg: TrustConfig, places: Callable[[], Awaitable[list[str]]]
) -> tuple[int, float | None]:
    """Poll `places` from now: (places left at the end, seconds until none; None past the
    deadline)."""
    started = time.monotonic()
    while True:
        left = await places()
        if not left:
            return 0, time.monotonic() - started
        if time.monotonic() - started > cfg.timeout_s:
            return len(left), None
        await asyncio.sleep(POLL_S)


async def _revoke(http: Any, sid: str, user: str, kind: str, tool_seq: int, tool: str) -> None:
    if kind == "turn":
        await memory_call(http, sid, {"type": "forget", "turn_range": [1, 1]})
    elif kind == "tool_result":
        await memory_call(http, sid, {"type": "forget", "turn_range": [tool_seq, tool_seq]})
    elif kind == "session":
        check_response(await http.delete(f"/v1/sessions/{sid}"), f"delete {sid}")
    elif kind == "user":
        check_response(await http.delete(f"/v1/users/{user}"), f"delete user {user}")
    else:
        body = {"tool": tool}
        resp = await http.post(f"/v1/sessions/{sid}/sources/untrust", json=body)
        check_response(resp, f"untrust {sid}")


async def revocation(
    http: Any, cfg: TrustConfig, case: RevocationCase, kind: str
) -> RevocationResult:
    """One revocation of `kind` (the module docstring of `app.eval.trust`)."""
    user = f"trust-revoke-{kind}-{case.language}-{cfg.run_id}"
    sid, probe = f"{user}-s0", f"{user}-s1"
    await configure(http, sid, user)
    turns = tool_turns(case.language, LOOKUP[case.language], case.tool, case.result)
    seqs = await append(http, sid, [{"role": "user", "content": case.turn}, *turns])
    tool_seq = seqs[3]  # the user turn, the request, the call, then the result
    from_tool = kind in ("tool_result", "untrusted_source")
    item: dict[str, Any] = {"text": case.tool_item if from_tool else case.turn_item}
    item |= (
        {"source": "api", "source_tool": case.tool, "turn_seqs": [tool_seq]}
        if from_tool
        else {"source": "user_turn", "turn_seqs": [1]}
    )
    resp = await http.post(f"/v1/sessions/{sid}/memories", json={"scope": "user", **item})
    check_response(resp, f"remember {sid}")
    await _final_offload(http, sid)
    await _wait_notes(http, [sid], cfg.timeout_s)
    await configure(http, probe, user)
    for where in (sid, probe):  # stored manifests, for the erase to find
        await build(http, where, case.query, persist_manifest=True)
    values = case.values(kind)
    before = await _served(http, sid, probe, values, case.query, "turn")
    await _revoke(http, sid, user, kind, tool_seq, case.tool)
    if kind == "user":  # every session of the user went: a new one of the same user
        probe = f"{user}-s2"
        await configure(http, probe, user)
    served = await _served(http, sid, probe, values, case.query, kind)

    async def places() -> list[str]:
        return [
            *await _served(http, sid, probe, values, case.query, kind),
            *await _stored(http, sid, values, kind),
        ]

    left, seconds = await _until_none(cfg, places)
    return RevocationResult(case.language, kind, len(before), len(served), left, seconds, served)


async def expiry(http: Any, cfg: TrustConfig, case: ExpiryCase) -> ExpiryResult:
    """An item with a `valid_until` a few seconds ahead: shown before, stale after?"""
    user = f"trust-expiry-{case.language}-{cfg.run_id}"
    sid, probe = f"{user}-s0", f"{user}-s1"
    await configure(http, sid, user)
    await append(http, sid, [{"role": role, "content": t} for role, t in filler(case.language)])
    until = datetime.now(UTC) + timedelta(seconds=EXPIRY_SECONDS)
    body = {"text": case.text, "scope": "user", "valid_until": until.isoformat()}
    check_response(await http.post(f"/v1/sessions/{sid}/memories", json=body), "remember")
    await configure(http, probe, user)
    current = holds(prompt_text(await build(http, probe, case.query)), case.term)
    while datetime.now(UTC) <= until:  # the moment itself is what the scenario waits for
        await asyncio.sleep(POLL_S)
    where = [
        name
        for name, at in (("session", sid), ("probe", probe))
        if holds(prompt_text(await build(http, at, case.query)), case.term)
    ]
    return ExpiryResult(case.language, current, bool(where), where)


async def budget(http: Any, cfg: TrustConfig, case: BudgetCase) -> list[BudgetResult]:
    """Tiny builds of a session with a noted constraint, an injected order in its window and an
    updated fact of its user."""
    user = f"trust-budget-{case.language}-{cfg.run_id}"
    sid, earlier = f"{user}-s0", f"{user}-old"
    inj, update = case.injection, case.update
    for at, text in ((earlier, update.old), (sid, update.new)):
        await configure(http, at, user)
        await memory_call(
            http, at, {"type": "remember", "text": text, "key": update.key, "scope": "user"}
        )
    said = [{"role": role, "content": text} for role, text in filler(case.language)]
    await append(http, sid, [{"role": "user", "content": case.constraint}, *said])
    await _final_offload(http, sid)
    await _wait_notes(http, [sid], cfg.timeout_s)
    await append(http, sid, tool_turns(case.language, inj.request, inj.tool, inj.result)[:4])
    results = []
    for limit in BUDGET_LIMITS:
        options = {"context_limit": limit, "reserve_tokens": limit // 10}
        resp = await http.post(
            f"/v1/sessions/{sid}/build-prompt", json={"query": inj.request, **options}
        )
        if resp.status_code == 422:
            results.append(BudgetResult(case.language, limit, False, False, False, False))
            continue
        text = prompt_text(check_response(resp, f"build {sid} at {limit}"))
        kept, order = holds(text, case.constraint_term), holds(text, inj.order)
        stale = holds(text, update.old_term)
        results.append(BudgetResult(case.language, limit, True, kept, order, stale))
    return results
