"""The `contextd` command: dev, serve, worker, migrate, keys, reembed, config, openapi, eval.

Without `DATABASE_URL` every command works on the embedded stack of `contextd dev` in the data
directory (`CONTEXTD_DATA_DIR`, default `./.contextd`): it joins the running `contextd dev` there
(whose addresses it finds in `dev.json`), or, for one-shot commands (`migrate`, `keys`,
`reembed`), starts that directory's PostgreSQL for the duration of the command.
"""

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core.config import Settings, load_settings

if TYPE_CHECKING:
    import uvicorn

    from app.auth.service import KeyRecord
    from app.runtime.embedded import EmbeddedStack

OPENAPI_PATH = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
API_DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "API.md"
API_DOC_BEGIN = "<!-- endpoints: made from openapi/openapi.json by `contextd openapi` -->"
API_DOC_END = "<!-- end of endpoints -->"
DEV_STATE_FILE = "dev.json"  # in the data directory while a `contextd dev` runs there


class CliError(Exception):
    """A problem the user can fix: printed as one line on stderr, exit status 2, no traceback."""


@dataclass(frozen=True)
class DevState:
    pid: int
    api_url: str
    database_url: str
    redis_url: str


def environment_settings() -> Settings:
    """The settings of the environment; a mistake in them is one line naming the variable."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from app.core.config import settings_problem

    try:
        return load_settings()
    except (ValidationError, SettingsError) as exc:
        raise CliError(settings_problem(exc)) from None


def running_dev(data_dir: Path) -> DevState | None:
    """The `contextd dev` running on this data directory, if its process is still alive."""
    try:
        state = DevState(**json.loads((data_dir / DEV_STATE_FILE).read_text()))
        os.kill(state.pid, 0)
    except (OSError, ValueError, TypeError):
        return None
    return state


def bind_port(host: str, port: int) -> socket.socket:
    """Bind the API's socket now, so a busy port fails before anything says "ready"."""
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY only on accepted sockets whose proto
    # says TCP, and with proto 0 every response after a connection's first waited ~40 ms for
    # the client's delayed ACK (Nagle) before its body went out.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CliError(
                f"{host}:{port} is already in use (another contextd?): stop that process or "
                "choose another port with --port N or CONTEXTD_PORT"
            ) from None
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _configure_logging(settings: Settings, *, dev: bool = False, one_shot: bool = False) -> None:
    """Root logger to stdout, one JSON object per line (or plain text, or under `contextd dev`
    short readable lines); uvicorn's loggers propagate here (`log_config=None` in `_serve`), so
    every line has the same shape. A one-shot command logs to stderr: its stdout carries only
    its result (`keys create | jq -r .key`)."""
    from app.core.observability import log_handler

    handler = log_handler(settings.log_format, dev=dev, stream=sys.stderr if one_shot else None)
    logging.basicConfig(level=settings.log_level, handlers=[handler], force=True)


def cmd_migrate(settings: Settings) -> None:
    from app.core.migrate import upgrade

    if not settings.database_url:
        raise CliError("DATABASE_URL is not set")
    upgrade(settings.database_url)
    print("migrations applied")


def with_dev_stack(
    settings: Settings, *, one_shot: bool
) -> tuple[Settings, "EmbeddedStack | None"]:
    """Fill unset `DATABASE_URL` / `REDIS_URL` from the data directory's embedded stack.

    Joins a running `contextd dev`; otherwise a one-shot command starts the directory's
    PostgreSQL itself (migrated, stopped again when the command ends; Redis is a cache and
    one-shot commands do without it). Returns the stack to stop, if one was started."""
    if settings.database_url and (settings.redis_url or one_shot):
        return settings, None
    dev = running_dev(settings.data_dir)
    if dev is not None:
        urls = {"database_url": settings.database_url or dev.database_url}
        urls["redis_url"] = settings.redis_url or dev.redis_url
        return settings.model_copy(update=urls), None
    if not one_shot:
        raise CliError(
            "DATABASE_URL and REDIS_URL are not set and no `contextd dev` is running with data "
            f"in {settings.data_dir.resolve()}: start `contextd dev` there (from that directory, "
            "or with CONTEXTD_DATA_DIR) or set both variables"
        )
    from app.runtime.embedded import EmbeddedStack

    stack = EmbeddedStack(settings.data_dir).start_postgres()
    started = settings.model_copy(update={"database_url": stack.database_url})
    from app.core.migrate import upgrade

    upgrade(stack.database_url)
    return started, stack


async def _serve(
    settings: Settings,
    with_worker: bool,
    with_api: bool = True,
    server_box: dict[str, object] | None = None,
    sock: socket.socket | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Serve the API and/or a worker in this loop; `server_box` exposes the server to stop it;
    `sock`: an already bound socket (see `bind_port`); `on_ready` runs once the API accepts
    requests (its lifespan done)."""
    import uvicorn

    from app.core.context import AppContext
    from app.core.observability import Metrics
    from app.http.server import uvicorn_config
    from app.runtime.api import create_app
    from app.runtime.worker import run_worker

    tasks: list[asyncio.Task[None]] = []
    metrics = Metrics()  # API and worker of this process report into one registry
    worker_context = AppContext.create(settings, metrics) if with_worker else None
    if worker_context is not None:
        tasks.append(asyncio.create_task(run_worker(settings, worker_context)))
    try:
        if with_api:
            config = uvicorn_config(create_app(settings, metrics), settings)
            server = uvicorn.Server(config)
            if server_box is not None:
                server_box["server"] = server
            if on_ready is not None:
                tasks.append(asyncio.create_task(_when_started(server, on_ready)))
            await server.serve(sockets=[sock] if sock is not None else None)
        else:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if worker_context is not None:
            await worker_context.aclose()


async def _when_started(server: "uvicorn.Server", action: Callable[[], None]) -> None:
    while not server.started:
        await asyncio.sleep(0.05)
    action()


def _serve_process(settings: Settings, sock: socket.socket | None) -> None:
    """One API process of `serve --workers N` (a spawned child: it sets up its own logging)."""
    _configure_logging(settings)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the whole process group
        asyncio.run(_serve(settings, with_worker=False, sock=sock))


def _dev_worker_process(settings: Settings, sock: socket.socket | None) -> None:
    """The worker of `contextd dev` (a spawned child, `CONTEXTD_WORKER__NICE` steps nicer).

    The terminal's Ctrl-C reaches the whole process group: this process ignores it and stops on
    the SIGTERM its parent sends once the API has stopped, so it is never taken for a crash."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(settings.worker.nice)
    _configure_logging(settings, dev=True)
    asyncio.run(_work_until_signalled(settings, (signal.SIGTERM,)))


async def _work_until_signalled(settings: Settings, stop_on: tuple[signal.Signals, ...]) -> None:
    """Run the worker until one of `stop_on` arrives, then stop it gracefully (running jobs end
    first). The handlers are installed whatever the signals' inherited disposition: a shell
    starts a background job with SIGINT ignored, and such a worker must still stop on it."""
    main = asyncio.current_task()
    assert main is not None
    for signum in stop_on:
        asyncio.get_running_loop().add_signal_handler(signum, main.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await _serve(settings, with_worker=True, with_api=False)


def cmd_serve(settings: Settings, workers: int) -> None:
    sock = bind_port(settings.host, settings.port)
    if workers == 1:
        asyncio.run(_serve(settings, with_worker=False, sock=sock))
        return
    from app.runtime.processes import Child, Supervisor

    api = Child("API", _serve_process)
    Supervisor(settings, [api] * workers).run(sock)


def cmd_dev(args: argparse.Namespace) -> None:
    from app.runtime.embedded import EmbeddedStack

    started = time.monotonic()
    base = environment_settings()
    port = args.port or base.port
    embedded = not base.database_url or not base.redis_url
    already = running_dev(base.data_dir) if embedded else None
    sock = bind_port(base.host, port)
    if already is not None:
        sock.close()
        raise CliError(
            f"a contextd dev (pid {already.pid}, {already.api_url}) already runs with data in "
            f"{base.data_dir.resolve()}: stop it, or start this one in another directory "
            "(or with CONTEXTD_DATA_DIR)"
        )
    stack = None
    overrides: dict[str, object] = {"auth_disabled": not args.auth, "port": port}
    if "persist_manifests" not in base.recall.model_fields_set:
        # The inspector answers "why was this in or out?" from stored manifests: dev keeps every
        # build's (the newest `manifests_kept_per_session` of each session) unless told not to.
        overrides["recall"] = base.recall.model_copy(update={"persist_manifests": True})
    if embedded:
        stack = EmbeddedStack(base.data_dir).start()
        overrides["database_url"] = base.database_url or stack.database_url
        overrides["redis_url"] = base.redis_url or stack.redis_url
    settings = load_settings(**overrides)
    from app.runtime.processes import Child, Supervisor

    # The worker runs in a process of its own: its offloads, notes and passage embeddings do not
    # take the API's GIL or event loop while it builds prompts (docs/BENCHMARKS.md, round 8).
    worker = Supervisor(settings, [Child("worker", _dev_worker_process)])
    # SIGTERM stops dev as Ctrl-C does (uvicorn re-raises it after its graceful shutdown): the
    # worker and the embedded stack are stopped below, not left running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    state_file = base.data_dir / DEV_STATE_FILE
    url = f"http://{settings.host}:{settings.port}"

    # The worker starts once the API answers: its start-up (a fresh interpreter, the encoder)
    # does not compete with the API's for the cores before "ready".
    api_ready = threading.Event()

    def banner() -> None:
        api_ready.set()
        print(f"contextd dev ready in {time.monotonic() - started:.1f}s")
        print(f"  API   {url}/v1   docs {url}/docs   data {base.data_dir.resolve()}")
        print(f"  see   {url}/inspect (sessions, watermark, notes, chunks)   MCP {url}/mcp")
        if settings.auth_disabled:
            print("  auth  DISABLED (dev on loopback): no Authorization header needed")
        else:
            print("  auth  'Authorization: Bearer <key>' (a key: contextd keys create --tenant T)")
        hosts = ", ".join(settings.allowed_hosts)
        print(f"  hosts {hosts} only, any port (CONTEXTD_ALLOWED_HOSTS; another Host header: 421)")
        sys.stdout.flush()

    try:
        with worker.environment():
            _configure_logging(settings, dev=True)
            cmd_migrate(settings)
            if stack is not None:  # other commands of this directory join this stack
                urls = (settings.database_url or "", settings.redis_url or "")
                state_file.write_text(json.dumps(DevState(os.getpid(), url, *urls).__dict__))
            with worker.alongside(start=api_ready):
                asyncio.run(_serve(settings, with_worker=False, sock=sock, on_ready=banner))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if stack is not None:
            state_file.unlink(missing_ok=True)
            stack.stop()
        print("contextd dev stopped")


def cmd_keys(settings: Settings, args: argparse.Namespace) -> None:
    """`keys create` prints the new key once; `keys list` one line per key (never the key);
    `keys revoke` the revoked key's line. Each line is a JSON object, on stdout."""
    from app.auth import service
    from app.core.context import AppContext
    from app.core.db import unit_of_work
    from app.core.errors import ContextdError
    from app.domain.callers import DEFAULT_SCOPES

    async def _run() -> list[dict[str, object]]:
        context = AppContext.create(settings)
        try:
            async with unit_of_work(context.sessionmaker) as db:
                if args.keys_command == "create":
                    scopes = args.scope or [s.value for s in DEFAULT_SCOPES]
                    key, key_id = await service.create_key(db, args.tenant, scopes)
                    return [{"key": key, "key_id": key_id, "tenant": args.tenant}]
                if args.keys_command == "revoke":
                    return [_key_line(await service.revoke_key(db, args.key_id))]
                return [_key_line(record) for record in await service.list_keys(db, args.tenant)]
        finally:
            await context.aclose()

    try:
        lines = asyncio.run(_run())
    except ContextdError as exc:
        raise CliError(exc.message) from None
    for line in lines:
        print(json.dumps(line))
    if args.keys_command == "create":
        print("store this key now: it is not shown again", file=sys.stderr)


def _key_line(record: "KeyRecord") -> dict[str, object]:
    line = dataclasses.asdict(record)
    line["created_at"] = record.created_at.isoformat()
    line["revoked_at"] = record.revoked_at.isoformat() if record.revoked_at else None
    return line


def cmd_reembed(settings: Settings, batch_size: int | None) -> None:
    from app.core.context import AppContext
    from app.runtime.reembed import reembed

    async def _run() -> int:
        context = AppContext.create(settings)
        try:
            return await reembed(context, batch_size or settings.embedding.batch_size)
        finally:
            await context.aclose()

    asyncio.run(_run())


def endpoint_index(spec: dict[str, Any]) -> str:
    """docs/API.md's list of endpoints, made from the OpenAPI document so it cannot drift."""
    rows = ["| method | path | what | tag |", "|---|---|---|---|"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            tags = ", ".join(operation.get("tags", []))
            summary = operation.get("summary", "")
            rows.append(f"| {method.upper()} | `{path}` | {summary} | {tags} |")
    return "\n".join(rows)


def api_doc_with_index(doc: str, spec: dict[str, Any]) -> str:
    """`doc` (docs/API.md) with the text between its endpoint markers made from `spec`."""
    head, rest = doc.split(API_DOC_BEGIN, 1)
    _, tail = rest.split(API_DOC_END, 1)
    return f"{head}{API_DOC_BEGIN}\n{endpoint_index(spec)}\n{API_DOC_END}{tail}"


def cmd_openapi(check: bool) -> int:
    from app.runtime.api import create_app

    document = create_app(load_settings()).openapi()
    spec = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    api_doc = api_doc_with_index(API_DOC_PATH.read_text(), document)
    if check:
        same = OPENAPI_PATH.exists() and OPENAPI_PATH.read_text() == spec
        same_doc = API_DOC_PATH.read_text() == api_doc
        print(
            "openapi.json is up to date" if same else "openapi.json differs: run contextd openapi"
        )
        if not same_doc:
            print("docs/API.md's endpoint list differs: run contextd openapi")
        return 0 if same and same_doc else 1
    OPENAPI_PATH.parent.mkdir(exist_ok=True)
    OPENAPI_PATH.write_text(spec)
    API_DOC_PATH.write_text(api_doc)
    print(f"wrote {OPENAPI_PATH} and the endpoint list of {API_DOC_PATH}")
    return 0


def _at_least_one(text: str) -> int:
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="contextd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", help="embedded Postgres+Valkey, migrations, API and worker")
    dev.add_argument("--port", type=int, help="API port (default CONTEXTD_PORT or 8080)")
    dev.add_argument("--auth", action="store_true", help="keep API-key auth on")
    serve = sub.add_parser("serve", help="serve the API (DATABASE_URL, REDIS_URL)")
    serve.add_argument(
        "--workers",
        type=_at_least_one,
        default=1,
        help="API processes sharing the port (default 1; see docs/DEPLOYMENT.md, Scaling out)",
    )
    sub.add_parser("worker", help="run a job worker (DATABASE_URL, REDIS_URL)")
    sub.add_parser("migrate", help="apply database migrations")
    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key and print it once")
    create.add_argument("--tenant", required=True, help="its tenant (created on first use)")
    create.add_argument(
        "--scope",
        action="append",
        default=[],
        help="repeatable: sessions:read, sessions:write, memory:offload, memory:forget "
        "(default: sessions:read and sessions:write)",
    )
    listing = keys_sub.add_parser("list", help="one line per key: id, tenant, scopes, revoked")
    listing.add_argument("--tenant", help="only this tenant's keys")
    revoke = keys_sub.add_parser("revoke", help="revoke a key: a 401 from its next request on")
    revoke.add_argument("key_id", help="the key_id printed by keys create or keys list")
    reembed = sub.add_parser("reembed", help="re-embed chunks with the configured embedder")
    reembed.add_argument("--batch-size", type=int, help="default CONTEXTD_EMBEDDING__BATCH_SIZE")
    sub.add_parser("config", help="print the configuration reference (Markdown)")
    openapi = sub.add_parser("openapi", help="write openapi/openapi.json")
    openapi.add_argument("--check", action="store_true", help="only compare, exit 1 on drift")
    from app.eval import add_parser as add_eval_parser

    add_eval_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "openapi":
        return cmd_openapi(args.check)
    if args.command == "eval":
        from app.eval import run as run_eval

        return run_eval(args)
    if args.command == "config":
        from app.core.config import session_settings_table, settings_table

        print(settings_table())
        print("\nPer session (`PUT /v1/sessions/{id}`), defaults from the variables above:\n")
        print(session_settings_table())
        return 0
    try:
        return _run(args)
    except CliError as exc:
        print(f"contextd {args.command}: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "dev":
        cmd_dev(args)
        return 0
    one_shot = args.command in ("migrate", "keys", "reembed")
    settings, stack = with_dev_stack(environment_settings(), one_shot=one_shot)
    _configure_logging(settings, one_shot=one_shot)
    from sqlalchemy.exc import OperationalError

    try:
        if args.command == "migrate":
            cmd_migrate(settings)
        elif args.command == "serve":
            cmd_serve(settings, args.workers)
        elif args.command == "worker":
            os.nice(settings.worker.nice)
            # SIGTERM (docker stop, systemd, Kubernetes) stops it as Ctrl-C does: gracefully.
            asyncio.run(_work_until_signalled(settings, (signal.SIGINT, signal.SIGTERM)))
        elif args.command == "keys":
            cmd_keys(settings, args)
        elif args.command == "reembed":
            cmd_reembed(settings, args.batch_size)
    except OperationalError as exc:  # a one-shot command's database is down, or refuses us
        reason = " ".join(str(exc.orig).split())
        raise CliError(f"cannot use PostgreSQL at DATABASE_URL: {reason}") from None
    finally:
        if stack is not None:
            stack.stop()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
