"""A request whose Host header names another host is refused (421, JSON) on the REST API, MCP
and the inspector, under `contextd dev` (loopback names only, no keys) and `serve` (the names
of CONTEXTD_ALLOWED_HOSTS): a web page cannot reach a local server by DNS rebinding."""

import json
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.config import Settings, load_settings
from app.http.server import host_name
from tests.sessions.test_bad_input import tenant_rows
from tests.support.dev import dev_server
from tests.support.server import RunningServer, free_port, run_server

MCP_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


async def answers(url: str, host: str, key: str | None = None) -> dict[str, httpx.Response]:
    """The REST API, MCP, an inspector page and the inspector's login, asked with `Host: host`."""
    headers = {"Host": host, **({"Authorization": f"Bearer {key}"} if key else {})}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        return {
            "rest": await http.get("/v1/sessions"),
            "mcp": await http.post("/mcp", json=MCP_LIST, headers=MCP_HEADERS),
            "inspector": await http.get("/inspect"),
            "login": await http.post(
                "/inspect/login",
                content=b"key=x",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            ),
        }


def refused(responses: dict[str, httpx.Response], host: str) -> None:
    for surface, resp in responses.items():
        assert resp.status_code == 421, (surface, resp.status_code, resp.text)
        error = resp.json()["error"]
        assert error["code"] == "misdirected_request", surface
        assert error["field"] == "Host"
        assert repr(host) in error["message"]


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("LocalHost:8080", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]:9", "[::1]"),
        ("[::1]", "[::1]"),
        ("api.example.com:443", "api.example.com"),
        ("attacker.example", "attacker.example"),
        ("localhost.attacker.example:80", "localhost.attacker.example"),
        ("127.0.0.1:80@evil", "127.0.0.1:80@evil"),
        ("", ""),
    ],
)
def test_host_name_drops_only_a_numeric_port(header: str, name: str) -> None:
    assert host_name(header) == name


def test_allowed_hosts_setting() -> None:
    assert load_settings().allowed_hosts == ["localhost", "127.0.0.1", "[::1]"]
    assert load_settings(allowed_hosts="API.example.com, localhost").allowed_hosts == [
        "api.example.com",
        "localhost",
    ]
    with pytest.raises(ValueError, match="allowed_hosts"):
        load_settings(auth_disabled=True, allowed_hosts="*")


async def test_serve_refuses_a_foreign_host_and_answers_loopback_names(
    server: RunningServer, api_key: str
) -> None:
    port = server.url.rsplit(":", 1)[1]
    for host in ("attacker.example", f"attacker.example:{port}", f"localhost.evil:{port}"):
        refused(await answers(server.url, host, api_key), host)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        allowed = await answers(server.url, host, api_key)
        assert allowed["rest"].status_code == 200, host
        assert allowed["mcp"].status_code == 200, host
        assert allowed["inspector"].status_code == 200, host
    async with httpx.AsyncClient(base_url=server.url, headers={"Host": "10.1.2.3"}) as probe:
        # Orchestrators probe and Prometheus scrapes by IP (or a compose service name).
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await probe.get(path)).status_code == 200, path
        assert "contextd_http_request_duration_seconds" in (await probe.get("/metrics")).text


async def test_a_page_of_another_site_can_neither_read_nor_write(
    server: RunningServer, api_key: str, engine: AsyncEngine, tenant_name: str
) -> None:
    """What a browser lets another site's page send to a loopback server with a loopback Host:
    a "simple" cross-origin request (GET, or POST of a form or text/plain), whose answer it may
    not read without CORS headers. The API sends none, and takes no body but JSON."""
    page = {"Origin": "http://attacker.example", "Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=server.url, headers=page, timeout=30) as http:
        read = await http.get("/v1/sessions")
        assert "access-control-allow-origin" not in read.headers
        for content_type in ("text/plain", "application/x-www-form-urlencoded"):
            body = json.dumps({"turns": [{"role": "user", "content": "hi"}]})
            posted = await http.post(
                "/v1/sessions/csrf/turns", content=body, headers={"Content-Type": content_type}
            )
            assert posted.status_code == 415, content_type
            assert "access-control-allow-origin" not in posted.headers
        preflight = await http.options(
            "/v1/sessions/csrf", headers={"Access-Control-Request-Method": "DELETE"}
        )
        assert "access-control-allow-origin" not in preflight.headers
    assert await tenant_rows(engine, tenant_name) == (0, 0)


async def test_serve_answers_the_configured_names_only(settings: Settings, api_key: str) -> None:
    configured = settings.model_copy(update={"allowed_hosts": ["contextd.internal"]})
    with run_server(configured) as served:
        allowed = await answers(served.url, "contextd.internal:8443", api_key)
        assert {surface: r.status_code for surface, r in allowed.items()} == {
            "rest": 200,
            "mcp": 200,
            "inspector": 200,
            "login": 401,  # the key "x" is no key
        }
        port = served.url.rsplit(":", 1)[1]
        refused(await answers(served.url, f"127.0.0.1:{port}", api_key), f"127.0.0.1:{port}")


async def test_dev_refuses_a_foreign_host(tmp_path: Path) -> None:
    port = free_port()
    with dev_server(tmp_path, port) as dev:
        for host in ("attacker.example", f"rebound.attacker.example:{port}"):
            refused(await answers(dev.url, host), host)
        allowed = await answers(dev.url, f"localhost:{port}")
        assert allowed["rest"].status_code == 200
        assert allowed["mcp"].status_code == 200
        assert allowed["inspector"].status_code == 200
        async with httpx.AsyncClient(base_url=dev.url, timeout=30) as http:
            page = await http.post(
                "/mcp",
                json=MCP_LIST,
                headers={**MCP_HEADERS, "Origin": "http://attacker.example"},
            )
        assert page.status_code == 403  # a page of another origin, even with a loopback Host
        assert any("hosts" in line and "localhost" in line for line in dev.lines)
