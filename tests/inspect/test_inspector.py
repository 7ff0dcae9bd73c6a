"""The web inspector in a real browser against a live server with a seeded session: the login
form, the sessions list, and a session page showing the offload sawtooth, a chunk's raw text,
notes, a remembered item, a build manifest with its reasons and an erase receipt. The session
page is saved as a screenshot under test-output/inspector/."""

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from playwright.async_api import BrowserContext
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings
from tests.conftest import new_key
from tests.inspect.conftest import SCREENSHOTS
from tests.prompt.test_recall_needles import offloaded_session

OWN_DATABASE = True  # runs a worker

SID = "inspect-me"
QUERY = "what was that order number again?"


@dataclass
class Seeded:
    url: str
    key: str
    receipt_id: str
    build_id: str


@pytest.fixture
async def seeded(settings: Settings, admin_key: str) -> AsyncIterator[Seeded]:
    async with offloaded_session(settings, admin_key, SID, seed=5) as http:
        built = await http.post(
            f"/v1/sessions/{SID}/build-prompt",
            json={"system": "You are a travel agent.", "query": QUERY, "persist_manifest": True},
        )
        assert built.status_code == 200
        memory = f"/v1/sessions/{SID}/memory"
        kept = await http.post(memory, json={"type": "remember", "text": "Seat preference: aisle"})
        dropped = await http.post(memory, json={"type": "remember", "text": "Lunch at noon"})
        assert kept.status_code == dropped.status_code == 200
        forgot = await http.post(
            memory, json={"type": "forget", "memory_id": dropped.json()["data"]["memory_id"]}
        )
        assert forgot.status_code == 200, forgot.text
        yield Seeded(
            url=str(http.base_url).rstrip("/"),
            key=admin_key,
            receipt_id=forgot.json()["data"]["erase_receipt_id"],
            build_id=built.json()["build_id"],
        )


async def test_inspector_in_chromium_shows_the_real_session(
    seeded: Seeded, browser: BrowserContext
) -> None:
    page = await browser.new_page()
    first = await page.goto(f"{seeded.url}/inspect")
    assert first is not None and first.status == 401  # no key yet: the login form
    await page.fill("#key", "ctxd_wrong")
    await page.click("button[type=submit]")
    assert "invalid or revoked API key" in await page.inner_text("#login-error")
    await page.fill("#key", seeded.key)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{seeded.url}/inspect")
    assert SID in await page.inner_text("#sessions")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / "sessions.png", full_page=True)

    await page.click(f"a[href='/inspect/sessions/{SID}']")
    await page.wait_for_url(f"{seeded.url}/inspect/sessions/{SID}")
    assert await page.inner_text("#session-id") == SID

    # the sawtooth: crossings of θ, each followed by a drop recorded by an offload
    await page.click("details:has(#watermark-points) > summary")
    triggers = [
        float(t)
        for t in await page.locator(
            "#watermark-points tr[data-kind=trigger] td:nth-child(2)"
        ).all_inner_texts()
    ]
    drops = page.locator("#watermark-chart circle.offload-point")
    assert len(triggers) >= 1 and await drops.count() == len(triggers)
    assert all(ratio >= 0.8 for ratio in triggers)
    after = [
        float(await drops.nth(i).get_attribute("data-ratio") or "nan") for i in range(len(triggers))
    ]
    assert all(ratio < 0.8 for ratio in after)
    assert await page.locator("#watermark-chart polyline.watermark-line").count() == 1

    # a chunk's raw text, opened like a person would
    chunk = page.locator("#chunks tr", has_text="ORD-58213").first
    await chunk.locator("summary").click()
    raw = chunk.locator("pre.raw-text")
    assert await raw.is_visible()
    assert "My order number is ORD-58213" in await raw.inner_text()
    assert "not embedded" in await chunk.inner_text()  # the test server runs lexical-only

    assert "ORD-58213" in await page.inner_text("#notes")
    assert "Seat preference: aisle" in await page.inner_text("#memories")
    receipts = await page.inner_text("#receipts")
    assert seeded.receipt_id in receipts

    # the stored build: the recalled chunk in, and what was left out with its reason
    build = page.locator("details.build", has_text=seeded.build_id)
    assert await build.get_attribute("open") is not None
    rows = build.locator("table.manifest tbody tr")
    texts = await rows.all_inner_texts()
    assert any("\tc3\t" in t and "\tyes\t" in t for t in texts)
    dropped = [t for t in texts if "\tno\t" in t]
    assert dropped and all(t.rsplit("\t", 1)[-1].strip() for t in dropped)  # a reason each

    await page.click("details:has(#watermark-points) > summary")  # fold the points table again
    await page.screenshot(path=SCREENSHOTS / "session.png", full_page=True)
    assert (SCREENSHOTS / "session.png").stat().st_size > 50_000


async def test_pages_keep_tenants_apart_and_ask_for_a_key(
    seeded: Seeded, engine: AsyncEngine
) -> None:
    async with httpx.AsyncClient(base_url=seeded.url, timeout=30) as http:
        assert (await http.get(f"/inspect/sessions/{SID}")).status_code == 401
        owner = {"Authorization": f"Bearer {seeded.key}"}
        assert (await http.get(f"/inspect/sessions/{SID}", headers=owner)).status_code == 200

        stranger = await new_key(engine, "inspect-stranger", ["sessions:read"])
        other = {"Authorization": f"Bearer {stranger}"}
        listing = await http.get("/inspect", headers=other)
        assert listing.status_code == 200 and SID not in listing.text
        hidden = await http.get(f"/inspect/sessions/{SID}", headers=other)
        assert hidden.status_code == 404 and "ORD-58213" not in hidden.text

        writer_only = await new_key(engine, "inspect-stranger", ["sessions:write"])
        refused = await http.get("/inspect", headers={"Authorization": f"Bearer {writer_only}"})
        assert refused.status_code == 403 and "sessions:read" in refused.text

        login = await http.post("/inspect/login", data={"key": seeded.key})
        assert login.status_code == 303 and login.headers["location"] == "/inspect"
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "Path=/inspect" in cookie and "SameSite=strict" in cookie
        assert (await http.get(f"/inspect/sessions/{SID}")).status_code == 200  # the cookie
        out = await http.post("/inspect/logout")
        assert out.status_code == 303
        assert (await http.get(f"/inspect/sessions/{SID}")).status_code == 401


async def test_previews_cut_between_words_not_inside_one(seeded: Seeded) -> None:
    owner = {"Authorization": f"Bearer {seeded.key}"}
    lead = "x" * 114 + " "  # the 120-character preview ends inside the next word
    content = lead + "Fourvière et la Saône, puis le Musée des Confluences. " * 4
    async with httpx.AsyncClient(base_url=seeded.url, timeout=30, headers=owner) as http:
        appended = await http.post(
            "/v1/sessions/preview-fr/turns", json={"turns": [{"role": "user", "content": content}]}
        )
        assert appended.status_code == 201
        page = await http.get("/inspect/sessions/preview-fr")
    assert page.status_code == 200
    assert f"<summary>{lead.rstrip()}…</summary>" in page.text  # not "Fourvi…"
    assert "Fourvi…" not in page.text
