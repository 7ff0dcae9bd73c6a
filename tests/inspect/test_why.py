""" "Why was this in my prompt?" answered by the inspector of a real `contextd dev`, in Chromium.

Dev keeps every build's manifest, no `persist_manifest` asked. An agent's tool loop in a small
window: the session page lists the builds first; the shown build draws its budget (what each
part took, what was left), lists each fragment in or out with its reason and a link to its
turns, the cleared tool results with their stubs; the window shows tool calls and results.
Deleting the session erases its stored builds. Screenshots go to docs/img/ (docs/INSPECTOR.md)."""

import json
import os
from pathlib import Path
from typing import Any

import httpx
import psycopg
from playwright.async_api import BrowserContext, Page

from tests.prompt.test_tool_clearing_api import LIMIT, RESERVE, ROUNDS, SYSTEM, round_turns
from tests.support.dev import dev_server
from tests.support.server import free_port
from tests.support.waiting import wait_for

# The screenshots of docs/INSPECTOR.md are refreshed with CONTEXTD_DOCS_SCREENSHOTS=1; other
# runs write them under the test's own directory, so a test run leaves the tree clean.
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
SID = "why-inspector"
FACT = "My booking reference is LY-40917 and the budget is at most 120 EUR."
QUESTION = "What budget did I give with booking LY-40917?"


async def seed(http: httpx.AsyncClient) -> tuple[str, str]:
    """The fact, then tool rounds with a build after each (as an agent builds before each model
    call); before the last round a question that recalls the fact. Returns the ids of the
    question's build and of the newest build (mid tool loop)."""
    config = {"context_limit": LIMIT, "reserve_tokens": RESERVE, "min_recent_turns": 4}
    assert (await http.put(f"/v1/sessions/{SID}", json=config)).status_code == 200
    first = [{"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."}]
    ask = {"role": "user", "content": "Check all my reservations, please."}
    assert (await http.post(f"/v1/sessions/{SID}/turns", json={"turns": [*first, ask]})).is_success
    question_build = ""
    for n in range(ROUNDS):
        if n == ROUNDS - 1:
            body = await build(http, query=QUESTION, append=True)
            question_build = body["build_id"]
        appended = await http.post(f"/v1/sessions/{SID}/turns", json={"turns": round_turns(n)})
        assert appended.status_code == 201, appended.text
        body = await build(http)
    return question_build, body["build_id"]


async def build(http: httpx.AsyncClient, **extra: Any) -> dict[str, Any]:
    built = await http.post(f"/v1/sessions/{SID}/build-prompt", json={"system": SYSTEM, **extra})
    assert built.status_code == 200, built.text
    body: dict[str, Any] = built.json()
    return body


async def stored_builds(database_url: str, session_pk: Any) -> int:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM prompt_builds WHERE session_id = %s", (session_pk,)
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


async def session_pk(database_url: str) -> Any:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute("SELECT id FROM sessions WHERE external_id = %s", (SID,))
        row = await cursor.fetchone()
        assert row is not None
        return row[0]


async def manifest_rows(page: Page) -> list[dict[str, str]]:
    rows = page.locator("details.build table.manifest tbody tr")
    out = []
    for i in range(await rows.count()):
        row = rows.nth(i)
        cells = await row.locator("td").all_inner_texts()
        out.append(
            {
                "id": cells[0].split("\n")[0].strip(),
                "part": await row.get_attribute("data-part") or "",
                "included": await row.get_attribute("data-included") or "",
                "turns": await row.get_attribute("data-turns") or "",
                "source": cells[3],
                "why": cells[-1].strip(),
            }
        )
    return out


async def test_dev_inspector_says_why_each_fragment_was_in_or_out(
    tmp_path: Path, browser: BrowserContext
) -> None:
    shots = DOCS_IMG if os.environ.get("CONTEXTD_DOCS_SCREENSHOTS") == "1" else tmp_path / "img"
    shots.mkdir(parents=True, exist_ok=True)
    with dev_server(tmp_path, free_port()) as dev:
        async with httpx.AsyncClient(base_url=dev.url, timeout=60) as http:
            question_build, newest = await seed(http)
            page = await browser.new_page()
            await page.set_viewport_size({"width": 1280, "height": 1100})
            await page.goto(f"{dev.url}/inspect/sessions/{SID}")

            # the builds come first, the newest shown in full
            listed = page.locator("#build-list tbody tr")
            assert await listed.count() == 10  # the page lists the newest ten of those kept
            builds_at = await page.locator("#builds").bounding_box()
            chart_at = await page.locator("#watermark-chart").bounding_box()
            assert builds_at and chart_at and builds_at["y"] < chart_at["y"]
            assert await page.locator("details.build").get_attribute("id") == f"build-{newest}"
            await page.screenshot(path=shots / "inspector-builds.png")

            # the budget as a picture: the parts take the whole limit, C − r
            parts = page.locator("#budget rect.budget-part")
            taken = {
                await parts.nth(i).get_attribute("data-part"): int(
                    await parts.nth(i).get_attribute("data-tokens") or "0"
                )
                for i in range(await parts.count())
            }
            assert {"system", "window", "left"} <= set(taken)
            assert sum(taken.values()) == LIMIT - RESERVE

            # each fragment in or out with its reason, linked to the turns the page shows
            rows = await manifest_rows(page)
            assert {r["included"] for r in rows} == {"yes", "no"}
            assert all(r["why"] for r in rows if r["included"] == "no")
            assert all(not r["why"] for r in rows if r["included"] == "yes")
            links = page.locator("details.build table.manifest a.turns")
            assert await links.count() >= 4
            for i in range(await links.count()):
                target = await links.nth(i).get_attribute("href") or ""
                assert await page.locator(target).count() == 1, target
            window_link = page.locator("details.build a.turns[href^='#turn-']").last
            target = await window_link.get_attribute("href") or ""
            await window_link.click()
            assert page.url.endswith(target) and await page.locator(target).is_visible()

            # cleared tool results: their stubs (the call, the values) and the chunk of the raw text
            stubs = [r for r in rows if r["source"].startswith("cleared tool result")]
            assert stubs and all(r["turns"] for r in stubs)
            stub = page.locator("details.build details.stub").first
            await stub.locator("summary").click()
            text = await stub.locator("pre").inner_text()
            assert text.startswith("[tool result cleared") and "get_reservation_details(" in text
            assert await page.locator("details.build a.raw").count() >= 1

            # tool rows in the window: the call's name and arguments, the result's call id
            last_call, last_result = round_turns(ROUNDS - 1)
            call = page.locator(f"#window tr:has-text('call {last_call['tool_calls'][0]['id']}')")
            assert "get_reservation_details" in await call.first.inner_text()
            assert f"R{ROUNDS - 1:03d}X" in await call.first.inner_text()
            result = await page.locator("#window tr[data-role=tool]").last.inner_text()
            assert f"result of call {last_result['tool_call_id']}" in result

            # another build, chosen from the list: the question's, recalling the fact
            await page.click(f"#build-list a[href='?build={question_build}#builds']")
            assert await page.locator("details.build").get_attribute("id") == (
                f"build-{question_build}"
            )
            recalled = [r for r in await manifest_rows(page) if r["part"] == "recalled"]
            assert any(r["included"] == "yes" and r["turns"] for r in recalled), recalled
            chunk_link = page.locator("details.build tr[data-part=recalled] a.turns").first
            target = await chunk_link.get_attribute("href") or ""
            assert target.startswith("#chunk-")
            await chunk_link.click()
            chunk = page.locator(target)
            assert await chunk.is_visible()
            await chunk.locator("summary").click()  # its raw text, opened like a person would
            assert FACT in await chunk.locator("pre.raw-text").inner_text()
            await page.click("details.build details.stub summary")
            assert "get_reservation_details(" in await page.inner_text("details.build details.stub")
            await page.locator("details.build").screenshot(path=shots / "inspector-build.png")

            # erased with the session
            state = json.loads((tmp_path / ".contextd" / "dev.json").read_text())
            pk = await session_pk(state["database_url"])
            assert await stored_builds(state["database_url"], pk) == ROUNDS + 1
            deleted = await http.delete(f"/v1/sessions/{SID}")
            assert deleted.status_code == 202
            receipt = await wait_for(
                lambda: http.get(f"/v1/erase-receipts/{deleted.json()['erase_receipt_id']}"),
                lambda r: r.json().get("status") == "completed",
                what="the session erase",
            )
            assert "prompt_builds" in receipt.json()["stores"]
            assert await stored_builds(state["database_url"], pk) == 0
