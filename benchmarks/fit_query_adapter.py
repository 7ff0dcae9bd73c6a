"""Fit the query adapter (`app/recall/adapter.py`) on the LoCoMo tune split and write it.

    .venv/bin/python -m benchmarks.fit_query_adapter RUN_ID [--data F] [--data-dir .contextd]
        [--epochs 13] [--write]

Over the sessions a `contextd eval locomo` run ingested (its `contextd dev` up, as for
`benchmarks.locomo_inprocess`): each question of conversations 0-3 (categories 1-4, with
evidence) is embedded as recall embeds it, and a linear map x ↦ x + x·D is fitted so that the
question's evidence chunks come first among all chunks of its conversation (softmax over cosine
/ `TEMPERATURE`, full-batch gradient descent from D = 0: deterministic). D's leading singular
triple (94 % of its energy) is the adapter. The number of epochs was chosen by leave-one-
conversation-out within the tune split (`--cross-validate` prints that curve); conversations
4-6 are never read here. Prints the vector arm's R@10 / R@30 before and after on both splits
(`--check` also reads conversations 4-6, to report, never to choose).
"""

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import text

from app.embeddings.base import l2_normalise
from app.eval.locomo import SCORED_CATEGORIES, dia_ids_of_range, load_locomo
from app.recall.adapter import ADAPTER_FILE, QueryAdapter
from app.recall.query import query_views
from benchmarks.locomo_inprocess import (
    TUNE_CONVERSATIONS,
    dev_context,
    dia_ids_by_seq,
    locomo_session,
)

TEMPERATURE = 0.05
LEARNING_RATE = 0.05
EPOCHS = 13  # leave-one-conversation-out over 0-3: R@10 +.025, R@30 +.030 (steps 7-13 within .005)


@dataclass
class Question:
    conversation: int
    vector: np.ndarray  # the query embedding, unit
    evidence: list[int]  # rows of its conversation's chunk matrix holding an evidence turn


async def load(
    run_id: str, data: str, data_dir: Path, conversations: set[int]
) -> tuple[str, dict[int, np.ndarray], list[Question]]:
    context = dev_context(data_dir)
    await context.start_embedder()
    embedder = context.embedder
    assert embedder is not None
    chunks: dict[int, np.ndarray] = {}
    questions: list[Question] = []
    try:
        for index, conv in enumerate(load_locomo(data)):
            if index not in conversations:
                continue
            async with context.sessionmaker() as db:
                session = await locomo_session(db, run_id, conv.sample_id)
                seq_to_dia = await dia_ids_by_seq(db, session)
                rows = (
                    await db.execute(
                        text(
                            "SELECT turn_first, turn_last, embedding::text FROM chunks"
                            " WHERE session_id = :s AND status = 'active'"
                            " AND embedding_model = :m ORDER BY turn_first"
                        ),
                        {"s": session.id, "m": embedder.name},
                    )
                ).all()
            chunks[index] = np.array([json.loads(v) for _, _, v in rows], dtype=np.float32)
            held = [dia_ids_of_range(a, b, seq_to_dia) for a, b, _ in rows]
            for q in conv.questions:
                if not q.evidence or q.category not in SCORED_CATEGORIES:
                    continue
                evidence = [i for i, dias in enumerate(held) if dias & set(q.evidence)]
                if not evidence:
                    continue
                views = await embedder.embed_queries(query_views(q.question), timeout_s=None)
                vector = l2_normalise(views.mean(axis=0, keepdims=True))[0]
                questions.append(Question(index, vector, evidence))
    finally:
        await context.aclose()
    return embedder.name, chunks, questions


def fit(chunks: dict[int, np.ndarray], questions: list[Question], epochs: int) -> np.ndarray:
    """D of x ↦ x + x·D after `epochs` full-batch steps of the softmax loss."""
    dim = next(iter(chunks.values())).shape[1]
    d = np.zeros((dim, dim), np.float32)
    for _ in range(epochs):
        gradient = np.zeros_like(d)
        for q in questions:
            matrix = chunks[q.conversation]
            moved = q.vector + q.vector @ d
            norm = float(np.linalg.norm(moved))
            unit = moved / norm
            logits = matrix @ unit / TEMPERATURE
            p = np.exp(logits - logits.max())
            p /= p.sum()
            p[q.evidence] -= 1 / len(q.evidence)
            g = (p @ matrix) / TEMPERATURE
            gradient += np.outer(q.vector, (g - unit * float(g @ unit)) / norm)
        d -= LEARNING_RATE * gradient / len(questions)
    return d


def rank_one(d: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, float]:
    """D's leading singular triple (scale, left, right) and the share of D's energy it holds."""
    left, singular, right = np.linalg.svd(d)
    share = float(singular[0] ** 2 / np.sum(singular**2))
    return float(singular[0]), left[:, 0], right[0], share


def recall_at(
    chunks: dict[int, np.ndarray],
    questions: list[Question],
    k: int,
    move: Callable[[np.ndarray], np.ndarray] | None = None,
) -> float:
    got = []
    for q in questions:
        vector = q.vector if move is None else move(q.vector)
        best = set(np.argsort(-(chunks[q.conversation] @ vector))[:k].tolist())
        got.append(len(best & set(q.evidence)) / len(q.evidence))
    return float(np.mean(got)) if got else 0.0


def cross_validate(chunks: dict[int, np.ndarray], questions: list[Question], epochs: int) -> None:
    """Mean gain of R@10 / R@30 on each held-out tune conversation, per epoch count."""
    for n in range(1, epochs + 1):
        gains = []
        for held in range(TUNE_CONVERSATIONS):
            train = [q for q in questions if q.conversation != held]
            test = [q for q in questions if q.conversation == held]
            d = fit(chunks, train, n)

            def full(x: np.ndarray, d: np.ndarray = d) -> np.ndarray:
                moved = x + x @ d
                return moved / np.linalg.norm(moved)

            gains.append(
                [recall_at(chunks, test, k, full) - recall_at(chunks, test, k) for k in (10, 30)]
            )
        mean = np.mean(gains, axis=0)
        print(f"epochs {n}: R@10 {mean[0]:+.3f}  R@30 {mean[1]:+.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_id")
    parser.add_argument("--data", default="../shared/eval/locomo/locomo_dev.json")
    parser.add_argument("--data-dir", default=".contextd", type=Path)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--cross-validate", action="store_true")
    parser.add_argument("--check", action="store_true", help="also report conversations 4-6")
    parser.add_argument("--write", action="store_true", help=f"write app/recall/{ADAPTER_FILE}")
    args = parser.parse_args()
    wanted = set(range(TUNE_CONVERSATIONS)) | ({4, 5, 6} if args.check else set())
    model, chunks, questions = asyncio.run(load(args.run_id, args.data, args.data_dir, wanted))
    tune = [q for q in questions if q.conversation < TUNE_CONVERSATIONS]
    if args.cross_validate:
        cross_validate(chunks, tune, args.epochs)
        return
    scale, toward_from, toward_to, share = rank_one(fit(chunks, tune, args.epochs))
    adapter = QueryAdapter(model, scale, toward_from, toward_to)

    def move(x: np.ndarray) -> np.ndarray:
        return np.asarray(adapter.apply(x.tolist()), dtype=np.float32)

    print(f"rank one holds {share:.3f} of the fitted map's energy; scale {scale:.3f}")
    check = [q for q in questions if q.conversation >= TUNE_CONVERSATIONS]
    for name, qs in (("tune", tune), ("check", check)):
        if qs:
            print(
                f"{name}: vector arm R@10 {recall_at(chunks, qs, 10):.3f} → "
                f"{recall_at(chunks, qs, 10, move):.3f}, R@30 {recall_at(chunks, qs, 30):.3f} → "
                f"{recall_at(chunks, qs, 30, move):.3f}"
            )
    if args.write:
        out = Path(__file__).resolve().parent.parent / "app" / "recall" / ADAPTER_FILE
        payload = {
            "model": model,
            "fitted_on": f"LoCoMo conversations 0-{TUNE_CONVERSATIONS - 1}, {len(tune)} questions",
            "epochs": args.epochs,
            "scale": round(scale, 6),
            "toward_from": [round(float(v), 6) for v in toward_from],
            "toward_to": [round(float(v), 6) for v in toward_to],
        }
        out.write_text(json.dumps(payload) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
