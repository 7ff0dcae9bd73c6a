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
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from app.core.text import terms

K1 = 1.2
B = 0.75
DEFAULT_TOP_N = 30  # the spec's wide-recall R


def idf(n_docs: int, df: int) -> float:
    return math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))


class BM25Index:
    """BM25 over a fixed set of documents identified by unique string ids."""

    __slots__ = ("_doc", "_ids", "_postings", "_weight", "avgdl", "b", "doc_lengths", "k1")

    def __init__(
        self, docs: Sequence[tuple[str, Sequence[str]]], *, k1: float = K1, b: float = B
    ) -> None:
        self._build([(doc_id, Counter(doc_terms)) for doc_id, doc_terms in docs], k1=k1, b=b)

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
        index._build(docs, k1=k1, b=b)
        return index

    def _build(self, docs: Sequence[tuple[str, Mapping[str, int]]], *, k1: float, b: float) -> None:
        if k1 < 0 or not 0.0 <= b <= 1.0:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        ids = [doc_id for doc_id, _ in docs]
        if len(set(ids)) != len(ids):
            raise ValueError("BM25Index document ids must be unique")
        self.k1 = k1
        self.b = b
        self._ids = ids
        lengths = [sum(c for c in counts.values() if c > 0) for _, counts in docs]
        self.doc_lengths = lengths
        n_docs = len(docs)
        self.avgdl = (sum(lengths) / n_docs) if n_docs else 0.0
        # One flat pass collecting (term, doc, tf); postings are then contiguous slices of arrays
        # sorted by term, so building costs a few vector operations instead of one per term.
        term_ids: dict[str, int] = {}
        new_id = term_ids.setdefault
        post_term: list[int] = []
        post_tf: list[int] = []
        for _, counts in docs:
            post_term.extend([new_id(term, len(term_ids)) for term in counts])
            post_tf.extend(counts.values())
        per_doc = np.fromiter((len(counts) for _, counts in docs), dtype=np.int64, count=n_docs)
        doc_arr = np.repeat(np.arange(n_docs, dtype=np.int64), per_doc)
        term_arr = np.asarray(post_term, dtype=np.int64)
        tf_arr = np.asarray(post_tf, dtype=np.float64)
        if (tf_arr <= 0).any():  # stored counts may hold zeros: they are not postings
            keep = tf_arr > 0
            term_arr, doc_arr, tf_arr = term_arr[keep], doc_arr[keep], tf_arr[keep]
        order = np.argsort(term_arr, kind="stable")
        self._doc = doc_arr[order]
        tf_arr = tf_arr[order]
        norm = k1 * (1.0 - b + b * np.asarray(lengths, dtype=np.float64) / (self.avgdl or 1.0))
        self._weight = tf_arr * (k1 + 1.0) / (tf_arr + norm[self._doc]) if n_docs else tf_arr
        dfs = np.bincount(term_arr, minlength=len(term_ids))
        ends = np.cumsum(dfs)
        idfs = np.log1p((n_docs - dfs + 0.5) / (dfs + 0.5))
        self._postings: dict[str, tuple[int, int, float]] = {
            term: (int(ends[t] - dfs[t]), int(ends[t]), float(idfs[t]))
            for term, t in term_ids.items()
        }

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def df(self, term: str) -> int:
        posting = self._postings.get(term)
        return 0 if posting is None else posting[1] - posting[0]

    def score_array(
        self, query_terms: Iterable[str] | Mapping[str, float]
    ) -> npt.NDArray[np.float64]:
        """BM25 score of every document, in build order. `query_terms` is a list of terms
        (a repeated term counts each time) or a mapping of term to weight."""
        scores = np.zeros(len(self._ids), dtype=np.float64)
        weighted = query_terms if isinstance(query_terms, Mapping) else Counter(query_terms)
        for term, qtf in weighted.items():
            posting = self._postings.get(term)
            if posting is not None:
                start, end, term_idf = posting
                scores[self._doc[start:end]] += (qtf * term_idf) * self._weight[start:end]
        return scores

    def score(
        self, query_terms: Iterable[str] | Mapping[str, float], top_n: int | None = None
    ) -> list[tuple[str, float]]:
        """(id, score) of documents matching any query term, best first; ties keep build order."""
        scores = self.score_array(query_terms)
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
