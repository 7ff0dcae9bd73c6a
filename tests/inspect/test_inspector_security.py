"""The inspector in Chromium keeps to its own site: a sign-in posted by another site's page is
refused, the cookie holds a signed token (never the key), and every page carries a strict
Content-Security-Policy (no framing, no script), nosniff and a referrer policy — under which the
pages still render as designed."""

import httpx
from playwright.async_api import BrowserContext, ConsoleMessage
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.auth.service import hash_key
from app.inspect.endpoints import COOKIE, OTHER_SITE
from tests.conftest import new_key
from tests.support.server import RunningServer

ATTACKER = "http://attacker.example/"


def attacker_page(inspector: str, key: str) -> str:
    return (
        f'<form method="post" action="{inspector}/inspect/login">'
        f'<input name="key" value="{key}"><button id="go" type="submit">go</button></form>'
    )


async def test_login_csrf_is_refused_and_the_cookie_holds_no_key(
    server: RunningServer,
    api_key: str,
    tenant_name: str,
    engine: AsyncEngine,
    browser: BrowserContext,
) -> None:
    violations: list[str] = []

    def watch(message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            violations.append(message.text)

    # Another site's page posts its own key to the sign-in: the browser must not get signed in.
    attacker_key = await new_key(engine, "inspector-attacker", ["sessions:read"])
    page = await browser.new_page()
    page.on("console", watch)
    await page.route(
        ATTACKER,
        lambda route: route.fulfill(
            content_type="text/html", body=attacker_page(server.url, attacker_key)
        ),
    )
    await page.goto(ATTACKER)
    async with page.expect_response(f"{server.url}/inspect/login") as posted:
        await page.click("#go")
    assert (await posted.value).status == 403
    assert OTHER_SITE in await page.inner_text("#login-error")
    assert await browser.cookies(f"{server.url}/inspect") == []

    # Signed in on the inspector's own page: an HttpOnly, SameSite=Strict token, not the key.
    first = await page.goto(f"{server.url}/inspect")
    assert first is not None and first.status == 401
    headers = await first.all_headers()
    await page.fill("#key", api_key)
    async with page.expect_navigation(url=f"{server.url}/inspect"):
        await page.click("button[type=submit]")
    assert await page.inner_text("h1") == "Sessions"
    (cookie,) = await browser.cookies(f"{server.url}/inspect")
    assert cookie["name"] == COOKIE
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    secret = api_key.removeprefix("ctxd_")
    for held in (api_key, secret, secret[:12], hash_key(api_key)):
        assert held not in cookie["value"]
    assert await page.evaluate("document.cookie") == ""  # no script can read it either

    # Every page: the strict policy, under which the inline styles still apply.
    listed = await page.goto(f"{server.url}/inspect")
    assert listed is not None and listed.status == 200
    for answer in (headers, await listed.all_headers()):
        policy = answer["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
        assert "script-src" not in policy  # default-src 'none': no script at all
        assert answer["x-content-type-options"] == "nosniff"
        assert answer["referrer-policy"] == "same-origin"
        assert answer["x-frame-options"] == "DENY"
    assert tenant_name in await page.inner_text("header .who")
    background = await page.evaluate(
        "getComputedStyle(document.querySelector('header')).backgroundColor"
    )
    assert background == "rgb(29, 36, 48)"
    assert violations == []


async def test_a_tampered_or_revoked_sign_in_is_refused(
    server: RunningServer, engine: AsyncEngine, tenant_name: str
) -> None:
    key = await new_key(engine, tenant_name, ["sessions:read"])
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        signed_in = await http.post("/inspect/login", data={"key": key})
        assert signed_in.status_code == 303
        token = http.cookies[COOKIE]
        assert key not in token and "Max-Age=43200" in signed_in.headers["set-cookie"]
        assert (await http.get("/inspect")).status_code == 200

        key_id, expires, mac = token.split(".")
        for forged in (
            f"{key_id}.{int(expires) + 3600}.{mac}",  # a longer sign-in
            f"{key_id}.{expires}.{mac[:-2]}AA",
            f"{key_id}.1.{mac}",  # long expired
            key,  # the key itself, as earlier versions kept it
        ):
            http.cookies.set(COOKIE, forged, path="/inspect")
            assert (await http.get("/inspect")).status_code == 401, forged

        http.cookies.set(COOKIE, token, path="/inspect")
        assert (await http.get("/inspect")).status_code == 200
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE api_keys SET revoked_at = now() WHERE id = :id"), {"id": key_id}
            )
        assert (await http.get("/inspect")).status_code == 401  # revoking the key signs out


async def test_a_post_from_another_origin_is_refused_without_a_browser(
    server: RunningServer, api_key: str
) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for headers in (
            {"Origin": "http://attacker.example"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site", "Origin": server.url},
            {"Sec-Fetch-Site": "same-site"},
        ):
            for path in ("/inspect/login", "/inspect/logout"):
                resp = await http.post(path, data={"key": api_key}, headers=headers)
                assert resp.status_code == 403, (path, headers)
                assert "set-cookie" not in resp.headers
        same = await http.post(
            "/inspect/login", data={"key": api_key}, headers={"Origin": server.url}
        )
        assert same.status_code == 303
