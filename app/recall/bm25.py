"""Okapi BM25 over a candidate set of documents, in process.

Measured on LoCoMo (shared/eval/README.md), plain BM25 with k1 1.2, b 0.75 over lower-cased word
terms is the strongest single arm; these are the defaults. idf = ln(1 + (N - df + 0.5)/(df + 0.5))
(never negative, so a term in most documents still counts a little).

The index is an inverted index whose postings hold each document's saturated, length-normalised
term weight tf·(k1+1) / (tf + k1·(1 - b + b·dl/avgdl)), precomputed at build time; a query only
adds idf·weight over the postings of its terms (numpy, one vector add per query term). A query term
repeated n times counts n times.

Build it from term lists (`BM25Index(docs)`) or from stored per-document term counts
(`BM25Index.from_term_counts(...)`) so term statistics kept in Postgres need no re-tokenising.
Pure: no I/O, no settings.
"""

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from app.domain.text import terms

K1 = 1.2
B = 0.75
DEFAULT_TOP_N = 30  # the spec's wide-recall R


def idf(n_docs: int, df: int) -> float:
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


class BM25Index:
    """BM25 over a fixed set of documents identified by unique string ids.

    Immutable once built; `extended(docs)` returns a new index holding more documents at the cost
    of the new documents' postings plus a few vector passes over the existing ones (a grown
    session's index need not be rebuilt from all of its chunks). Scores equal a full build's."""

    __slots__ = (
        "_doc",
        "_idfs",
        "_ids",
        "_offsets",
        "_term_ids",
        "_tf",
        "_weight",
        "avgdl",
        "b",
        "doc_lengths",
        "k1",
    )

    def __init__(
        self, docs: Sequence[tuple[str, Sequence[str]]], *, k1: float = K1, b: float = B
    ) -> None:
        self._empty(k1, b)
        self._add([(doc_id, Counter(doc_terms)) for doc_id, doc_terms in docs], self)

    @classmethod
    def from_term_counts(
        cls,
        docs: Sequence[tuple[str, Mapping[str, int]]],
        *,
        k1: float = K1,
        b: float = B,
    ) -> "BM25Index":
        """Build from per-document term counts; a document's length is the sum of its counts."""
        index = cls.__new__(cls)
        index._empty(k1, b)
        index._add(docs, index)
        return index

    def extended(self, docs: Sequence[tuple[str, Mapping[str, int]]]) -> "BM25Index":
        """A new index of this one's documents followed by `docs` (term counts); this one is
        left as it was."""
        index = type(self).__new__(type(self))
        index._add(docs, self)
        return index

    def _empty(self, k1: float, b: float) -> None:
        if k1 < 0 or not 0.0 <= b <= 1.0:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1, self.b = k1, b
        self._ids: list[str] = []
        self.doc_lengths: list[int] = []
        self._term_ids: dict[str, int] = {}
        self._offsets = np.zeros(1, dtype=np.int64)  # postings of term t: offsets[t]:offsets[t+1]
        self._doc = np.zeros(0, dtype=np.int32)
        self._tf = np.zeros(0, dtype=np.int32)

    def _add(self, docs: Sequence[tuple[str, Mapping[str, int]]], base: "BM25Index") -> None:
        """Become `base` plus `docs` (`base` may be self, empty)."""
        ids = base._ids + [doc_id for doc_id, _ in docs]
        if len(set(ids)) != len(ids):
            raise ValueError("BM25Index document ids must be unique")
        k1, b = base.k1, base.b
        first = len(base._ids)
        term_ids = dict(base._term_ids) if base is not self else base._term_ids
        n_old_terms = len(base._offsets) - 1
        # One flat pass over the new documents' (term, doc, tf); stored counts may hold zeros,
        # which are not postings.
        new_id = term_ids.setdefault
        post_term: list[int] = []
        post_doc: list[int] = []
        post_tf: list[int] = []
        lengths: list[int] = []
        for n, (_, counts) in enumerate(docs, start=first):
            kept = [(term, c) for term, c in counts.items() if c > 0]
            post_term.extend([new_id(term, len(term_ids)) for term, _ in kept])
            post_tf.extend([c for _, c in kept])
            post_doc.extend([n] * len(kept))
            lengths.append(sum(c for _, c in kept))
        term_arr = np.asarray(post_term, dtype=np.int64)
        order = np.argsort(term_arr, kind="stable")
        term_arr = term_arr[order]
        new_doc = np.asarray(post_doc, dtype=np.int32)[order]
        new_tf = np.asarray(post_tf, dtype=np.int32)[order]
        # A new posting goes after the existing postings of its term (new documents come last).
        at = base._offsets[np.minimum(term_arr, n_old_terms - 1) + 1] if n_old_terms else term_arr
        at = np.where(term_arr < n_old_terms, at, len(base._doc))
        self._doc = np.insert(base._doc, at, new_doc)
        self._tf = np.insert(base._tf, at, new_tf)
        dfs = np.diff(base._offsets)
        dfs = np.concatenate([dfs, np.zeros(len(term_ids) - n_old_terms, dtype=np.int64)])
        dfs += np.bincount(term_arr, minlength=len(term_ids))
        self._offsets = np.concatenate([[0], np.cumsum(dfs)])
        self.k1, self.b = k1, b
        self._ids = ids
        self._term_ids = term_ids
        self.doc_lengths = base.doc_lengths + lengths
        n_docs = len(ids)
        self.avgdl = (sum(self.doc_lengths) / n_docs) if n_docs else 0.0
        # Each posting's saturated, length-normalised weight, for the current average length.
        norm = k1 * (
            1.0 - b + b * np.asarray(self.doc_lengths, dtype=np.float64) / (self.avgdl or 1.0)
        )
        tf = self._tf.astype(np.float64)
        self._weight = tf * (k1 + 1.0) / (tf + norm[self._doc]) if n_docs else tf
        self._idfs = np.log1p((n_docs - dfs + 0.5) / (dfs + 0.5))

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def df(self, term: str) -> int:
        t = self._term_ids.get(term)
        return 0 if t is None else int(self._offsets[t + 1] - self._offsets[t])

    def score_array(
        self, query_terms: Iterable[str] | Mapping[str, float]
    ) -> npt.NDArray[np.float64]:
        """BM25 score of every document, in build order. `query_terms` is a list of terms
        (a repeated term counts each time) or a mapping of term to weight."""
        scores = np.zeros(len(self._ids), dtype=np.float64)
        weighted = query_terms if isinstance(query_terms, Mapping) else Counter(query_terms)
        for term, qtf in weighted.items():
            t = self._term_ids.get(term)
            if t is not None:
                start, end = self._offsets[t], self._offsets[t + 1]
                scores[self._doc[start:end]] += (qtf * self._idfs[t]) * self._weight[start:end]
        return scores

    def score(
        self,
        query_terms: Iterable[str] | Mapping[str, float],
        top_n: int | None = None,
        *,
        any_of: Collection[str] = (),
    ) -> list[tuple[str, float]]:
        """(id, score) of documents matching any query term, best first; ties keep build order.
        `any_of`: when given, only the documents that hold at least one of these terms."""
        scores = self.score_array(query_terms)
        if any_of:
            holding = np.zeros(len(self._ids), dtype=bool)
            for term in any_of:
                t = self._term_ids.get(term)
                if t is not None:
                    holding[self._doc[self._offsets[t] : self._offsets[t + 1]]] = True
            scores[~holding] = 0.0
        hits = np.flatnonzero(scores > 0.0)
        if hits.size == 0 or (top_n is not None and top_n <= 0):
            return []
        if top_n is not None and top_n < hits.size:
            # Partition first (O(n)), then sort only the survivors; -score with index tiebreak.
            kth = np.partition(-scores[hits], top_n - 1)[top_n - 1]
            hits = hits[-scores[hits] <= kth]
        order = np.lexsort((hits, -scores[hits]))
        ranked = [(self._ids[i], float(scores[i])) for i in hits[order]]
        return ranked if top_n is None else ranked[:top_n]


def bm25_rank(
    query: str,
    docs: Sequence[tuple[str, str]],
    top_n: int | None = DEFAULT_TOP_N,
    *,
    k1: float = K1,
    b: float = B,
) -> list[tuple[str, float]]:
    """Rank (id, text) documents for `query` with `terms()` tokenisation; best `top_n` first."""
    index = BM25Index([(doc_id, terms(text)) for doc_id, text in docs], k1=k1, b=b)
    return index.score(terms(query), top_n=top_n)
