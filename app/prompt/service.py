"""build-prompt: gather C0, notes, recalled history and the window, then assemble within budget.

The order of work: (append x_t) → remember C0's size → emergency offload when the window no
longer fits → notes → recall (only once history was offloaded, in auto mode) → pure assembly.
Short sessions get exactly the baseline prompt and never touch the embedder or the indexes.
Each phase has its module: `prepare` (the writes and the budget), `snapshot` (the session and
its window as read), `gather` (notes, remembered items, recall, the offloaded tail), `assembly`
and `manifest` (pure); this one runs them in order and answers.
"""

import logging
import time
import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.context import AppContext
from app.core.cpu import off_loop
from app.core.observability import after_response, text_fields
from app.domain.callers import Caller
from app.domain.records import TurnRecord
from app.prompt.assembly import AssembledPrompt, AssemblyInput, PromptTooLarge, assemble_prompt
from app.prompt.blocks import shown_turns
from app.prompt.gather import (
    Gathered,
    gather,
    notes_and_emergency,
    offloaded_tail,
    recall_limits,
    recall_manifest,
    tool_clearing,
)
from app.prompt.manifest import build_manifest, recall_items, untrusted_texts
from app.prompt.prepare import BuildState, budget_exceeded, elapsed_ms, mandatory_chars, prepare
from app.prompt.schemas import (
    BuildPromptRequest,
    BuildPromptResponse,
    ManifestItem,
    PromptUsage,
    RecalledItemOut,
    RecallReport,
)
from app.prompt.snapshot import KeptWindow, Prefetched, kept_window, read_window
from app.recall.query_vectors import QueryVectors
from app.sessions.schemas import Usage, Watermark
from app.store import builds as builds_store
from app.store.sessions import session_budget

logger = logging.getLogger("contextd.prompt")


async def build_prompt(
    db: AsyncSession,
    context: AppContext,
    caller: Caller,
    session_id: str,
    req: BuildPromptRequest,
    prefetched: Prefetched | None = None,
) -> BuildPromptResponse:
    """Two phases. Writes first, for keys with `sessions:write` (the appended query, the system
    prompt's size, an emergency offload), committed before anything waits on the network; a
    read-only key's build writes nothing (spec §10). Then reads, recall and assembly, holding no
    lock. `prefetched`: the session and its window already read (ignored with an append)."""
    vectors = QueryVectors(context)
    try:
        return await _build_prompt(db, context, caller, session_id, req, prefetched, vectors)
    finally:
        vectors.cancel()  # an embedding nothing awaited (recall failed before needing it)


async def _build_prompt(
    db: AsyncSession,
    context: AppContext,
    caller: Caller,
    session_id: str,
    req: BuildPromptRequest,
    prefetched: Prefetched | None,
    vectors: QueryVectors,
) -> BuildPromptResponse:
    build = await prepare(db, context, caller, session_id, req, prefetched, vectors)
    stage = time.perf_counter()
    notes = await notes_and_emergency(db, context, caller, session_id, build)
    build.timings["notes_and_offload"] = elapsed_ms(stage)

    window = await read_window(db, build.session, build.snapshot, build.appended_seq)
    top_k, budget_tokens = recall_limits(build.config, req, build.emergency)
    gathered = await gather(db, context, req, build, window, notes.notes.notes, top_k, vectors)

    assembled, kept, tail = await _assemble_build(
        context, caller, session_id, req, build, window, notes.block, gathered, top_k, budget_tokens
    )
    # Untrusted text anywhere in the prompt is checked for orders: the offloaded tail a tool
    # loop shows before the window too.
    untrusted = untrusted_texts([*tail, *window], [*gathered.recalled, *gathered.about])
    manifest = build_manifest(
        assembled, kept, notes.notes.dropped, gathered.about_dropped, untrusted
    )
    if gathered.outcome is not None:
        recall_manifest(manifest, gathered.outcome)
    items = recall_items(assembled, gathered.recalled)
    response, build_id = _response(
        context, build, assembled, gathered, items, manifest, notes.notes.version
    )
    recall_hit = None if gathered.outcome is None else bool(items)
    await _finish(
        db, context, caller, session_id, req, build, assembled, response, build_id, recall_hit
    )
    return response


async def _assemble_build(
    context: AppContext,
    caller: Caller,
    session_id: str,
    req: BuildPromptRequest,
    build: BuildState,
    window: list[Any],
    notes_block: str,
    gathered: Gathered,
    top_k: int,
    budget_tokens: int,
) -> tuple[AssembledPrompt, KeptWindow | None, list[TurnRecord]]:
    """The window (and the offloaded tail a tool loop shows) with what was gathered, assembled
    within the budget; its flags and a cache bypass join the fallbacks. Returns the tail too."""
    settings = context.settings
    stage = time.perf_counter()
    kept = (
        kept_window(context, caller, session_id, build.session, window)
        if build.snapshot is not None
        else None
    )
    tail, chunk_of = await offloaded_tail(context, build.session, build.budget, window, kept)
    assembly = AssemblyInput(
        system=build.system,
        turns=shown_turns(window),
        query=req.query,
        budget=build.budget.available,
        recall_budget_tokens=budget_tokens,
        top_k=top_k,
        per_item_max_tokens=settings.recall.per_item_max_tokens,
        tools=req.tools,
        notes_block=notes_block,
        recalled=gathered.recalled,
        about_user=gathered.about,
        about_user_budget_tokens=settings.recall.user_memory_budget_tokens,
        about_user_top_k=settings.recall.user_memory_top_k,
        format=req.format,
        tail=shown_turns(tail),
        chunk_of=chunk_of,
        clearing=tool_clearing(build.config, req.tool_results),
        value_table_tokens=build.config.value_table_tokens,
    )
    assembled = await _assemble(assembly)
    build.timings["assemble"] = elapsed_ms(stage)
    build.fallbacks.extend(f for f in assembled.flags if f not in build.fallbacks)
    if context.cache.bypassed:
        build.fallbacks.append("cache_bypass")
    return assembled, kept, tail


async def _assemble(assembly: AssemblyInput) -> AssembledPrompt:
    """`assemble_prompt`, off the event loop for long text (the Anthropic format counts the
    window's text again; the system prompt and query are counted in either)."""
    chars = mandatory_chars(assembly.system, assembly.query)
    if assembly.format == "anthropic":
        chars += sum(len(t.content) for t in assembly.turns)
    try:
        return await off_loop(lambda: assemble_prompt(assembly), chars=chars)
    except PromptTooLarge as exc:
        raise budget_exceeded(exc) from exc


def _response(
    context: AppContext,
    build: BuildState,
    assembled: AssembledPrompt,
    gathered: Gathered,
    items: list[RecalledItemOut],
    manifest: list[ManifestItem],
    notes_version: int,
) -> tuple[BuildPromptResponse, uuid.UUID]:
    """The answer and its build id (`timings_ms.total` is taken before the id is drawn)."""
    outcome = gathered.outcome
    stored = session_budget(context.settings, build.session)
    build.timings["total"] = elapsed_ms(build.started)
    build_id = uuid.uuid4()
    response = BuildPromptResponse(
        build_id=str(build_id),
        messages=assembled.messages,
        system=assembled.system,
        usage=PromptUsage(
            c0=assembled.usage["c0"],
            c1=assembled.usage["c1"],
            c2=assembled.usage["c2"],
            recall=assembled.usage["recall"],
            query=assembled.usage["query"],
            total=assembled.usage["total"],
            limit=build.budget.available,
        ),
        watermark=Watermark.of(stored),
        session_usage=Usage.of(stored),
        recall=RecallReport(
            query_raw=outcome.query.raw if outcome else None,
            query_rewritten=outcome.query.rewritten if outcome else None,
            skipped_reason=gathered.skipped,
            items=items,
        ),
        fallbacks=build.fallbacks,
        notes_version=notes_version,
        manifest=manifest,
        timings_ms=build.timings,
    )
    return response, build_id


async def _finish(
    db: AsyncSession,
    context: AppContext,
    caller: Caller,
    session_id: str,
    req: BuildPromptRequest,
    build: BuildState,
    assembled: AssembledPrompt,
    response: BuildPromptResponse,
    build_id: uuid.UUID,
    recall_hit: bool | None,
) -> None:
    """Report the build once it is answered; store its manifest when a writer asks for it."""
    settings = context.settings
    timings, fallbacks = build.timings, build.fallbacks

    def report() -> None:
        _log_build(caller, session_id, response, with_text=settings.log_text)
        context.metrics.observe_build(
            stage_timings_ms=timings,
            usage=assembled.usage,
            fallbacks=fallbacks,
            recall_hit=recall_hit,
        )

    after_response(report)  # over HTTP once the answer is sent: the client does not wait for it
    if build.writes and (req.persist_manifest or settings.recall.persist_manifests):
        await builds_store.store_build(
            db,
            build_id,
            build.session,
            response.model_dump(mode="json", exclude={"messages", "system"}),
            keep=settings.recall.manifests_kept_per_session,
        )


def _log_build(
    caller: Caller, session_id: str, response: BuildPromptResponse, *, with_text: bool
) -> None:
    """One structured line per build with the fields of spec §7 and the tenant (over HTTP it
    stands for the access line too: `timings_ms.total` is the server's time); the query as its
    length and hash unless conversation text is logged on purpose (CONTEXTD_LOG_TEXT)."""
    logger.info(
        "build_prompt",
        extra={
            "tenant": caller.tenant_name,
            "session": session_id,
            "build_id": response.build_id,
            "usage_ratio": response.watermark.ratio,
            **text_fields("query_raw", response.recall.query_raw, with_text=with_text),
            **text_fields("query_rewritten", response.recall.query_rewritten, with_text=with_text),
            "recall_ids": [i.chunk_id for i in response.recall.items],
            "rerank_scores": [i.score for i in response.recall.items],
            "final_k": len(response.recall.items),
            "timings_ms": response.timings_ms,
            "fallbacks": response.fallbacks,
            "tokens_total": response.usage.total,
        },
    )
