"""The rows of the vector arm's chunks are kept per process
(`app.recall.session_chunks.SessionChunks`): a build whose nearest chunks' rows are kept (the
vector statement then returns ids and distances only) builds what a first read builds, and a
forgotten turn never comes back through them, in English and Chinese, with a real embedder over
HTTP and the worker embedding the chunks."""

import hashlib
import math
from typing import Any

import httpx
import pytest

from app.core.config import Settings
from app.domain.text import terms
from tests.prompt.test_recall_needles import filler, load, offloaded, recalled_block
from tests.recall.test_shown_lines import same_build
from tests.support.loopback import loopback_server, with_openai_embedder
from tests.support.server import run_server

OWN_DATABASE = True  # it runs a worker: see tests/conftest.py
DIM = 8  # `with_openai_embedder`'s dimension


def bag_of_terms(text: str) -> list[float]:
    """A deterministic unit vector: the text's terms hashed into `DIM` buckets, plus a constant."""
    vector = [0.1] * DIM
    for term in terms(text):
        vector[hashlib.sha1(term.encode()).digest()[0] % DIM] += 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def embeddings(method: str, path: str, body: Any) -> tuple[int, Any]:
    data = [{"index": i, "embedding": bag_of_terms(t)} for i, t in enumerate(body["input"])]
    return 200, {"data": data}


@pytest.mark.parametrize(
    ("lang", "secret", "query"),
    [
        ("en", "The locker code is vexmarlin 4471.", "what was the locker code again?"),
        ("zh", "储物柜密码是雪貂四四七一。", "储物柜密码是多少？"),
    ],
)
async def test_kept_rows_build_the_same_and_a_forgotten_turn_stays_out(
    settings: Settings, admin_key: str, lang: str, secret: str, query: str
) -> None:
    sid = f"kept-rows-{lang}"
    with (
        loopback_server(embeddings) as embedder,
        run_server(with_openai_embedder(settings, embedder.url), with_worker=True) as api,
    ):
        async with httpx.AsyncClient(
            base_url=api.url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60
        ) as http:
            await load(http, sid, [("user", secret), *filler(lang, 80, seed=5)])
            offload = {"type": "offload", "until_tokens": 1}
            moved = await http.post(f"/v1/sessions/{sid}/memory", json=offload)
            assert moved.status_code == 200, moved.text
            await offloaded(http, sid, embedded=True)

            async def build() -> dict[str, Any]:
                resp = await http.post(f"/v1/sessions/{sid}/build-prompt", json={"query": query})
                assert resp.status_code == 200, resp.text
                body: dict[str, Any] = resp.json()
                assert "vector_unavailable" not in body["fallbacks"]
                return body

            first = await build()  # reads the vector arm's rows with its statement
            assert secret in recalled_block(first), first["recall"]
            again = await build()  # the same chunks' rows, kept: the statement reads distances
            assert same_build(first, again)

            listed = (await http.get(f"/v1/sessions/{sid}/turns", params={"limit": 5})).json()
            seq = next(t["seq"] for t in listed["turns"] if t["content"] == secret)
            forgot = await http.post(
                f"/v1/sessions/{sid}/memory", json={"type": "forget", "turn_range": [seq, seq]}
            )
            assert forgot.status_code == 200, forgot.text
            assert forgot.json()["data"]["tombstoned_chunks"]

            after = await build()
    assert secret not in str(after)
    assert after["recall"]["items"]  # recall still answers, from the other chunks
