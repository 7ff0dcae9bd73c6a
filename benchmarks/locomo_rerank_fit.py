"""Fit the feature rerank's weights on the LoCoMo tune split and score what the budgets pack.

    .venv/bin/python -m benchmarks.locomo_rerank_fit RUN_ID [--data F] [--data-dir .contextd]
        [--l2 0.001]

Run it like `benchmarks.locomo_inprocess` (the `contextd dev` of the ingestion up, idle). One
recall per question gives the shown hits with their rerank features (`RerankFeatures`); a
pairwise logistic regression on the tune split (conversations 0-3: each chunk holding evidence
against every candidate of its question holding less, each question weighing the same, the
recency weight held at `RECENCY_WEIGHT`) fits the other weights. The hits are then re-ordered by
the fitted score and packed by the real assembler at every budget; both tables (as shipped, and
fitted) are printed, tune and check split apart. exact and cjk are left out of the fit: LoCoMo
questions hold no IDs, quotes or CJK text.
"""

import argparse
import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from app.eval.locomo import dia_ids_of_range
from app.recall.hits import RecallHit
from app.recall.rerank import RECENCY_WEIGHT
from benchmarks.locomo_inprocess import TUNE_CONVERSATIONS, Asked, ask, score_one, table

FITTED = ("fused", "rank", "adjacent", "coverage", "entity")


def evidence_share(asked: Asked, hit: RecallHit) -> float:
    if hit.turn_first is None or hit.turn_last is None:
        return 0.0
    held = dia_ids_of_range(hit.turn_first, hit.turn_last, asked.seq_to_dia)
    return len(held & set(asked.evidence)) / len(asked.evidence)


# Further features of a question's hits, one column each, beside `RerankFeatures` (an
# experiment's feature before it is one of the rerank's): (question, its hits) -> (hits, n).
ExtraColumns = Callable[[Asked, Sequence[RecallHit]], np.ndarray]


def feature_rows(
    hits: Sequence[RecallHit], extra: np.ndarray | None = None, names: Sequence[str] = FITTED
) -> np.ndarray:
    """One row per hit: the `names` features, the `extra` columns, recency last."""
    rows = []
    for h in hits:
        values = h.features.as_dict() if h.features else {}
        rows.append([values.get(name, 0.0) for name in names])
    own = np.array(rows, dtype=float).reshape(len(hits), len(names))
    recency = np.array([[h.features.recency if h.features else 0.0] for h in hits])
    parts = [own, *([] if extra is None else [extra]), recency.reshape(len(hits), 1)]
    return np.hstack(parts)


def fit(
    asked: Sequence[Asked],
    l2: float,
    extra: ExtraColumns | None = None,
    extra_names: Sequence[str] = (),
) -> dict[str, float]:
    """Pairwise logistic regression; weights relative to `fused`, recency held fixed."""
    diffs: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    for a in asked:
        labels = np.array([evidence_share(a, h) for h in a.shown])
        features = feature_rows(a.shown, extra(a, a.shown) if extra else None)
        better, worse = np.nonzero(labels[:, None] > labels[None, :])
        if len(better) == 0:
            continue
        diffs.append(features[better] - features[worse])
        weights.append(np.full(len(better), 1.0 / len(better)))
    x = np.vstack(diffs)
    w_pair = np.concatenate(weights)
    offset = RECENCY_WEIGHT * x[:, -1]
    scale = np.abs(x[:, :-1]).mean(axis=0) + 1e-9
    z = x[:, :-1] / scale
    coef = np.zeros(z.shape[1])
    for _ in range(3000):
        p = 1.0 / (1.0 + np.exp(np.clip(z @ coef + offset, -30, 30)))
        grad = -(z * (w_pair * p)[:, None]).sum(axis=0) / w_pair.sum() + l2 * coef
        coef -= 0.5 * grad
    fitted = coef / scale
    # The recency weight was held at its value on the fused scale of the fit: rescale together.
    unit = fitted[0]
    names = (*FITTED, *extra_names)
    out = {name: float(value / unit) for name, value in zip(names, fitted, strict=True)}
    return out | {"recency": float(RECENCY_WEIGHT / unit)}


def reordered(
    hits: Sequence[RecallHit], weights: dict[str, float], extra: np.ndarray | None = None
) -> list[RecallHit]:
    names = [*FITTED, *(name for name in weights if name not in (*FITTED, "recency")), "recency"]
    w = np.array([weights[name] for name in names])
    scores = feature_rows(hits, extra) @ w if hits else np.zeros(0)
    order = sorted(range(len(hits)), key=lambda i: (-scores[i], i))
    return [hits[i] for i in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_id")
    parser.add_argument("--data", default="../shared/eval/locomo/locomo_dev.json")
    parser.add_argument("--data-dir", default=".contextd", type=Path)
    parser.add_argument("--l2", type=float, default=0.001)
    args = parser.parse_args()
    asked = asyncio.run(ask(args.run_id, args.data, args.data_dir, None))
    weights = fit([a for a in asked if a.conversation < TUNE_CONVERSATIONS], args.l2)
    print("fitted weights:", {name: round(value, 3) for name, value in weights.items()})
    print("as shipped\n" + table([score_one(a, a.shown) for a in asked]))
    print("fitted\n" + table([score_one(a, reordered(a.shown, weights)) for a in asked]))


if __name__ == "__main__":
    main()
