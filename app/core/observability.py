"""Prometheus metrics, request ids and JSON logs.

`Metrics` owns its own `CollectorRegistry` (one per `AppContext`, never the process-global one), so
several application instances can live in one process. Code that did work reports it through the
`observe_*` methods; nothing here reaches into a domain.

The job-queue gauges need a database query. A Prometheus collector runs synchronously inside
`generate_latest`, so it cannot await one; instead `GET /metrics` awaits `refresh_queue` (one cheap
aggregate over `procrastinate_jobs`/`procrastinate_events`, bounded by a timeout) and the collector
only reads that snapshot. Every scrape is fresh, no background task has to be started or stopped,
and an API with no scraper issues no queries.
"""

import asyncio
import contextvars
import hashlib
import json
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import text
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.config import MULTIPROCESS_DIR_ENV
from app.core.errors import InternalError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

logger = logging.getLogger("contextd.metrics")
access_logger = logging.getLogger("contextd.access")
errors_logger = logging.getLogger("contextd.errors")

REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._-]{1,128}")
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "contextd_request_id", default=None
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (0, 64, 256, 1_024, 4_096, 16_384, 65_536, 262_144, 1_048_576)
QUEUE_QUERY_TIMEOUT_SECONDS = 2.0
DEFAULT_JOB_QUEUE = "contextd"  # app.jobs.queue.DEFAULT_QUEUE; not imported to keep core light

# Pending jobs per queue and the age of the oldest one (same definition as /readyz's worker lag).
_QUEUE_STATS = text(
    "SELECT j.queue_name, count(*), coalesce(extract(epoch FROM now() - min(e.at)), 0) "
    "FROM procrastinate_jobs j JOIN procrastinate_events e "
    "ON e.job_id = j.id AND e.type = 'deferred' WHERE j.status = 'todo' GROUP BY j.queue_name"
)


class _QueueCollector(Collector):
    """Reads the snapshot `Metrics.refresh_queue` took; never touches the database itself."""

    def __init__(self) -> None:
        self.snapshot: dict[str, tuple[int, float]] = {}

    def collect(self) -> Iterable[Metric]:
        depth = GaugeMetricFamily(
            "contextd_job_queue_depth", "jobs waiting to run (status todo)", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "contextd_job_queue_oldest_age_seconds",
            "age of the oldest waiting job, seconds (0 when none wait)",
            labels=["queue"],
        )
        for queue, (count, age) in sorted(self.snapshot.items()):
            depth.add_metric([queue], count)
            oldest.add_metric([queue], age)
        return [depth, oldest]


class _EveryProcess(Collector):
    """Every process's series (prometheus_client's multiprocess files) and the job queue; a
    family no process has observed yet is listed as one process lists it (help and type, no
    samples), so a scrape shows the same families with one process or several."""

    def __init__(self, own: CollectorRegistry, queue: _QueueCollector) -> None:
        self._own = own
        self._queue = queue

    def collect(self) -> Iterable[Metric]:
        files = MultiProcessCollector(None)  # type: ignore[no-untyped-call]
        found = [*files.collect(), *self._queue.collect()]  # type: ignore[no-untyped-call]
        named = {family.name for family in found}
        return found + [f for f in self._own.collect() if not f.samples and f.name not in named]


class Metrics:
    """The service's Prometheus series, in a registry of its own. See the module docstring."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_request_duration = Histogram(
            "contextd_http_request_duration_seconds",
            "HTTP request latency by route template, method and status",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.build_stage = Histogram(
            "contextd_build_prompt_stage_seconds",
            "build-prompt latency per stage",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Histogram(
            "contextd_prompt_tokens",
            "tokens per prompt layer in a built prompt",
            ["layer"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.recall = Counter(
            "contextd_recall",
            "builds whose recall found something (hit) or nothing (miss)",
            ["outcome"],
            registry=r,
        )
        self.fallbacks = Counter(
            "contextd_fallbacks", "degraded paths taken, by kind", ["kind"], registry=r
        )
        self.offloads = Counter(
            "contextd_offloads", "offloads committed, by trigger", ["trigger"], registry=r
        )
        self.offload_tokens_freed = Counter(
            "contextd_offload_tokens_freed", "window tokens moved out by offloads", registry=r
        )
        self.notes_writes = Counter("contextd_notes_writes", "notes versions written", registry=r)
        self.notes_stale_writes = Counter(
            "contextd_notes_stale_writes",
            "notes results discarded because a newer version was written first",
            registry=r,
        )
        self.db_reads = Counter(
            "contextd_db_reads",
            "read-only requests, by the server they read from (replica, primary)",
            ["server"],
            registry=r,
        )
        self.embed_seconds = Histogram(
            "contextd_embed_seconds",
            "embedder call latency (one batch), by input kind",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # Labelled children by (metric, label values): `labels()` validates and locks on every
        # call, a dozen times per build. The label values are few (routes, stages, layers, kinds).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._queue = _QueueCollector()
        r.register(self._queue)
        # Series that should read 0 rather than be absent before the first event.
        for outcome in ("hit", "miss"):
            self.recall.labels(outcome=outcome)
        for kind in ("query", "passage"):
            self.embed_seconds.labels(kind=kind)
        for server in ("replica", "primary"):
            self.db_reads.labels(server=server)

    def _child(self, metric: Histogram | Counter, *values: str) -> Any:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    # --- reporting, called by the code that did the work ------------------------------------

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self._child(self.http_request_duration, route, method, str(status)).observe(seconds)

    def observe_build(
        self,
        stage_timings_ms: Mapping[str, float],
        usage: Mapping[str, int],
        fallbacks: Iterable[str],
        recall_hit: bool | None,
    ) -> None:
        """One build-prompt: stage latencies in ms (e.g. `{"recall": 12.5, "rerank": 3.1}`),
        tokens per layer (e.g. `{"c0": .., "c1": .., "c2": .., "recall": ..}`; non-int values such
        as a nested dict are skipped), the fallback kinds taken, and whether recall returned
        anything (None: recall was skipped, counted as neither)."""
        for stage, ms in stage_timings_ms.items():
            self._child(self.build_stage, stage).observe(max(ms, 0.0) / 1000)
        for layer, tokens in usage.items():
            if isinstance(tokens, int | float) and not isinstance(tokens, bool):
                self._child(self.prompt_tokens, layer).observe(tokens)
        for kind in fallbacks:
            self._child(self.fallbacks, kind).inc()
        if recall_hit is not None:
            self._child(self.recall, "hit" if recall_hit else "miss").inc()

    def observe_fallback(self, kind: str) -> None:
        self.fallbacks.labels(kind=kind).inc()

    def observe_offload(self, trigger: str, tokens_freed: int) -> None:
        """One committed offload (`trigger`: watermark, sweeper, emergency, manual, ...)."""
        self.offloads.labels(trigger=trigger).inc()
        self.offload_tokens_freed.inc(max(tokens_freed, 0))

    def observe_notes_write(self, outcome: str) -> None:
        """`outcome` of a notes refresh: "written", "stale" (lost the version race), other
        outcomes ("failed", "gone") are not counted here."""
        if outcome == "written":
            self.notes_writes.inc()
        elif outcome == "stale":
            self.notes_stale_writes.inc()

    def observe_db_read(self, server: str) -> None:
        """A read-only request's transaction, on the "replica" or the "primary"."""
        self._child(self.db_reads, server).inc()

    def observe_embed(self, kind: str, seconds: float) -> None:
        """The `Embedder.observer` callback: `kind` is "query" or "passage"."""
        self.embed_seconds.labels(kind=kind).observe(seconds)

    # --- exposition ---------------------------------------------------------------------------

    async def refresh_queue(self, engine: "AsyncEngine") -> None:
        """Take the job-queue snapshot the gauges expose. On a database error or timeout the
        gauges are left out of this scrape (absent, not a misleading 0)."""
        try:
            async with asyncio.timeout(QUEUE_QUERY_TIMEOUT_SECONDS):
                async with engine.connect() as conn:
                    rows = (await conn.execute(_QUEUE_STATS)).all()
        except Exception as exc:  # a scrape must answer even when Postgres does not
            logger.warning("job queue metrics unavailable: %s", type(exc).__name__)
            self._queue.snapshot = {}
            return
        snapshot = {DEFAULT_JOB_QUEUE: (0, 0.0)}
        snapshot.update({str(q): (int(n), float(age)) for q, n, age in rows})
        self._queue.snapshot = snapshot

    def render(self) -> bytes:
        """This registry's series; under `serve --workers N` and `dev` (prometheus_client's
        multiprocess mode, `PROMETHEUS_MULTIPROC_DIR`) those of every process, summed."""
        if not os.environ.get(MULTIPROCESS_DIR_ENV):
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        combined.register(_EveryProcess(self.registry, self._queue))
        return generate_latest(combined)


# --- request ids and the access log ---------------------------------------------------------


_LOGGED_BY_ROUTE = "contextd_logged_by_route"


def logged_by_route(scope: Scope) -> None:
    """The route wrote its own line for this request (with the tenant, the request id and its
    duration): a successful answer gets no access line as well (one line per build-prompt)."""
    scope.setdefault("state", {})[_LOGGED_BY_ROUTE] = True


_after_response: contextvars.ContextVar[list[Callable[[], None]] | None] = contextvars.ContextVar(
    "contextd_after_response", default=None
)


def after_response(action: Callable[[], None]) -> None:
    """`action` (a log line, metrics: nothing the answer depends on) once the response is sent,
    in a request served inside `deferred_until_sent`; at once anywhere else."""
    pending = _after_response.get()
    if pending is None:
        action()
    else:
        pending.append(action)


@contextmanager
def deferred_until_sent() -> Iterator[None]:
    """The actions given to `after_response` inside the block run when it ends, after the
    response sent in it (a complete response leaves from its last send, `OneSendTransport`):
    the client does not wait for them."""
    pending: list[Callable[[], None]] = []
    token = _after_response.set(pending)
    try:
        yield
    finally:
        _after_response.reset(token)
        for action in pending:
            action()


def accept_request_id(value: str | None) -> str:
    """The caller's id when it is sane (≤ 128 chars of [A-Za-z0-9._-]), else a new uuid4 hex."""
    if value and _REQUEST_ID_OK.fullmatch(value):
        return value
    return uuid.uuid4().hex


# The status logged and counted for a request whose client closed the connection before sending
# all of its body (no response is sent).
CLIENT_CLOSED_REQUEST = 499


class RequestContextMiddleware:
    """Pure ASGI: request id in (X-Request-ID) and out, bound to `request_id_var` for the logs;
    latency histogram by route template; one access log line per request; a JSON 500 for an
    exception no handler took (Starlette's last-resort handler answers too, but then re-raises
    to the server, which drops the connection: the client's next request on it would fail).

    The tenant comes from `request.state.tenant`, which the auth dependency sets."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                header = value.decode("latin-1")
                break
        rid = accept_request_id(header)
        token = request_id_var.set(rid)
        started = time.perf_counter()
        status = 500
        responded = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, responded
            if message["type"] == "http.response.start":
                status, responded = message["status"], True
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            # The client left before its body arrived: nobody to answer, nothing went wrong
            # here. Counted and logged as 499 (nginx's "client closed request").
            status = CLIENT_CLOSED_REQUEST
        except Exception as exc:
            errors_logger.exception("unhandled error", exc_info=exc)
            if responded:
                raise  # half a response is out: only closing the connection can end it
            await InternalError("internal error").response()(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope.get("method", "")
            state = scope.get("state") or {}
            context = getattr(getattr(scope.get("app"), "state", None), "context", None)
            if context is not None:
                context.metrics.observe_request(route, method, status, seconds)
            if status >= 400 or not state.get(_LOGGED_BY_ROUTE):
                access_logger.info(
                    "%s %s %d",
                    method,
                    route,
                    status,
                    extra={
                        "method": method,
                        "route": route,
                        "status": status,
                        "duration_ms": round(seconds * 1000, 3),
                        "tenant": state.get("tenant"),
                    },
                )
            request_id_var.reset(token)


# --- JSON logs ---------------------------------------------------------------------------------


def text_fields(name: str, value: str | None, *, with_text: bool) -> dict[str, Any]:
    """Log fields describing conversation text: its length and a short SHA-256 (enough to match
    two lines or a known text), and the text itself only when `with_text` (CONTEXTD_LOG_TEXT)."""
    if value is None:
        return {}
    fields: dict[str, Any] = {
        f"{name}_chars": len(value),
        f"{name}_sha256": hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:16],
    }
    if with_text:
        fields[name] = value
    return fields


_RECORD_FIELDS = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, request_id, then any `extra=` fields
    (tenant, session, route, status, duration_ms, ...), then `exc` for a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or request_id_var.get(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and key not in out and value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class DevFormatter(logging.Formatter):
    """`contextd dev`'s lines, for a person at a terminal: the time, the message and the few
    fields one reads (session, how long, what degraded); `serve` keeps every field as JSON."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        line = f"{when} {level}{record.getMessage()}"
        session = getattr(record, "session", None)
        if session is not None:
            line += f" session={session}"
        tokens = getattr(record, "tokens_total", None)
        if isinstance(tokens, int):
            line += f" {tokens} tokens"
        total = (getattr(record, "timings_ms", None) or {}).get("total")
        duration = getattr(record, "duration_ms", None) if total is None else total
        if isinstance(duration, int | float):
            line += f" {duration:.0f} ms"
        fallbacks = getattr(record, "fallbacks", None)
        if fallbacks:
            line += " fallbacks=" + ",".join(fallbacks)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def quiet_for_dev(record: logging.LogRecord) -> bool:
    """Under `contextd dev`: contextd's own lines, and every library's warnings and errors (not
    the migrations' and the job queue's start-up and per-job chatter)."""
    return record.levelno >= logging.WARNING or record.name.startswith("contextd")


def log_handler(
    log_format: str, *, dev: bool = False, stream: TextIO | None = None
) -> logging.Handler:
    """A handler writing to `stream`, stdout unless given (what container runtimes collect):
    JSON, plain text, or with `auto` the short readable lines under `contextd dev` (`dev`) and
    JSON under every other command."""
    handler = logging.StreamHandler(sys.stdout if stream is None else stream)
    if log_format == "text":
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    elif log_format == "auto" and dev:
        handler.setFormatter(DevFormatter())
        handler.addFilter(quiet_for_dev)
    else:
        handler.setFormatter(JsonFormatter())
    return handler
