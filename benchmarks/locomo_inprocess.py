"""LoCoMo evidence recall scored in process over the sessions a `contextd eval locomo` run ingested.

    .venv/bin/python -m benchmarks.locomo_inprocess RUN_ID [--data F] [--conversations 0,1,2,3]
        [--data-dir .contextd] [--misses B]

The build-prompt path without HTTP: for each question one recall (the same chain and settings as
build-prompt: window, notes, recent turns, `now`), the shown hits with their compact versions,
then the assembler at each budget on the same ranked items. Five HTTP builds per question become
one recall, so a change of ranking or packing is measured in a fraction of the eval's time. Run it
with the `contextd dev` of that ingestion up (it reads its `dev.json` for the database and cache)
and the server idle. Prints R@5, R@10 and evidence recall at B250-B2000 per category, tune split
(conversations 0-3) and check split (4-6) apart, as `contextd eval locomo` counts them.

With `--floors 0,0.2,0.3` it scores the same recalls again as each relevance floor would leave
them (`app.recall.floor`: a question whose first hits all fall below the floor gets no recalled
history; with `--per-item`, only the hits below it are left out; build-prompt itself keeps its
hits) and prints the overall figures per floor and split, with how many questions lost their
recalled history.

With `--misses B` it also lists every evidence turn not injected at budget B: the question, the
rank of the shown hit holding the turn (after rerank) and that hit's rank in the lexical and the
vector arm (`-`: not among the arm's candidates), or "no candidate" when no hit holds it.
"""

import argparse
import asyncio
import json
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.service import dev_caller
from app.core.config import Settings
from app.core.context import AppContext
from app.domain.dates import said_at
from app.domain.records import RecalledItem, TurnRecord
from app.eval.locomo import CATEGORIES, SCORED_CATEGORIES, coverage, dia_ids_of_range, load_locomo
from app.notes.policy import render_notes_block
from app.notes.service import current_notes
from app.prompt.assembly import AssemblyInput, assemble_prompt
from app.recall.floor import confident
from app.recall.hits import RecallHit, RecallOutcome, recalled_item
from app.recall.service import recall
from app.recall.session_chunks import kept_chunks
from app.recall.shown import show_best_turns
from app.store import sessions as sessions_store
from app.store import turns as turns_store
from app.store.models import Session
from app.store.sessions import session_budget
from benchmarks.second_hop import hop_terms, merged_hops

BUDGETS = (250, 500, 1000, 2000)
KS = (5, 10)
SHOWN = 150  # hits offered to the assembler: what build-prompt offers at the eval's top_k 50
TUNE_CONVERSATIONS = 4


def shown_dias(item: RecalledItem, seq_to_dia: dict[int, str]) -> set[str]:
    """dia_ids an injected item shows (its compact version's turns, else its range)."""
    if item.seqs is not None:
        return {seq_to_dia[s] for s in item.seqs if s in seq_to_dia}
    if item.turn_first is None:
        return set()
    last = item.turn_first if item.turn_last is None else item.turn_last
    return dia_ids_of_range(item.turn_first, last, seq_to_dia)


def missed_turns(
    evidence: Sequence[str],
    got: set[str],
    shown: Sequence[RecallHit],
    seq_to_dia: dict[int, str],
) -> list[str]:
    """Each evidence turn not in `got`, with where the hits rank it (`--misses`)."""
    out: list[str] = []
    for dia in evidence:
        if dia in got:
            continue
        where = "no candidate"
        for rank, hit in enumerate(shown, start=1):
            if hit.turn_first is None or hit.turn_last is None:
                continue
            if dia in dia_ids_of_range(hit.turn_first, hit.turn_last, seq_to_dia):
                lexical = hit.fused.lexical_rank or "-"
                vector = hit.fused.vector_rank or "-"
                where = f"rank {rank} (lexical {lexical}, vector {vector})"
                break
        out.append(f"{dia}: {where}")
    return out


@dataclass
class Asked:
    """One scored question with its recall's shown hits and what the prompt around them holds."""

    conversation: int
    category: int
    question: str
    evidence: list[str]
    shown: list[RecallHit]
    seq_to_dia: dict[int, str]
    window: list[TurnRecord]
    notes_block: str
    available: int
    per_item_max_tokens: int
    hop: list[RecallHit] | None = None  # with `--second-hop`: both hops' hits merged
    relevance: dict[str, float] = field(default_factory=dict)  # by hit id, with a floor set

    @property
    def in_window(self) -> set[str]:
        return {self.seq_to_dia[t.seq] for t in self.window if t.seq in self.seq_to_dia}


async def locomo_session(db: AsyncSession, run_id: str, sample_id: str) -> Session:
    """The session `contextd eval locomo` run `run_id` ingested `sample_id` into."""
    caller = await dev_caller(db)
    sid = f"locomo-{sample_id}-{run_id}"
    session = await sessions_store.get_session(db, caller.tenant_id, sid)
    if session is None:
        raise SystemExit(f"no session {sid}")
    return session


def dev_context(data_dir: Path) -> AppContext:
    """The context of the `contextd dev` whose data directory is `data_dir` (its database and
    cache, read from its `dev.json`)."""
    dev = json.loads((data_dir / "dev.json").read_text())
    return AppContext.create(Settings(database_url=dev["database_url"], redis_url=dev["redis_url"]))


async def dia_ids_by_seq(db: AsyncSession, session: Session) -> dict[int, str]:
    """The LoCoMo dia_id of each of the session's turns, by seq."""
    found = await db.execute(
        text("SELECT seq, metadata->>'dia_id' FROM turns WHERE session_id = :s"),
        {"s": session.id},
    )
    return {int(seq): dia for seq, dia in found.all() if dia}


async def second_hop(
    db: AsyncSession,
    context: AppContext,
    session: Session,
    question: str,
    shown: list[RecallHit],
    recall_with: Callable[[str], Awaitable[RecallOutcome]],
) -> list[RecallHit]:
    """The first hop's `shown` hits merged with a second recall searched with the names and
    dates they hold (`benchmarks.second_hop`); `shown` when they hold none."""
    index = (await kept_chunks(db, context, session)).index
    extra = hop_terms(question, [h.text for h in shown], index.df, len(index))
    if not extra:
        return shown
    outcome = await recall_with(f"{question} {' '.join(extra)}")
    again = await show_best_turns(db, context, session, outcome, SHOWN)
    return merged_hops(shown, again, lambda h: h.id)


async def ask(
    run_id: str, data: str, data_dir: Path, only: set[int] | None, hop: bool = False
) -> list[Asked]:
    """One recall per scored question (categories 1-4 with evidence), as build-prompt asks it."""
    context = dev_context(data_dir)
    settings = context.settings
    await context.start_embedder()
    out: list[Asked] = []
    try:
        for index, conv in enumerate(load_locomo(data)):
            if only is not None and index not in only:
                continue
            async with context.sessionmaker() as db:
                session = await locomo_session(db, run_id, conv.sample_id)
                seq_to_dia = await dia_ids_by_seq(db, session)
                window = await turns_store.window_turns(db, session.tenant_id, session.id)
                notes_block = render_notes_block(
                    (await current_notes(db, context.cache, session)).notes
                )
                budget = session_budget(settings, session)
                for q in conv.questions:
                    if not q.evidence or q.category not in SCORED_CATEGORIES:
                        continue

                    def recall_with(
                        query: str,
                        session: Session = session,
                        window: list[TurnRecord] = window,
                        candidates: int = budget.config.recall_candidates,
                    ) -> Awaitable[RecallOutcome]:
                        return recall(
                            db,
                            context,
                            session,
                            query,
                            recent_turns=[t.content for t in window[-2:]],
                            candidates=candidates,
                            window_seqs={t.seq for t in window},
                            include_memories=False,
                            now=(
                                said_at(window[-1].metadata, window[-1].created_at)
                                if window
                                else None
                            ),
                        )

                    outcome = await recall_with(q.question)
                    shown = await show_best_turns(db, context, session, outcome, SHOWN)
                    hopped = (
                        await second_hop(db, context, session, q.question, shown, recall_with)
                        if hop
                        else None
                    )
                    out.append(
                        Asked(
                            conversation=index,
                            category=q.category,
                            question=q.question,
                            evidence=list(q.evidence),
                            shown=shown,
                            seq_to_dia=seq_to_dia,
                            window=list(window),
                            notes_block=notes_block,
                            available=budget.available,
                            per_item_max_tokens=settings.recall.per_item_max_tokens,
                            hop=hopped,
                            relevance={h.id: outcome.relevance(h) or 0.0 for h in shown},
                        )
                    )
    finally:
        await context.aclose()
    return out


def score_one(asked: Asked, shown: Sequence[RecallHit], misses_at: int | None = None) -> dict:
    """R@k and the evidence recall at each budget of `shown` (the hits in the order to offer)."""
    items = [recalled_item(h) for h in shown]
    in_window = asked.in_window
    row: dict = {"conversation": asked.conversation, "category": asked.category}
    for b in BUDGETS:
        assembled = assemble_prompt(
            AssemblyInput(
                system=[],
                turns=asked.window,
                query=asked.question,
                budget=asked.available,
                recall_budget_tokens=b,
                top_k=50,
                per_item_max_tokens=asked.per_item_max_tokens,
                notes_block=asked.notes_block,
                recalled=items,
            )
        )
        got = set().union(*[shown_dias(i, asked.seq_to_dia) for i in assembled.recalled])
        row[f"B{b}"] = coverage(asked.evidence, got | in_window)
        if b == misses_at:
            row["missed"] = [
                f"{asked.conversation} {CATEGORIES[asked.category]} {asked.question!r} {miss}"
                for miss in missed_turns(asked.evidence, got | in_window, shown, asked.seq_to_dia)
            ]
    units = [
        dia_ids_of_range(h.turn_first, h.turn_last, asked.seq_to_dia)
        for h in shown
        if h.turn_first is not None and h.turn_last is not None
    ]
    for k in KS:
        row[f"R@{k}"] = coverage(asked.evidence, set().union(*units[:k]))
    return row


async def score(
    run_id: str, data: str, data_dir: Path, only: set[int] | None, misses_at: int | None = None
) -> list[dict]:
    asked = await ask(run_id, data, data_dir, only)
    return [score_one(a, a.shown, misses_at) for a in asked]


def floored(asked: Asked, floor: float, per_item: bool) -> list[RecallHit]:
    """The shown hits as the relevance floor `floor` leaves them: all or nothing
    (`above_floor`), or with `per_item` only the hits that reach it."""
    relevance = [asked.relevance.get(h.id, 0.0) for h in asked.shown]
    if per_item:
        return [h for h, r in zip(asked.shown, relevance, strict=True) if r >= floor]
    return list(asked.shown) if confident(relevance, floor) else []


def floor_table(asked: Sequence[Asked], floors: Sequence[float], per_item: bool) -> str:
    """Overall R@5 and evidence recall per budget at each floor, per split, and the questions
    left without recalled history."""
    keys = ["R@5", *(f"B{b}" for b in BUDGETS)]
    lines = [
        "| floor | split | n | left without recall | " + " | ".join(keys) + " |",
        "|---" * (4 + len(keys)) + "|",
    ]
    for floor in floors:
        kept = [floored(a, floor, per_item) for a in asked]
        rows = [score_one(a, k) for a, k in zip(asked, kept, strict=True)]
        for split, tune in (("tune", True), ("check", False)):
            picked = [
                (r, k)
                for r, k in zip(rows, kept, strict=True)
                if (r["conversation"] < TUNE_CONVERSATIONS) == tune
            ]
            if not picked:
                continue
            empty = sum(1 for _, k in picked if not k)
            cells = [f"{statistics.fmean(r[key] for r, _ in picked):.3f}" for key in keys]
            lines.append(
                f"| {floor:g} | {split} | {len(picked)} | {empty} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


def table(rows: Sequence[dict]) -> str:
    keys = [*(f"R@{k}" for k in KS), *(f"B{b}" for b in BUDGETS)]
    lines = ["| split | category | n | " + " | ".join(keys) + " |", "|---" * (3 + len(keys)) + "|"]
    for split, keep in (
        ("tune", lambda c: c < TUNE_CONVERSATIONS),
        ("check", lambda c: c >= TUNE_CONVERSATIONS),
    ):
        for category in (*SCORED_CATEGORIES, 0):
            sel = [
                r
                for r in rows
                if keep(r["conversation"]) and (category == 0 or r["category"] == category)
            ]
            if sel:
                name = CATEGORIES.get(category, "overall")
                cells = [f"{statistics.fmean(r[k] for r in sel):.3f}" for k in keys]
                lines.append(f"| {split} | {name} | {len(sel)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_id")
    parser.add_argument("--data", default="../shared/eval/locomo/locomo_dev.json")
    parser.add_argument("--data-dir", default=".contextd", type=Path)
    parser.add_argument("--conversations", help="indexes, e.g. 0,1,2,3 (default: all)")
    parser.add_argument(
        "--misses", type=int, choices=BUDGETS, help="list the evidence turns missed at this budget"
    )
    parser.add_argument("--floors", help="relevance floors to score, e.g. 0,0.2,0.3")
    parser.add_argument(
        "--second-hop",
        action="store_true",
        help="also score a second recall from the first hop's names and dates, merged",
    )
    parser.add_argument(
        "--per-item", action="store_true", help="a floor leaves out only the hits below it"
    )
    args = parser.parse_args()
    only = {int(i) for i in args.conversations.split(",")} if args.conversations else None
    if args.floors:
        asked = asyncio.run(ask(args.run_id, args.data, args.data_dir, only))
        floors = [float(f) for f in args.floors.split(",")]
        print(floor_table(asked, floors, args.per_item))
        return
    if args.second_hop:
        asked = asyncio.run(ask(args.run_id, args.data, args.data_dir, only, hop=True))
        print("first hop only:")
        print(table([score_one(a, a.shown) for a in asked]))
        print("with the second hop:")
        print(table([score_one(a, a.hop or a.shown) for a in asked]))
        return
    rows = asyncio.run(score(args.run_id, args.data, args.data_dir, only, args.misses))
    if args.misses is not None:
        for row in rows:
            for line in row.get("missed", []):
                print(line)
    print(table(rows))


if __name__ == "__main__":
    main()
