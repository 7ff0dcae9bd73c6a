"""The CLI on the embedded stack, as a newcomer meets it: `contextd keys create` works before and
while `contextd dev --auth` runs in the same directory, `keys list` and `keys revoke` manage
them, stdout carries only the result, and every mistake is one clear line."""

import asyncio
import json
import socket
from pathlib import Path

import httpx

from app.core.config import load_settings
from app.runtime.cli import bind_port
from tests.support.dev import DevServer, contextd, dev_server
from tests.support.loopback import closed_port_url
from tests.support.server import free_port


def new_key(cwd: Path, *scopes: str) -> tuple[str, str]:
    """(key, key id). stdout is the one JSON line (logs go to stderr): `| jq -r .key` works."""
    done = contextd(cwd, "keys", "create", "--tenant", "acme", *[f"--scope={s}" for s in scopes])
    assert done.returncode == 0, done.stderr
    created = json.loads(done.stdout)
    assert created["key"].startswith("ctxd_") and created["tenant"] == "acme"
    return created["key"], created["key_id"]


def key_lines(cwd: Path, *args: str) -> list[dict[str, object]]:
    done = contextd(cwd, "keys", *args)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def status(dev: DevServer, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{dev.url}/v1/memory/tool", headers=headers, timeout=30).status_code


def test_keys_before_and_during_dev_and_clear_errors(tmp_path: Path) -> None:
    serve = contextd(tmp_path, "serve")
    assert serve.returncode == 2
    assert serve.stderr.startswith("contextd serve: DATABASE_URL and REDIS_URL are not set and ")
    assert "Traceback" not in serve.stderr

    bad = contextd(tmp_path, "keys", "create", "--tenant", "acme", "--scope", "bogus")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "contextd keys: unknown scope 'bogus'" in bad.stderr

    before, before_id = new_key(tmp_path)  # no dev running: it starts the directory's PostgreSQL
    port = free_port()
    with dev_server(tmp_path, port, "--auth") as dev:
        assert (tmp_path / ".contextd" / "dev.json").exists()
        during, during_id = new_key(tmp_path, "sessions:read")  # joins the running dev's database
        assert status(dev, before) == 200 and status(dev, during) == 200
        assert status(dev, None) == 401

        listed = key_lines(tmp_path, "list", "--tenant", "acme")
        assert [(k["key_id"], k["scopes"], k["revoked_at"]) for k in listed] == [
            (before_id, ["sessions:read", "sessions:write"], None),
            (during_id, ["sessions:read"], None),
        ]
        assert all(before not in json.dumps(k) and during not in json.dumps(k) for k in listed)
        assert listed[0]["prefix"] == before[:11]
        (revoked,) = key_lines(tmp_path, "revoke", before_id)
        assert revoked["key_id"] == before_id and revoked["revoked_at"] is not None
        assert status(dev, before) == 401 and status(dev, during) == 200
        assert key_lines(tmp_path, "revoke", before_id) == [revoked]  # once: the first time kept
        assert [k["revoked_at"] for k in key_lines(tmp_path, "list")] == [
            revoked["revoked_at"],
            None,
        ]
        unknown = contextd(tmp_path, "keys", "revoke", "0" * 8 + "-0000-0000-0000-" + "0" * 12)
        assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
        assert "contextd keys: no key with id 00000000-" in unknown.stderr

        busy = contextd(tmp_path / "..", "dev", "--port", str(port))
        assert busy.returncode == 2 and "ready" not in busy.stdout
        assert f"contextd dev: 127.0.0.1:{port} is already in use" in busy.stderr

        twice = contextd(tmp_path, "dev", "--port", str(free_port()))
        assert twice.returncode == 2 and "ready" not in twice.stdout
        assert f"already runs with data in {tmp_path / '.contextd'}" in twice.stderr

    assert dev.process.returncode == 0
    assert "contextd dev stopped" in "".join(dev.lines)
    assert not (tmp_path / ".contextd" / "dev.json").exists()


def test_a_mistake_in_the_settings_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    mistakes = [
        (
            {"CONTEXTD_SESSION_DEFAULTS__CONTEXT_LIMIT": "128k"},
            "CONTEXTD_SESSION_DEFAULTS__CONTEXT_LIMIT='128k': Input should be a valid integer",
        ),
        (
            {"CONTEXTD_SESSION_DEFAULTS__TOOL_RESULTS_EXCLUDE_TOOLS": "search,fetch"},
            'CONTEXTD_SESSION_DEFAULTS__...: a value is not valid JSON (a list is written as ["a"',
        ),
        (
            {"CONTEXTD_AUTH_DISABLED": "true", "CONTEXTD_HOST": "0.0.0.0"},
            "CONTEXTD_AUTH_DISABLED is only allowed when binding to a loopback address "
            "(CONTEXTD_HOST is '0.0.0.0')",
        ),
        ({"DATABASE_URL": "mysql://db/contextd"}, "DATABASE_URL='mysql://db/contextd': unsupp"),
        ({"CONTEXTD_LOG_LEVEL": "verbose"}, "CONTEXTD_LOG_LEVEL='VERBOSE': Input should be 'DEBUG"),
    ]
    assert load_settings(log_level="debug").log_level == "DEBUG"  # any case, as logging's names
    for env, line in mistakes:
        done = contextd(tmp_path, "serve", **env)
        assert done.returncode == 2, env
        assert len(done.stderr.splitlines()) == 1, done.stderr  # no traceback
        assert done.stderr.startswith(f"contextd serve: {line}"), done.stderr
    down = closed_port_url().replace("http://", "postgresql://contextd@") + "/contextd"
    for command in (["migrate"], ["keys", "list"]):
        unreachable = contextd(tmp_path, *command, DATABASE_URL=down)
        assert unreachable.returncode == 2, unreachable.stderr
        assert "Traceback" not in unreachable.stderr  # before it: log lines, on stderr
        last = unreachable.stderr.splitlines()[-1]
        assert last.startswith(
            f"contextd {command[0]}: cannot use PostgreSQL at DATABASE_URL: connection failed:"
        )
        assert "Connection refused" in last
    workers = contextd(tmp_path, "serve", "--workers", "0")
    assert workers.returncode == 2
    assert workers.stderr.endswith(
        "contextd serve: error: argument --workers: must be at least 1\n"
    )


async def test_api_connections_send_without_nagle_delay() -> None:
    """Each accepted connection of the API's socket has TCP_NODELAY, else a keep-alive client
    waits ~40 ms (its delayed ACK) for every response after the first."""
    sock = bind_port("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    nodelay: asyncio.Future[int] = loop.create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            nodelay.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = await loop.create_server(Probe, sock=sock)
    try:
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        assert await asyncio.wait_for(nodelay, 10) != 0
        writer.close()
    finally:
        server.close()
