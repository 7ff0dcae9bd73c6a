"""The vector arm across languages: e5's cosine calibrated for a text in another language.

multilingual-e5-small puts a Chinese query nearer to any Chinese text than to the same fact
stated in English. On MADial's parallel memories (each memory in Chinese and in English; tune
split, each dialogue against the two versions of its relevant memories), a Chinese dialogue's
cosine to the English version is .086 below its cosine to the Chinese one (standard deviation
.011); an English dialogue's to the Chinese version .019 below (.016); the check split gives
.085 and .021. For a bilingual user the items in the other language then never reach the first
places: "我的牙医是谁？" scored the English "My dentist is Dr. Okafor" .806 against .83-.85 for
each Chinese item. The offset is added to the cosine of a text in the other language, so a fact
scores alike in whichever language it was stated; texts in the query's language keep their
scores, and a one-language pool its order.

The chunk arm searches with the query adapter's vector (`app.recall.adapter`), which widens
the gap: measured the same way with each MADial dialogue's last four lines as a chunk against
the adapted memories as queries, .110 for a Chinese query (sd .018, check .110), .018 for an
English one (sd .022, check .024).

Pure: no I/O, no settings.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from app.domain.text import mostly_cjk


@dataclass(frozen=True, slots=True)
class LanguageOffsets:
    """Added to the cosine of a text not in the query's language, by the query's language."""

    cjk_query: float
    other_query: float

    def offset(self, query_in_cjk: bool, text_in_cjk: bool) -> float:
        if query_in_cjk == text_in_cjk:
            return 0.0
        return self.cjk_query if query_in_cjk else self.other_query


RAW_OFFSETS = LanguageOffsets(cjk_query=0.086, other_query=0.019)  # e5 query vectors as they are
ADAPTED_OFFSETS = LanguageOffsets(cjk_query=0.110, other_query=0.018)  # the chunk arm's

_written_in_cjk = lru_cache(maxsize=4096)(mostly_cjk)


def in_other_language(query_in_cjk: bool, texts: Mapping[str, str]) -> bool:
    """Whether one of `texts` is written in another language than the query's (`mostly_cjk`)."""
    return any(_written_in_cjk(t) != query_in_cjk for t in texts.values())


def calibrated(
    similarities: Mapping[str, float],
    query_in_cjk: bool,
    texts: Mapping[str, str],
    limit: int,
    offsets: LanguageOffsets = RAW_OFFSETS,
) -> dict[str, float]:
    """The `limit` best of `similarities` (cosines by id) with the offset added to each whose
    text (`texts`, by id) is in another language than the query's, best first (ties by id)."""
    scores = {
        i: s + offsets.offset(query_in_cjk, _written_in_cjk(texts[i]))
        for i, s in similarities.items()
    }
    return dict(sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))[:limit])
