"""The embedded stack stops the PostgreSQL it ran, also after a restart (real pgserver)."""

import tempfile
from pathlib import Path

import psycopg

from app.embedded import EmbeddedStack


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
