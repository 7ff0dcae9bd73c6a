"""The embedded stack stops the PostgreSQL it ran, also after a restart (real pgserver)."""

import tempfile
from pathlib import Path

import psycopg

from app.runtime.embedded import EmbeddedStack, machine_memory, shared_buffers_mb


def postmasters_of(pg_dir: Path) -> list[int]:
    """Processes running PostgreSQL on `pg_dir` (`postgres -D <dir>`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"-D" in words and words[words.index(b"-D") + 1 :][:1] == [str(pg_dir).encode()]:
                found.append(int(entry.name))
    return found


def test_a_restarted_postgres_is_the_one_stopped_with_the_stack() -> None:
    with tempfile.TemporaryDirectory(prefix="contextd-stack-") as tmp:
        stack = EmbeddedStack(Path(tmp), persist=False).start_postgres()
        pg_dir = (Path(tmp) / "pg").resolve()
        before = postmasters_of(pg_dir)
        assert len(before) == 1
        stack.restart_postgres()
        after = postmasters_of(pg_dir)
        assert len(after) == 1 and after != before  # a new postmaster
        # pgserver stops the postmaster it knows of, and only while that process exists: it
        # must know the new one (the old one may be reaped by then, as it was in CI)
        assert stack._pg._postmaster_info.process.pid == after[0]
        with psycopg.connect(stack.database_url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        stack.stop()
        assert postmasters_of(pg_dir) == []


def shared_buffers(stack: EmbeddedStack) -> int:
    """The server's `shared_buffers`, MB."""
    with psycopg.connect(stack.database_url) as conn:
        row = conn.execute(
            "SELECT setting::bigint * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_buffer_cache_is_an_eighth_of_the_memory_within_bounds() -> None:
    gib = 2**30
    assert shared_buffers_mb(512 * 2**20) == 128  # initdb's size at least
    assert shared_buffers_mb(4 * gib) == 512
    assert shared_buffers_mb(6 * gib + 5) == 768
    assert shared_buffers_mb(64 * gib) == 1024  # at most 1 GB


def test_a_started_server_gets_its_buffer_cache_once_and_a_size_set_by_hand_stays() -> None:
    with tempfile.TemporaryDirectory(prefix="contextd-stack-") as tmp:
        stack = EmbeddedStack(Path(tmp), persist=True).start_postgres()
        try:
            sized = shared_buffers(stack)
            assert sized == shared_buffers_mb(machine_memory())
            with psycopg.connect(stack.database_url, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET shared_buffers = '136MB'")
            pids = postmasters_of((Path(tmp) / "pg").resolve())
            # attaching to a running server does not restart it (others may be using it)
            EmbeddedStack(Path(tmp), persist=True).start_postgres()
            assert postmasters_of((Path(tmp) / "pg").resolve()) == pids
            assert shared_buffers(stack) == sized
        finally:
            stack.stop()
        again = EmbeddedStack(Path(tmp), persist=True).start_postgres()
        try:
            assert shared_buffers(again) == 136  # set by hand: kept
        finally:
            again.stop()
