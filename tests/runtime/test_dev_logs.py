"""`contextd dev` talks to a person at a terminal: one short readable line per request or job
(time, what, session, how long), without the job queue's and the migrations' chatter; `serve`,
`worker` and every other command keep one JSON object per line for a log collector."""

import logging
import re
from pathlib import Path

import httpx

from app.core.observability import DevFormatter, JsonFormatter, log_handler, quiet_for_dev
from tests.support.dev import dev_server
from tests.support.server import free_port
from tests.support.waiting import wait_for

DEV_LINE = re.compile(r"^\d\d:\d\d:\d\d \S")


def record(name: str, level: int, message: str, **extra: object) -> logging.LogRecord:
    out = logging.LogRecord(name, level, __file__, 1, message, None, None)
    out.__dict__.update(extra)
    return out


def test_dev_lines_are_short_and_say_what_a_person_reads() -> None:
    formatter = DevFormatter()
    build = record(
        "contextd.prompt",
        logging.INFO,
        "build_prompt",
        session="demo",
        timings_ms={"total": 41.6, "recall": 30.0},
        fallbacks=["vector_unavailable"],
        tokens_total=1804,
        recall_ids=["c1", "c2"],
        query_raw_sha256="0123456789abcdef",
    )
    line = formatter.format(build)
    assert DEV_LINE.match(line)
    assert line[9:] == "build_prompt session=demo 1804 tokens 42 ms fallbacks=vector_unavailable"
    access = record("contextd.access", logging.INFO, "POST /v1/sessions/{session_id}/turns 201")
    access.duration_ms = 12.4
    assert formatter.format(access)[9:] == "POST /v1/sessions/{session_id}/turns 201 12 ms"
    warning = record("procrastinate.worker", logging.WARNING, "job failed")
    assert formatter.format(warning)[9:] == "WARNING job failed"


def test_dev_leaves_out_library_chatter_but_never_a_warning() -> None:
    assert quiet_for_dev(record("contextd.offload", logging.INFO, "offloaded 12 turns"))
    assert not quiet_for_dev(record("procrastinate.worker", logging.INFO, "Starting job"))
    assert not quiet_for_dev(record("alembic.runtime.migration", logging.INFO, "Running upgrade"))
    assert quiet_for_dev(record("procrastinate.worker", logging.WARNING, "job retried"))


def test_auto_is_json_for_every_command_but_dev() -> None:
    assert isinstance(log_handler("auto").formatter, JsonFormatter)
    assert isinstance(log_handler("json", dev=True).formatter, JsonFormatter)
    assert isinstance(log_handler("auto", dev=True).formatter, DevFormatter)
    text = log_handler("text", dev=True).formatter
    assert text is not None and not isinstance(text, DevFormatter | JsonFormatter)


async def test_contextd_dev_logs_readable_lines_by_default(tmp_path: Path) -> None:
    with dev_server(tmp_path, free_port(), quiet=False) as dev:
        async with httpx.AsyncClient(base_url=dev.url, timeout=30) as http:
            resp = await http.post(
                "/v1/sessions/logs/turns",
                json={"turns": [{"role": "user", "content": "Réserve le Musée, s'il te plaît."}]},
            )
            assert resp.status_code == 201

            async def access_line() -> list[str]:
                return [line for line in dev.lines if "/turns 201" in line]

            lines = await wait_for(access_line, bool, timeout=30, what="the append's log line")
        assert re.fullmatch(r"\d\d:\d\d:\d\d POST /v1/sessions/\{session_id\}/turns 201 \d+ ms\n",
                            lines[0])  # fmt: skip
        logged = [line for line in dev.lines if DEV_LINE.match(line)]
        assert logged and not [line for line in dev.lines if line.startswith("{")]
        assert not [line for line in dev.lines if "procrastinate" in line or "alembic" in line]
        assert max(len(line) for line in logged) < 160
