"""A streaming replica of the test session's embedded PostgreSQL, on loopback.

pgserver ships the server's binaries: `pg_basebackup -R` copies the primary's data directory
over its Unix socket and writes the standby's `primary_conninfo`, and a second postmaster
serves the copy on a loopback TCP port, replaying the WAL it streams from the primary. Both
run as the user that owns the primary's directory (pgserver's own user when the tests run as
root: PostgreSQL refuses to run as root).
"""

import os
import pwd
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from pgserver._commands import POSTGRES_BIN_PATH

from app.runtime.embedded import DATABASE_NAME
from tests.support.server import free_port

START_SECONDS = 60


class StreamingReplica:
    """A hot standby of the primary at `primary_url` (a pgserver URL: its Unix socket in
    `host=`), its data in `root`; `start` it, `stop` it, `start` it again."""

    def __init__(self, primary_url: str, primary_data: Path, root: Path) -> None:
        self.socket_dir = parse_qs(urlsplit(primary_url).query)["host"][0]
        owner = primary_data.stat()
        self.owner = pwd.getpwuid(owner.st_uid).pw_name
        self.data_dir = root / "replica"
        self.log = self.data_dir / "server.log"  # where its user may write
        self.port = free_port()
        root.chmod(0o755)  # the server's user reaches its directory
        self.data_dir.mkdir(mode=0o700)
        os.chown(self.data_dir, owner.st_uid, owner.st_gid)
        # Nothing synced to disk (a copy for a test, not kept across a machine crash): 1.6 s
        # instead of 6.5 s, and the standby starts in 0.2 s instead of 4 s (fsync=off below).
        copy = ["-R", "-X", "stream", "-c", "fast", "--no-sync"]
        self._run("pg_basebackup", "-D", str(self.data_dir), *copy)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE_NAME}"

    def start(self) -> None:
        """Serve on loopback only, with a small buffer cache (the primary's, copied in its
        `postgresql.auto.conf`, is sized for the machine) and no fsync."""
        options = (
            f"-h 127.0.0.1 -p {self.port} -k {self.data_dir} -c shared_buffers=16MB -c fsync=off"
        )
        self._ctl("-w", "-t", str(START_SECONDS), "-o", options, "-l", str(self.log), "start")

    def stop(self) -> None:
        self._ctl("-w", "-m", "fast", "stop")

    def _ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), *args, connect=False)

    def _run(self, program: str, *args: str, connect: bool = True) -> None:
        where = ["-h", self.socket_dir, "-U", "postgres"] if connect else []
        own = self.owner if os.geteuid() == 0 else None
        # Output to a file, not a pipe: a pipe the postmaster kept open would hold `run` (pgserver
        # saw pg_ctl hang so).
        with tempfile.TemporaryFile("w+") as output:
            done = subprocess.run(
                [str(POSTGRES_BIN_PATH / program), *args, *where],
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=START_SECONDS * 2,
                user=own,
            )
            output.seek(0)
            if done.returncode != 0:
                raise RuntimeError(f"{program} failed ({done.returncode}): {output.read()}")
