"""LoCoMo evidence-recall evaluation (spec §8, shared/eval/README.md).

Pure parts (no I/O): loading a LoCoMo file, evidence-id normalisation, the seq ↔ dia_id mapping,
the metrics, and the offline baselines (plain BM25 over single turns, truncation). The driver
(`run_locomo`) talks to a *running* contextd over HTTP only.

Metric definitions (categories 1-4 make "overall"; category 5 is adversarial and excluded):
- evidence recall @B: fraction of a question's evidence dia_ids that are in the prompt built with an
  injected-recall budget of B tokens — covered by an included recalled item (its turn range) or
  already in the C1 window (those turns are in the prompt verbatim, and recall drops them by
  design). The window share is also reported on its own, and a "recalled only" variant.
- Recall@k: fraction of evidence dia_ids covered by the first k recalled items in rank order,
  regardless of budget (read from a build with a very large budget and context limit).
- injected tokens per query: `usage.recall` of the build (framing included).
Each question's figures are averaged (macro over questions), as in the LoCoMo paper.
"""

import asyncio
import json
import re
import statistics
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.core.text import terms
from app.core.tokens import count_tokens, message_tokens
from app.prompt.blocks import RecalledItem, render_item, render_recalled_block
from app.recall.bm25 import BM25Index

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SCORED_CATEGORIES = (1, 2, 3, 4)
_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE_RE = re.compile(r"D:?(\d+):0*(\d+)")
# Fallback flags that mean a degraded build (the others describe budget decisions).
DEGRADED_FLAGS = frozenset(
    {
        "vector_unavailable",
        "recall_unavailable",
        "rerank_unavailable",
        "cache_bypass",
        "emergency_offload_failed",
    }
)
RANKING_LIMIT = 1_000_000  # context limit and budget of the build that reads the full ranking


# ---------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    date: str
    image_caption: str | None = None

    @property
    def content(self) -> str:
        body = f"{self.speaker}: {self.text}"
        if self.image_caption:
            body += f" [image: {self.image_caption}]"
        return body


@dataclass(frozen=True, slots=True)
class Question:
    question: str
    category: int
    evidence: tuple[str, ...]  # normalised, existing dia_ids
    raw_evidence: tuple[str, ...]
    dropped: tuple[str, ...]  # evidence parts that could not be mapped to a turn


@dataclass(frozen=True, slots=True)
class Conversation:
    sample_id: str
    speaker_a: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]


def normalise_evidence(raw: Iterable[str], known: Iterable[str]) -> tuple[list[str], list[str]]:
    """Map LoCoMo evidence strings to existing dia_ids; return (ids, dropped parts).

    Each string may hold several ids joined by `;`, `,` or spaces ('D8:6; D9:17'); an id may carry
    a stray colon after D ('D:11:26' → 'D11:26') or a zero-padded turn ('D30:05' → 'D30:5').
    Anything that does not parse ('D'), or names a turn that does not exist, is dropped; duplicates
    are kept once, in order.
    """
    known_ids = set(known)
    ids: list[str] = []
    dropped: list[str] = []
    for entry in raw:
        for part in re.split(r"[;,\s]+", str(entry).strip()):
            if not part:
                continue
            match = _EVIDENCE_RE.fullmatch(part)
            dia_id = f"D{int(match.group(1))}:{int(match.group(2))}" if match else None
            if dia_id is None or dia_id not in known_ids:
                dropped.append(part)
            elif dia_id not in ids:
                ids.append(dia_id)
    return ids, dropped


def parse_conversation(sample: Mapping[str, Any]) -> Conversation:
    conv = sample["conversation"]
    numbers = sorted(
        int(m.group(1)) for key in conv if (m := _SESSION_KEY.fullmatch(key)) is not None
    )
    turns: list[Turn] = []
    for n in numbers:
        date = str(conv.get(f"session_{n}_date_time", ""))
        for t in conv[f"session_{n}"]:
            turns.append(
                Turn(
                    dia_id=str(t["dia_id"]),
                    session=n,
                    speaker=str(t["speaker"]),
                    text=str(t.get("text", "")),
                    date=date,
                    image_caption=t.get("blip_caption") or None,
                )
            )
    known = [t.dia_id for t in turns]
    questions = []
    for qa in sample.get("qa", []):
        raw = tuple(str(e) for e in qa.get("evidence", []))
        ids, dropped = normalise_evidence(raw, known)
        questions.append(
            Question(
                question=str(qa["question"]),
                category=int(qa["category"]),
                evidence=tuple(ids),
                raw_evidence=raw,
                dropped=tuple(dropped),
            )
        )
    return Conversation(
        sample_id=str(sample.get("sample_id", "")),
        speaker_a=str(conv.get("speaker_a", "")),
        turns=tuple(turns),
        questions=tuple(questions),
    )


def load_locomo(path: str | Path, limit: int | None = None) -> list[Conversation]:
    samples = json.loads(Path(path).read_text())
    if limit is not None:
        samples = samples[:limit]
    return [parse_conversation(s) for s in samples]


def dia_ids_of_range(first: int, last: int, seq_to_dia: Mapping[int, str]) -> set[str]:
    """dia_ids of the turns with seq in first..last (seqs not ingested by us are ignored)."""
    return {seq_to_dia[s] for s in range(first, last + 1) if s in seq_to_dia}


# ---------------------------------------------------------------- metrics


def coverage(evidence: Sequence[str], covered: set[str]) -> float:
    return sum(1 for e in evidence if e in covered) / len(evidence) if evidence else 0.0


def recall_at_k(evidence: Sequence[str], ranked: Sequence[set[str]], k: int) -> float:
    """Fraction of evidence covered by the first k ranked units (each a set of dia_ids)."""
    covered: set[str] = set().union(*ranked[:k]) if ranked[:k] else set()
    return coverage(evidence, covered)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class QuestionResult:
    """One question's figures for one method (recall values in [0, 1])."""

    sample_id: str
    category: int
    evidence: int
    budget_recall: dict[int, float] = field(default_factory=dict)
    budget_recall_recalled_only: dict[int, float] = field(default_factory=dict)
    injected: dict[int, int] = field(default_factory=dict)
    at_k: dict[int, float] = field(default_factory=dict)
    in_window: float = 0.0  # share of evidence already in the C1 window


def summarise(
    results: Sequence[QuestionResult], budgets: Sequence[int], ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    """Mean figures per category name and 'overall' (categories 1-4), plus counts."""
    groups: dict[str, list[QuestionResult]] = {}
    for r in results:
        groups.setdefault(CATEGORIES.get(r.category, str(r.category)), []).append(r)
    groups["overall"] = [r for r in results if r.category in SCORED_CATEGORIES]
    table: dict[str, dict[str, float]] = {}
    for name, rows in groups.items():
        if not rows:
            continue
        row: dict[str, float] = {"n": float(len(rows))}
        for b in budgets:
            if all(b in r.budget_recall for r in rows):
                row[f"B{b}"] = statistics.fmean(r.budget_recall[b] for r in rows)
            if all(b in r.budget_recall_recalled_only for r in rows):
                row[f"B{b}_recalled"] = statistics.fmean(
                    r.budget_recall_recalled_only[b] for r in rows
                )
            if all(b in r.injected for r in rows):
                row[f"tokens{b}"] = statistics.fmean(r.injected[b] for r in rows)
        for k in ks:
            if all(k in r.at_k for r in rows):
                row[f"R@{k}"] = statistics.fmean(r.at_k[k] for r in rows)
        row["in_window"] = statistics.fmean(r.in_window for r in rows)
        table[name] = row
    return table


# ---------------------------------------------------------------- offline baselines

_FAKE_TS = datetime(2023, 1, 1, tzinfo=UTC)


def _framed_item(i: int, turn: Turn) -> RecalledItem:
    # A uuid-length id and a turn range like contextd's headers, for the framed variant.
    return RecalledItem(
        chunk_id=str(uuid.UUID(int=i)), text=turn.content, ts=_FAKE_TS, turn_first=i, turn_last=i
    )


def fill_budget(
    ranked: Sequence[int],
    costs: Sequence[int],
    budget: int,
) -> list[int]:
    """Units in rank order while their summed cost stays within budget (a unit that does not fit
    is skipped and the next one tried — the assembler's policy)."""
    chosen: list[int] = []
    used = 0
    for i in ranked:
        if used + costs[i] <= budget:
            chosen.append(i)
            used += costs[i]
    return chosen


def fill_budget_framed(
    ranked: Sequence[int], turns: Sequence[Turn], budget: int, per_item_max_tokens: int
) -> tuple[list[int], int]:
    """Like the assembler: the whole recalled block (frame, headers) must fit within budget."""
    chosen: list[RecalledItem] = []
    picked: list[int] = []
    used = 0
    for i in ranked:
        item = _framed_item(i, turns[i])
        if used + count_tokens(render_item(item, per_item_max_tokens)) > budget:
            continue
        cost = message_tokens("system", render_recalled_block([*chosen, item], per_item_max_tokens))
        if cost <= budget:
            chosen.append(item)
            picked.append(i)
            used = cost
    return picked, used


def bm25_baseline(
    conv: Conversation,
    budgets: Sequence[int],
    ks: Sequence[int],
    *,
    framed: bool = False,
    per_item_max_tokens: int = 300,
) -> list[QuestionResult]:
    """Plain BM25 (k1 1.2, b .75, `terms()`: lower-cased words, English stopwords) over single
    turns of the whole conversation. Cost of a turn: its content's tokens (the README's offline
    setting), or with `framed` the tokens it adds to a contextd-style recalled block."""
    index = BM25Index([(str(i), terms(t.content)) for i, t in enumerate(conv.turns)])
    costs = [count_tokens(t.content) for t in conv.turns]
    dia = [t.dia_id for t in conv.turns]
    out: list[QuestionResult] = []
    for q in conv.questions:
        if not q.evidence:
            continue
        ranked = [int(doc) for doc, _ in index.score(terms(q.question))]
        r = QuestionResult(conv.sample_id, q.category, len(q.evidence))
        for b in budgets:
            if framed:
                chosen, used = fill_budget_framed(ranked, conv.turns, b, per_item_max_tokens)
            else:
                chosen = fill_budget(ranked, costs, b)
                used = sum(costs[i] for i in chosen)
            covered = {dia[i] for i in chosen}
            r.budget_recall[b] = coverage(q.evidence, covered)
            r.budget_recall_recalled_only[b] = r.budget_recall[b]
            r.injected[b] = used
        units = [{dia[i]} for i in ranked]
        for k in ks:
            r.at_k[k] = recall_at_k(q.evidence, units, k)
        out.append(r)
    return out


def truncation_baseline(conv: Conversation, window_tokens: int) -> list[QuestionResult]:
    """Keep only the last turns whose message tokens fit in `window_tokens` (no recall)."""
    kept: set[str] = set()
    used = 0
    for t in reversed(conv.turns):
        cost = message_tokens("user", t.content)
        if used + cost > window_tokens:
            break
        kept.add(t.dia_id)
        used += cost
    out = []
    for q in conv.questions:
        if not q.evidence:
            continue
        r = QuestionResult(conv.sample_id, q.category, len(q.evidence))
        r.in_window = coverage(q.evidence, kept)
        r.budget_recall[0] = r.in_window
        r.injected[0] = used
        out.append(r)
    return out


# ---------------------------------------------------------------- driver (HTTP only)


@dataclass
class EvalConfig:
    url: str
    api_key: str | None = None
    budgets: tuple[int, ...] = (500, 1000)
    ks: tuple[int, ...] = (5, 10)
    context_limit: int = 4000
    reserve_tokens: int = 500
    min_recent_turns: int = 4
    min_recent_tokens: int = 500
    target_ratio: float = 0.1
    top_k: int = 50
    wait_embedded: bool = True
    ingest_timeout_s: float = 900.0
    concurrency: int = 1
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    per_item_max_tokens: int = 300  # for the framed BM25 variant (the server's default)
    reuse_run_id: str | None = None  # evaluate sessions an earlier run ingested (no ingestion)


@dataclass
class BuildSample:
    """Observations of one build-prompt call."""

    budget: int
    wall_ms: float
    timings_ms: dict[str, float]
    fallbacks: list[str]
    injected: int
    items: int
    error: bool = False  # the server answered 5xx


@dataclass
class ConversationRun:
    sample_id: str
    session_id: str
    turns: int
    chunks: int
    chunk_tokens_mean: float
    window_turns: int
    ingest_s: float
    ready_s: float


@dataclass
class LocomoRun:
    config: EvalConfig
    conversations: list[ConversationRun]
    contextd: list[QuestionResult]
    bm25: list[QuestionResult]
    bm25_framed: list[QuestionResult]
    truncation: list[QuestionResult]
    builds: list[BuildSample]
    evidence_dropped: list[tuple[str, str, str]]  # (sample_id, raw evidence, dropped part)
    questions_without_evidence: int
    elapsed_s: float


class EvalError(RuntimeError):
    pass


def _check(resp: Any, what: str) -> Any:
    if resp.status_code >= 400:
        raise EvalError(f"{what}: HTTP {resp.status_code} {resp.text[:300]}")
    return resp.json()


async def _ingest(http: Any, cfg: EvalConfig, conv: Conversation) -> tuple[str, dict[int, str]]:
    sid = f"locomo-{conv.sample_id}-{cfg.run_id}"
    base = f"/v1/sessions/{sid}"
    _check(
        await http.put(
            base,
            json={
                "context_limit": cfg.context_limit,
                "reserve_tokens": cfg.reserve_tokens,
                "min_recent_turns": cfg.min_recent_turns,
                "min_recent_tokens": cfg.min_recent_tokens,
                "target_ratio": cfg.target_ratio,
                "metadata": {"eval": "locomo", "sample_id": conv.sample_id},
            },
        ),
        f"configure {sid}",
    )
    seq_to_dia: dict[int, str] = {}
    turns = list(conv.turns)
    for start in range(0, len(turns), 100):
        batch = turns[start : start + 100]
        body = {
            "turns": [
                {
                    "role": "user" if t.speaker == conv.speaker_a else "assistant",
                    "content": t.content,
                    "metadata": {"dia_id": t.dia_id, "session_date": t.date},
                }
                for t in batch
            ]
        }
        out = _check(await http.post(f"{base}/turns", json=body), f"append to {sid}")
        for t, stored in zip(batch, out["turns"], strict=True):
            seq_to_dia[int(stored["seq"])] = t.dia_id
    return sid, seq_to_dia


async def _mapped_session(
    http: Any, cfg: EvalConfig, conv: Conversation, run_id: str
) -> tuple[str, dict[int, str]]:
    """An earlier run's session: seq → dia_id read back from the turns' metadata."""
    sid = f"locomo-{conv.sample_id}-{run_id}"
    seq_to_dia: dict[int, str] = {}
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = _check(await http.get(f"/v1/sessions/{sid}/turns", params=params), f"turns {sid}")
        for t in page["turns"]:
            dia = (t.get("metadata") or {}).get("dia_id")
            if dia is not None:
                seq_to_dia[int(t["seq"])] = str(dia)
        cursor = page.get("next_cursor")
        if not cursor:
            break
    if sorted(seq_to_dia.values()) != sorted(t.dia_id for t in conv.turns):
        raise EvalError(f"session {sid} does not hold conversation {conv.sample_id}")
    return sid, seq_to_dia


async def _list_chunks(http: Any, sid: str) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = _check(await http.get(f"/v1/sessions/{sid}/chunks", params=params), "chunks")
        chunks.extend(page["chunks"])
        cursor = page.get("next_cursor")
        if not cursor:
            return chunks


async def _wait_ready(http: Any, cfg: EvalConfig, sids: Sequence[str]) -> list[dict[str, Any]]:
    """Poll until every session is offloaded below its trigger, the worker queue is empty and
    (when asked) every chunk is embedded; raise after the deadline."""
    deadline = time.monotonic() + cfg.ingest_timeout_s
    last: Any = None
    while True:
        ready = (await http.get("/readyz")).json()  # 503 (worker lag) still reports the queue
        pending = int((ready.get("worker") or {}).get("pending_jobs", 0))
        done = pending == 0
        infos = []
        for sid in sids:
            info = _check(await http.get(f"/v1/sessions/{sid}"), f"session {sid}")
            infos.append(info)
            if info["counts"]["chunks"] == 0 or info["watermark"]["level"] != "normal":
                done = False
        if done and cfg.wait_embedded:
            for sid in sids:
                chunks = await _list_chunks(http, sid)
                if not all(c["embedded"] for c in chunks if c["status"] == "active"):
                    done = False
                    last = {"session": sid, "unembedded": sum(not c["embedded"] for c in chunks)}
                    break
        if done:
            return infos
        last = last or {"pending_jobs": pending}
        if time.monotonic() > deadline:
            raise EvalError(f"sessions not ready after {cfg.ingest_timeout_s}s; last: {last}")
        await asyncio.sleep(0.5)


def _window_seqs(resp: Mapping[str, Any]) -> set[int]:
    return {
        int(e["id"].removeprefix("turn:"))
        for e in resp["manifest"]
        if e["layer"] == "c1" and e["included"] and e["id"].startswith("turn:")
    }


def _item_dias(resp: Mapping[str, Any], seq_to_dia: Mapping[int, str]) -> list[set[str]]:
    units = []
    for item in resp["recall"]["items"]:
        rng = item.get("turn_range")
        units.append(dia_ids_of_range(rng[0], rng[1], seq_to_dia) if rng else set())
    return units


async def _build(
    http: Any, sid: str, body: dict[str, Any]
) -> tuple[dict[str, Any] | None, float, int]:
    """One build-prompt; a 5xx or a dropped connection is returned as None (a failed build)."""
    import httpx

    started = time.perf_counter()
    try:
        resp = await http.post(f"/v1/sessions/{sid}/build-prompt", json=body)
    except httpx.TransportError:
        return None, (time.perf_counter() - started) * 1000, 0
    wall = (time.perf_counter() - started) * 1000
    if resp.status_code >= 500:
        return None, wall, resp.status_code
    return _check(resp, f"build-prompt {sid}"), wall, resp.status_code


async def _evaluate_question(
    http: Any,
    cfg: EvalConfig,
    conv: Conversation,
    sid: str,
    seq_to_dia: Mapping[int, str],
    q: Question,
    builds: list[BuildSample],
) -> QuestionResult:
    r = QuestionResult(conv.sample_id, q.category, len(q.evidence))
    for b in cfg.budgets:
        body = {
            "query": q.question,
            "recall": {"mode": "always", "budget_tokens": b, "top_k": cfg.top_k},
        }
        resp, wall, status = await _build(http, sid, body)
        if resp is None:
            r.budget_recall[b] = r.budget_recall_recalled_only[b] = 0.0
            r.injected[b] = 0
            builds.append(BuildSample(b, wall, {}, [f"http_{status or 'dropped'}"], 0, 0, True))
            continue
        window = set().union(*[dia_ids_of_range(s, s, seq_to_dia) for s in _window_seqs(resp)])
        recalled = set().union(*_item_dias(resp, seq_to_dia))
        r.in_window = coverage(q.evidence, window)
        r.budget_recall[b] = coverage(q.evidence, recalled | window)
        r.budget_recall_recalled_only[b] = coverage(q.evidence, recalled)
        r.injected[b] = int(resp["usage"]["recall"])
        builds.append(
            BuildSample(
                budget=b,
                wall_ms=wall,
                timings_ms=dict(resp.get("timings_ms") or {}),
                fallbacks=list(resp.get("fallbacks") or []),
                injected=int(resp["usage"]["recall"]),
                items=len(resp["recall"]["items"]),
            )
        )
    if cfg.ks:
        body = {
            "query": q.question,
            "context_limit": RANKING_LIMIT,
            "reserve_tokens": 0,
            "recall": {"mode": "always", "budget_tokens": RANKING_LIMIT, "top_k": cfg.top_k},
        }
        resp, _, _ = await _build(http, sid, body)
        units = _item_dias(resp, seq_to_dia) if resp is not None else []
        for k in cfg.ks:
            r.at_k[k] = recall_at_k(q.evidence, units, k)
    return r


async def run_locomo(
    conversations: Sequence[Conversation], cfg: EvalConfig, *, log: Any = print
) -> LocomoRun:
    import httpx

    started = time.monotonic()
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=max(4, cfg.concurrency * 2))
    async with httpx.AsyncClient(
        base_url=cfg.url.rstrip("/"), headers=headers, timeout=120, limits=limits
    ) as http:
        _check(await http.get("/healthz"), "healthz")
        ingested: list[tuple[Conversation, str, dict[int, str], float]] = []
        for conv in conversations:
            t0 = time.monotonic()
            if cfg.reuse_run_id:
                sid, seq_to_dia = await _mapped_session(http, cfg, conv, cfg.reuse_run_id)
            else:
                sid, seq_to_dia = await _ingest(http, cfg, conv)
            ingested.append((conv, sid, seq_to_dia, time.monotonic() - t0))
            log(f"{'reused' if cfg.reuse_run_id else 'ingested'} {conv.sample_id}: "
                f"{len(conv.turns)} turns → session {sid}")  # fmt: skip
        t0 = time.monotonic()
        await _wait_ready(http, cfg, [sid for _, sid, _, _ in ingested])
        ready_s = time.monotonic() - t0
        log(f"offload{' and embedding' if cfg.wait_embedded else ''} done in {ready_s:.1f}s")

        runs: list[ConversationRun] = []
        results: list[QuestionResult] = []
        builds: list[BuildSample] = []
        semaphore = asyncio.Semaphore(cfg.concurrency)
        for conv, sid, seq_to_dia, ingest_s in ingested:
            chunks = [c for c in await _list_chunks(http, sid) if c["status"] == "active"]
            info = _check(await http.get(f"/v1/sessions/{sid}"), f"session {sid}")
            questions = [q for q in conv.questions if q.evidence]

            async def one(q: Question, sid: str = sid, conv: Conversation = conv,
                          m: dict[int, str] = seq_to_dia) -> QuestionResult:  # fmt: skip
                async with semaphore:
                    return await _evaluate_question(http, cfg, conv, sid, m, q, builds)

            conv_results = await asyncio.gather(*(one(q) for q in questions))
            results.extend(conv_results)
            offloaded = sum(c["turn_last"] - c["turn_first"] + 1 for c in chunks)
            runs.append(
                ConversationRun(
                    sample_id=conv.sample_id,
                    session_id=sid,
                    turns=len(conv.turns),
                    chunks=len(chunks),
                    chunk_tokens_mean=(
                        statistics.fmean(c["token_count"] for c in chunks) if chunks else 0.0
                    ),
                    window_turns=info["counts"]["turns"] - offloaded,
                    ingest_s=ingest_s,
                    ready_s=ready_s,
                )
            )
            log(f"evaluated {conv.sample_id}: {len(questions)} questions")

    bm25: list[QuestionResult] = []
    bm25_framed: list[QuestionResult] = []
    truncation: list[QuestionResult] = []
    for conv in conversations:
        bm25.extend(bm25_baseline(conv, cfg.budgets, cfg.ks))
        bm25_framed.extend(
            bm25_baseline(
                conv, cfg.budgets, (), framed=True, per_item_max_tokens=cfg.per_item_max_tokens
            )
        )
        truncation.extend(truncation_baseline(conv, cfg.context_limit - cfg.reserve_tokens))
    dropped = [
        (conv.sample_id, ", ".join(q.raw_evidence), part)
        for conv in conversations
        for q in conv.questions
        for part in q.dropped
    ]
    return LocomoRun(
        config=cfg,
        conversations=runs,
        contextd=results,
        bm25=bm25,
        bm25_framed=bm25_framed,
        truncation=truncation,
        builds=builds,
        evidence_dropped=dropped,
        questions_without_evidence=sum(
            1 for conv in conversations for q in conv.questions if not q.evidence
        ),
        elapsed_s=time.monotonic() - started,
    )
