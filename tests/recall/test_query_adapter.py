"""The query adapter (`app.recall.adapter`): the map it applies, when the chunk arm uses it, and
what it does to e5's similarities (the real embedder, English and Chinese): the chunk that
answers a question stands further above small talk than with the question's own embedding."""

import json

import numpy as np
import pytest

from app.embeddings.factory import create_embedder
from app.recall.adapter import (
    QueryAdapter,
    adapter_from_json,
    chunk_query_vector,
    packaged_adapter,
)

SMALL_TALK = [
    "user: Hey! Good to see you. How have you been?\nassistant: Great, thanks! And you?",
    "user: Haha, yeah. Anyway, talk soon!\nassistant: Sure, bye for now!",
]


def test_the_map_moves_along_one_direction_and_returns_a_unit_vector() -> None:
    rng = np.random.default_rng(11)
    toward_from, toward_to = (v / np.linalg.norm(v) for v in rng.standard_normal((2, 8)))
    adapter = QueryAdapter("m", 0.6, toward_from.astype(np.float32), toward_to.astype(np.float32))
    x = rng.standard_normal(8)

    moved = np.asarray(adapter.apply(x.tolist()))

    expected = x + 0.6 * float(x @ toward_from) * toward_to
    assert moved == pytest.approx(expected / np.linalg.norm(expected), abs=1e-6)
    assert float(np.linalg.norm(moved)) == pytest.approx(1.0, abs=1e-6)
    assert adapter.apply([0.0] * 8) == [0.0] * 8  # no direction to move


def test_the_packaged_adapter_is_for_e5_and_the_chunk_arm_only_uses_it_there() -> None:
    adapter = packaged_adapter()
    assert adapter.model == "e5-small-q4" and adapter.toward_to.shape == (384,)
    assert float(np.linalg.norm(adapter.toward_from)) == pytest.approx(1.0, abs=1e-4)
    assert float(np.linalg.norm(adapter.toward_to)) == pytest.approx(1.0, abs=1e-4)
    assert 0 < adapter.scale < 1
    x = np.random.default_rng(2).standard_normal(384).tolist()
    assert chunk_query_vector(x, "e5-small-q4", enabled=True) == adapter.apply(x)
    assert chunk_query_vector(x, "e5-small-q4", enabled=False) is x
    assert chunk_query_vector(x, "text-embedding-3-small", enabled=True) is x  # another space
    short = x[:16]
    assert chunk_query_vector(short, "e5-small-q4", enabled=True) is short  # another dimension


def test_an_adapter_reads_back_from_its_json() -> None:
    payload = {"model": "m", "scale": 0.5, "toward_from": [1.0, 0.0], "toward_to": [0.0, 1.0]}
    adapter = adapter_from_json(json.dumps(payload))
    assert adapter.model == "m" and adapter.scale == 0.5
    assert adapter.apply([1.0, 0.0]) == pytest.approx([1 / np.sqrt(1.25), 0.5 / np.sqrt(1.25)])


POTTERY_EN = (
    "user: Last weekend I signed up for a pottery class and made my first bowl.\n"
    "assistant: That sounds fun!"
)
POTTERY_ZH = "user: 上周末我报了一个陶艺班，做了第一个碗。\nassistant: 听起来很有趣！"
FLIGHT = "user: My flight to Lisbon leaves on May 3 from gate 14.\nassistant: Have a safe trip."
ASKED = [
    ("What activities has she tried recently?", POTTERY_EN),
    ("What activities has she tried recently?", POTTERY_ZH),  # the answer said in Chinese
    ("她最近尝试了什么活动？", POTTERY_ZH),
    ("她最近尝试了什么活动？", POTTERY_EN),
    ("Which gate does my flight leave from?", FLIGHT),
]


async def test_with_e5_the_answer_stands_further_above_small_talk() -> None:
    embedder = create_embedder("e5")
    assert embedder is not None

    def lead(chunks: np.ndarray, vector: np.ndarray) -> float:
        """How far the answer's (first) similarity stands above the best small talk's, as a
        share of the answer's own (the fusion normalises each arm's scores)."""
        sims = chunks @ vector
        return float((sims[0] - sims[1:].max()) / sims[0])

    leads = []
    for question, answer in ASKED:
        chunks = await embedder.embed_passages([answer, *SMALL_TALK])
        chunks = chunks / np.linalg.norm(chunks, axis=1, keepdims=True)
        raw = (await embedder.embed_queries([question], timeout_s=None))[0]
        raw = raw / np.linalg.norm(raw)
        adapted = np.asarray(chunk_query_vector(raw.tolist(), embedder.name, enabled=True))
        leads.append((lead(chunks, raw), lead(chunks, adapted)))

    assert all(moved > before + 0.005 for before, moved in leads), leads
    # The English question's Chinese answer ranks below small talk with the question's own
    # embedding and above it once moved.
    assert leads[1][0] < 0 < leads[1][1], leads
