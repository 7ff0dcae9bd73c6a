"""A remembered item's vector is made from its text and its tags (`embedding_text`): an item's
labels (a topic, a mood) count in recall's vector arm, its lexical terms stay those of the text."""

import httpx

from app.core.config import Settings
from app.memories.policy import embedding_text
from tests.support.loopback import loopback_server, with_openai_embedder
from tests.support.server import run_server
from tests.support.waiting import wait_for

TAGGED = "Mira danced at the spring lantern parade and felt very happy."
UNTAGGED = "Refund order number: ORD-77431."


def test_embedding_text_puts_the_tags_after_the_text() -> None:
    assert embedding_text(TAGGED, ["Activity", "Happy"]) == f"{TAGGED} (Activity, Happy)"
    assert embedding_text("Bart在圣诞节晚会上跳舞。", ["开心"]) == "Bart在圣诞节晚会上跳舞。 (开心)"
    assert embedding_text(UNTAGGED, []) == UNTAGGED


async def test_the_worker_embeds_an_item_with_its_tags(settings: Settings, api_key: str) -> None:
    def embeddings(method: str, path: str, body: dict[str, list[str]]) -> tuple[int, object]:
        vectors = [{"index": i, "embedding": [1.0] * 8} for i in range(len(body["input"]))]
        return 200, {"data": vectors}

    with loopback_server(embeddings) as api:

        async def embedded() -> list[str]:
            return sorted(text for _, _, body in api.requests for text in body["input"])

        with run_server(with_openai_embedder(settings, api.url), with_worker=True) as server:
            async with httpx.AsyncClient(
                base_url=server.url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
            ) as http:
                created = await http.put("/v1/sessions/tagged", json={})
                assert created.status_code == 200, created.text
                for body in (
                    {"type": "remember", "text": TAGGED, "tags": ["Happy", " Activity "]},
                    {"type": "remember", "text": UNTAGGED},
                ):
                    stored = await http.post("/v1/sessions/tagged/memory", json=body)
                    assert stored.status_code == 200, stored.text
                    assert stored.json()["data"]["outcome"] == "stored", stored.text
                inputs = await wait_for(
                    embedded, lambda texts: UNTAGGED in texts and any(TAGGED in t for t in texts),
                    what="both items embedded",
                )  # fmt: skip
    # Tags are stored trimmed and sorted; the text the worker embeds carries them, in that order.
    # (The worker may embed other tests' items of the shared database too: only ours are read.)
    assert [t for t in inputs if TAGGED in t] == [f"{TAGGED} (Activity, Happy)"]
