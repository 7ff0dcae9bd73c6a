"""The `contextd` command: dev, serve, worker, migrate, keys, reembed, openapi."""

import argparse
import asyncio
import contextlib
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from app.core.config import Settings, load_settings

OPENAPI_PATH = Path(__file__).resolve().parents[1] / "openapi" / "openapi.json"


def _configure_logging(settings: Settings) -> None:
    """Root logger to stdout, one JSON object per line (or plain text); uvicorn's loggers
    propagate here (`log_config=None` in `_serve`), so every line has the same shape."""
    from app.core.observability import log_handler

    logging.basicConfig(
        level=settings.log_level, handlers=[log_handler(settings.log_format)], force=True
    )


def cmd_migrate(settings: Settings) -> None:
    from app.core.migrate import upgrade

    assert settings.database_url, "DATABASE_URL is not set"
    upgrade(settings.database_url)
    print("migrations applied")


async def _serve(
    settings: Settings,
    with_worker: bool,
    with_api: bool = True,
    server_box: dict[str, object] | None = None,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve the API and/or a worker in this loop; `server_box` exposes the server to stop it;
    `sockets`: serve on these (already bound) instead of binding host and port."""
    import uvicorn

    from app.core.context import AppContext
    from app.core.observability import Metrics
    from app.jobs.worker import run_worker
    from app.main import create_app

    tasks: list[asyncio.Task[None]] = []
    metrics = Metrics()  # API and worker of this process report into one registry
    worker_context = AppContext.create(settings, metrics) if with_worker else None
    if worker_context is not None:
        tasks.append(asyncio.create_task(run_worker(settings, worker_context)))
    try:
        if with_api:
            config = uvicorn.Config(
                create_app(settings, metrics),
                host=settings.host,
                port=settings.port,
                log_level=settings.log_level.lower(),
                log_config=None,  # keep our handlers (JSON); our middleware writes the access log
                access_log=False,
            )
            server = uvicorn.Server(config)
            if server_box is not None:
                server_box["server"] = server
            await server.serve(sockets=sockets)
        else:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if worker_context is not None:
            await worker_context.aclose()


def _serve_process(settings: Settings, sock: socket.socket) -> None:
    """One API process of `serve --workers N` (a spawned child: it sets up its own logging)."""
    _configure_logging(settings)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the whole process group
        asyncio.run(_serve(settings, with_worker=False, sockets=[sock]))


def cmd_serve(settings: Settings, workers: int) -> None:
    if workers == 1:
        asyncio.run(_serve(settings, with_worker=False))
        return
    from app.processes import Supervisor

    Supervisor(settings, workers, _serve_process).run()


def cmd_dev(args: argparse.Namespace) -> None:
    from app.embedded import EmbeddedStack

    started = time.monotonic()
    base = load_settings()
    stack = None
    overrides: dict[str, object] = {"auth_disabled": not args.auth}
    if args.port:
        overrides["port"] = args.port
    if not base.database_url or not base.redis_url:
        stack = EmbeddedStack(base.data_dir).start()
        overrides["database_url"] = base.database_url or stack.database_url
        overrides["redis_url"] = base.redis_url or stack.redis_url
    settings = load_settings(**overrides)
    _configure_logging(settings)
    cmd_migrate(settings)
    url = f"http://{settings.host}:{settings.port}"
    print(f"contextd dev ready in {time.monotonic() - started:.1f}s")
    print(f"  API   {url}/v1   docs {url}/docs   data {base.data_dir.resolve()}")
    if settings.auth_disabled:
        print("  auth  DISABLED (dev on loopback): no Authorization header needed")
    else:
        print("  auth  send 'Authorization: Bearer <key>' (create one: contextd keys create)")
    sys.stdout.flush()
    try:
        asyncio.run(_serve(settings, with_worker=True))
    except KeyboardInterrupt:
        pass
    finally:
        if stack is not None:
            stack.stop()
        print("contextd dev stopped")


def cmd_keys_create(settings: Settings, tenant: str, scopes: list[str]) -> None:
    from app.auth.schemas import DEFAULT_SCOPES
    from app.auth.service import create_key
    from app.core.context import AppContext
    from app.core.db import unit_of_work

    async def _create() -> tuple[str, str]:
        context = AppContext.create(settings)
        try:
            async with unit_of_work(context.sessionmaker) as db:
                return await create_key(db, tenant, scopes or [s.value for s in DEFAULT_SCOPES])
        finally:
            await context.aclose()

    key, key_id = asyncio.run(_create())
    print(json.dumps({"key": key, "key_id": key_id, "tenant": tenant}))
    print("store this key now: it is not shown again", file=sys.stderr)


def cmd_reembed(settings: Settings, batch_size: int | None) -> None:
    from app.core.context import AppContext
    from app.offload.reembed import reembed

    async def _run() -> int:
        context = AppContext.create(settings)
        try:
            return await reembed(context, batch_size or settings.embedding.batch_size)
        finally:
            await context.aclose()

    asyncio.run(_run())


def cmd_openapi(check: bool) -> int:
    from app.main import create_app

    spec = json.dumps(create_app(load_settings()).openapi(), indent=2, ensure_ascii=False) + "\n"
    if check:
        same = OPENAPI_PATH.exists() and OPENAPI_PATH.read_text() == spec
        print(
            "openapi.json is up to date" if same else "openapi.json differs: run contextd openapi"
        )
        return 0 if same else 1
    OPENAPI_PATH.parent.mkdir(exist_ok=True)
    OPENAPI_PATH.write_text(spec)
    print(f"wrote {OPENAPI_PATH}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="contextd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", help="embedded Postgres+Valkey, migrations, API and worker")
    dev.add_argument("--port", type=int, help="API port (default CONTEXTD_PORT or 8080)")
    dev.add_argument("--auth", action="store_true", help="keep API-key auth on")
    serve = sub.add_parser("serve", help="serve the API (DATABASE_URL, REDIS_URL)")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="API processes sharing the port (default 1; see README, Scaling out)",
    )
    sub.add_parser("worker", help="run a job worker (DATABASE_URL, REDIS_URL)")
    sub.add_parser("migrate", help="apply database migrations")
    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key and print it once")
    create.add_argument("--tenant", required=True)
    create.add_argument("--scope", action="append", default=[], help="repeatable")
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
    if args.command == "dev":
        cmd_dev(args)
        return 0
    if args.command == "openapi":
        return cmd_openapi(args.check)
    if args.command == "eval":
        from app.eval import run as run_eval

        return run_eval(args)
    if args.command == "config":
        from app.core.config import settings_table

        print(settings_table())
        return 0
    settings = load_settings()
    _configure_logging(settings)
    if args.command == "migrate":
        cmd_migrate(settings)
    elif args.command == "serve":
        cmd_serve(settings, args.workers)
    elif args.command == "worker":
        asyncio.run(_serve(settings, with_worker=True, with_api=False))
    elif args.command == "keys":
        cmd_keys_create(settings, args.tenant, args.scope)
    elif args.command == "reembed":
        cmd_reembed(settings, args.batch_size)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
