"""contextd against the performance floor of this machine, measured side by side.

    .venv/bin/python -m benchmarks.floor_compare [--floor-dir ../shared/perf] [--rounds 3]
        [--requests 480] [--serve-args "--workers 2"] [--clients 1,2,4,8,16]

The floor (`floor_bench.py` + `floor_app.py` in `--floor-dir`, not part of this repository) is the
least work any build-prompt must do here: one Redis read, one indexed read of the recent turns,
tokenising the query; with recall also one e5 query embedding, a pgvector top-30 and a full-text
top-30. This command runs it as it is, and drives a `contextd dev` (the API, its worker in a
child process, default settings, its own embedded Postgres and Valkey) with the floor's own load
function and query generator, imported from `floor_bench.py`: the same httpx client, the same
distinct queries, the same concurrency (1 and 16 clients) and number of requests.

`--clients 1,2,4,8,16` measures both sides at every one of those concurrencies (the floor's own 1
and 16 are always among them): the floor then runs in a process that imports `floor_bench.py`
and runs its `main` as it is (its data, indexes, server and warm-up), with its `load` wrapped so
that, called at 16 clients, it also measures the other concurrencies with the floor's own `load`
(`sweep_floor`); contextd is measured at each of them in turn. Every concurrency is one more row
of the printed tables and of the JSON (`rounds`, `summary`, `cpu_ms_per_request`).

contextd holds what the floor holds: 200 sessions of 50 turns (no recall: never offloaded, so no
search runs) and one session of 5,000 turns offloaded into chunks and embedded with e5 (recall);
the floor gets as many chunks as contextd wrote. Each round runs both, alternating which goes
first; the query-embedding cache is emptied before each contextd round (the floor has none), so
every query is embedded. Prints each round, then per figure the median over rounds and the ratio
contextd / floor (median and range), and the load average of the machine.

Both sides also get their CPU time per request, per process, from /proc: the server (contextd's
one `dev` process; the floor's uvicorn), its PostgreSQL (every backend, plus those that exited,
through the postmaster's reaped-children time), its Valkey and the client driving it. The floor's
phases are known from its printed lines (a phase ends when its line appears and began requests /
req/s before), sampled every 50 ms. `--scenarios "no recall"` skips the 5,000-turn session and
the after-append rounds, and stops the floor once its no-recall figures are in.

The host's speed moves under both: a fixed piece of pure-Python work (`MachineSpeed`, sampled
every 50 ms in a process of its own all along the run) takes either ~1x or ~1.9x its fastest CPU
time, for seconds at a time, whatever this machine's own load (a busy loop on the other core does
not move it). A 1-client phase lasts 0.5-2 s, so the floor's and contextd's can fall in different
states: each phase's median factor is printed ("machine x1.00 | x1.90"), and the 1-client p50
ratio divided by contextd's factor over the floor's ("at equal speed"), an estimate of the ratio
had both run at one speed (at 1 client a build's latency is the CPU of its chain).

Then, `--append-rounds` times (default 3), builds right after an append (`--append-tries`
builds, default 20): the p95 of recall builds on a quiet server, then the p95 of builds each sent
right after a 100-turn append to the same session (the appends cross its watermark, so offload
jobs run and their chunks are embedded by the worker while the builds are served), and their ratio.
"""

import argparse
import asyncio
import importlib.util
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg
import redis

from app.embeddings import engine_process
from app.runtime.embedded import EmbeddedStack
from benchmarks.build_prompt_latency import ingest, percentile, turn_text, wait_offloaded

SCENARIOS = ("no recall", "recall")
CLIENTS = (1, 16)  # the concurrencies `floor_bench.py` itself measures
FLOOR_LINE = re.compile(
    r"floor (no recall|recall)\s+clients=\s*(\d+)\s+p50\s+([\d.]+) ms\s+p95\s+([\d.]+) ms\s+"
    r"([\d.]+) req/s"
)
FALLBACKS = re.compile(rb'"fallbacks":(\[[^\]]*\])')
SMALL_SESSIONS = 200
SMALL_TURNS = 50
BIG_SESSION = "floor-recall"
BIG_CONFIG = {"context_limit": 16000, "reserve_tokens": 2000, "min_recent_tokens": 2000}
APPEND_TURNS = 100

Figures = dict[tuple[str, int], tuple[float, float, float]]  # (scenario, clients) -> p50, p95, rps
Windows = dict[tuple[str, int], tuple[float, float]]  # (scenario, clients) -> monotonic start, end
Speeds = dict[tuple[str, int], float]  # (scenario, clients) -> the machine's factor (1: fastest)
PartsCpu = dict[str, float]  # part (server, worker, postgres, valkey, client) -> CPU ms per request
CpuPerRequest = dict[tuple[str, int], PartsCpu]  # (scenario, clients) -> CPU of each part


# What an e5 engine process runs (`python -m <module>`): its CPU counts as its parent's.
ENGINE_MODULE = engine_process.__name__


def cpu_seconds(pid: int, reaped: bool = False) -> float:
    """User + system CPU time of process `pid` so far, all its threads (Linux /proc), with
    `reaped` also that of its children that exited and were waited for; 0 for a process that
    is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    used = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return used / os.sysconf("SC_CLK_TCK")


def _processes() -> Iterator[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process still there."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        yield int(entry.name), parent, command


def _after(flag: str, command: str) -> str | None:
    """The word after `flag` in a command line."""
    words = command.split()
    return words[words.index(flag) + 1] if flag in words[:-1] else None


@dataclass(frozen=True)
class Stack:
    """What serves one side: the server process, the PostgreSQL and Valkey it talks to, the
    client process driving it (found from their URLs: the postmaster listens on the socket
    directory of the database URL, Valkey on the port of the Redis URL)."""

    server: int
    database_url: str
    redis_url: str
    client: int

    def parts(self) -> dict[str, list[int]]:
        """The processes of each part: server (with its e5 engine processes), worker (the
        server's spawned children: the worker process of `contextd dev`, with its engine
        processes), postgres (every backend, and the postmaster with the time of the backends
        that exited, written as its negated pid), valkey, client."""
        socket_dir = parse_qs(urlsplit(self.database_url).query).get("host", [""])[0]
        valkey = f"127.0.0.1:{urlsplit(self.redis_url).port}"
        table = list(_processes())
        postmasters = {
            pid for pid, _, command in table if socket_dir and _after("-k", command) == socket_dir
        }
        engines = [(p, parent) for p, parent, command in table if ENGINE_MODULE in command]
        workers = [
            p for p, parent, command in table if parent == self.server and "spawn_main" in command
        ]
        return {
            "server": [self.server] + [p for p, parent in engines if parent == self.server],
            "worker": workers + [p for p, parent in engines if parent in workers],
            "postgres": [-p for p in postmasters]
            + [p for p, parent, _ in table if parent in postmasters],
            "valkey": [
                p
                for p, _, command in table
                if "valkey-server" in command and valkey in command.split()
            ],
            "client": [self.client],
        }

    def cpu(self, parts: dict[str, list[int]] | None = None) -> dict[str, float]:
        """CPU seconds so far per part."""
        found = self.parts() if parts is None else parts
        return {
            part: sum(cpu_seconds(abs(pid), reaped=pid < 0) for pid in pids)
            for part, pids in found.items()
        }


def per_request(before: dict[str, float], after: dict[str, float], requests: int) -> PartsCpu:
    return {part: (after[part] - before[part]) * 1000 / requests for part in after}


def sweep_clients(text: str) -> tuple[int, ...]:
    """`--clients`: the concurrencies to measure, ascending, with the floor's own (1 and 16)."""
    try:
        asked = {int(word) for word in text.split(",") if word.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None
    if any(n < 1 for n in asked):
        raise argparse.ArgumentTypeError(f"concurrencies are 1 or more: {text!r}")
    return tuple(sorted(asked | set(CLIENTS)))


def floor_line(name: str, clients: int, figures: tuple[float, float, float]) -> str:
    """A figure printed as `floor_bench.py` prints its own (what `FLOOR_LINE` reads)."""
    p50, p95, rps = figures
    return (
        f"floor {name:9s} clients={clients:2d}  p50 {p50:6.2f} ms  p95 {p95:6.2f} ms  "
        f"{rps:6.0f} req/s"
    )


def sweep_schedule(clients: tuple[int, ...], called_at: int) -> tuple[int, ...]:
    """The concurrencies to measure, in order, when `floor_bench.py` calls its `load` at
    `called_at` clients: at its last own concurrency (16) every other one of `clients` that it
    does not measure itself, those below first, so that the sweep runs in ascending order; at
    any other call (its warm-up, its 1 client) just what it asked for."""
    if called_at != CLIENTS[-1]:
        return (called_at,)
    extra = [n for n in clients if n not in CLIENTS]
    return (*[n for n in extra if n < called_at], called_at, *[n for n in extra if n > called_at])


def sweep_floor() -> None:
    """The floor at every concurrency of a sweep, run as `run_floor` starts it (argv: the floor
    directory, the concurrencies, then `floor_bench.py`'s own arguments). Its `main` runs as it
    is, with its module's `load` wrapped: each concurrency measured is printed at once in the
    floor's own format (so `run_floor` knows when each phase ended); the floor prints its 1 and
    16 again afterwards, and `run_floor` keeps the first of each."""
    floor_dir, clients = Path(sys.argv[1]), sweep_clients(sys.argv[2])
    bench = floor_module(floor_dir)
    measure = bench.load

    async def load(
        client: Any, path_of: Callable[[int], str], conc: int, n: int
    ) -> tuple[float, float, float]:
        # The floor's paths name its scenario: /floor/{sid} and /floor_recall/{sid}.
        name = "recall" if path_of(0).startswith("/floor_recall/") else "no recall"
        asked: tuple[float, float, float] | None = None
        for clients_now in sweep_schedule(clients, conc):
            figures = await measure(client, path_of, clients_now, n)
            if conc in CLIENTS:  # not the warm-up
                print(floor_line(name, clients_now, figures), flush=True)
            if clients_now == conc:
                asked = figures
        assert asked is not None
        return asked

    bench.load = load
    sys.argv = [str(floor_dir / "floor_bench.py"), *sys.argv[3:]]
    bench.main()


def floor_module(floor_dir: Path) -> ModuleType:
    """`floor_bench.py`, imported from where it lives (it is run, never copied)."""
    spec = importlib.util.spec_from_file_location("floor_bench", floor_dir / "floor_bench.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"no floor_bench.py in {floor_dir} (see --floor-dir)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _floor_stack(bench: int) -> Stack | None:
    """The floor's side, once its server is up: `floor_app` under uvicorn, a child of
    `floor_bench.py`, whose environment names its PostgreSQL and Valkey."""
    for pid, parent, command in _processes():
        if parent == bench and "floor_app" in command:
            try:
                raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                return None
            env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
            if "PG" in env and "RURL" in env:
                return Stack(pid, env["PG"], env["RURL"], bench)
    return None


class CpuSeries:
    """The floor's CPU per part every `every` seconds, on a thread (the floor runs as it is, so
    its phases are known only from its printed lines: a phase ends when its line appears and
    began requests / req/s before). Reads only the /proc files of the parts' processes (found
    again once a second), so the sampling costs little of what it measures."""

    def __init__(self, bench: int, every: float = 0.05) -> None:
        self.bench, self.every = bench, every
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        stack: Stack | None = None
        parts: dict[str, list[int]] = {}
        found_at = 0.0
        while not self.done.wait(self.every):
            now = time.monotonic()
            if stack is None:
                stack = _floor_stack(self.bench)
            if stack is not None and now - found_at >= 1.0:
                parts, found_at = stack.parts(), now
            if parts:
                self.samples.append((now, stack.cpu(parts) if stack else {}))

    def at(self, moment: float) -> dict[str, float]:
        """CPU seconds per part at `moment`, linear between the two samples around it."""
        earlier = [s for s in self.samples if s[0] <= moment] or self.samples[:1]
        later = [s for s in self.samples if s[0] >= moment] or self.samples[-1:]
        (t0, a), (t1, b) = earlier[-1], later[0]
        w = 0.0 if t1 == t0 else (moment - t0) / (t1 - t0)
        return {part: a[part] + w * (b.get(part, a[part]) - a[part]) for part in a}

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


# A fixed piece of pure-Python work timed in CPU time every 50 ms (~0.5 ms of CPU at full speed:
# ~1 % of a core), each sample printed as "monotonic-time cpu-ms".
SPEED_PROBE = """
import time
def work():
    total = 0
    for i in range(10_000):
        total += i * i
    return total
while True:
    used = time.process_time()
    work()
    used = time.process_time() - used
    print(f"{time.monotonic():.4f} {used * 1000:.4f}", flush=True)
    time.sleep(0.05)
"""


class MachineSpeed:
    """How slow the host runs this machine's CPUs, sampled all along a run (see the module
    docstring): `factor` over a time window is the median CPU time of the probe's work in it
    over the fastest the run has seen (its 5th percentile)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.probe = subprocess.Popen(
            [sys.executable, "-c", SPEED_PROBE], stdout=subprocess.PIPE, text=True
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.probe.stdout is not None
        for line in self.probe.stdout:
            at, ms = line.split()
            self.samples.append((float(at), float(ms)))

    def factor(self, window: tuple[float, float]) -> float:
        within = [ms for at, ms in self.samples if window[0] <= at <= window[1]]
        if not within:  # a window shorter than the probe's period: the sample nearest to it
            within = [min(self.samples, key=lambda s: abs(s[0] - window[1]))[1]]
        fastest = sorted(ms for _, ms in self.samples)[len(self.samples) // 20]
        return statistics.median(within) / fastest

    def stop(self) -> None:
        self.probe.terminate()
        self.probe.wait()
        self.thread.join()


def read_floor_line(
    line: str, scenarios: tuple[str, ...], figures: Figures
) -> tuple[str, int] | None:
    """The (scenario, clients) of a new figure of `scenarios` printed in `line`, kept in
    `figures`; None for any other line, or a figure already read (a sweep prints its 1 and 16
    as soon as they are measured, the floor prints them again after: the first is kept, its
    time is when the phase ended)."""
    match = FLOOR_LINE.search(line)
    if match is None or match.group(1) not in scenarios:
        return None
    key = (match.group(1), int(match.group(2)))
    if key in figures:
        return None
    figures[key] = (float(match.group(3)), float(match.group(4)), float(match.group(5)))
    return key


def floor_command(
    floor_dir: Path, chunks: int, requests: int, clients: tuple[int, ...]
) -> list[str]:
    """`floor_bench.py` as it is for its own concurrencies, else through `sweep_floor`."""
    arguments = ["--chunks", str(chunks), "--requests", str(requests)]
    if clients == CLIENTS:
        return [sys.executable, str(floor_dir / "floor_bench.py"), *arguments]
    root = Path(__file__).resolve().parent.parent
    sweep = (
        f"import sys; sys.path.insert(0, {str(root)!r}); "
        "from benchmarks.floor_compare import sweep_floor; sweep_floor()"
    )
    concurrencies = ",".join(map(str, clients))
    return [sys.executable, "-c", sweep, str(floor_dir.resolve()), concurrencies, *arguments]


def run_floor(
    floor_dir: Path,
    chunks: int,
    requests: int,
    scenarios: tuple[str, ...],
    clients: tuple[int, ...] = CLIENTS,
) -> tuple[Figures, CpuPerRequest, Windows]:
    """One run of the floor as it is; its printed figures, the CPU per request of its parts
    (server, postgres, valkey, client) per phase and when each phase ran. Once the figures of
    `scenarios` are in, the floor is interrupted (SIGINT: it stops its server and stack as it
    does on any error). It runs in a process group of its own, stopped as a whole at the end: a
    server of the floor's that outlives it would hold its output open (and its fixed port)."""
    figures: Figures = {}
    ends: dict[tuple[str, int], float] = {}
    out = []
    with tempfile.TemporaryFile("w+") as errors:
        bench = subprocess.Popen(
            floor_command(floor_dir, chunks, requests, clients),
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),  # each line as it is printed
            # A command started in the background of a shell ignores SIGINT, and so would the
            # floor: give it the default handler (Python's KeyboardInterrupt) back.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            start_new_session=True,
        )
        series = CpuSeries(bench.pid)
        assert bench.stdout is not None
        try:
            for line in bench.stdout:
                out.append(line)
                key = read_floor_line(line, scenarios, figures)
                if key is None:
                    continue
                ends[key] = time.monotonic()
                if len(figures) == len(scenarios) * len(clients):
                    if bench.poll() is None:
                        bench.send_signal(signal.SIGINT)
                    break
        finally:
            series.stop()
            stop_process_group(bench)
        errors.seek(0)
        if len(figures) != len(scenarios) * len(clients):
            raise SystemExit(f"unexpected floor output:\n{''.join(out)}\n{errors.read()}")
    cpu: CpuPerRequest = {}
    windows: Windows = {}
    for key, end in ends.items():
        began = end - requests / figures[key][2]
        cpu[key] = per_request(series.at(began), series.at(end), requests)
        windows[key] = (began, end)
    return figures, cpu, windows


def stop_process_group(leader: subprocess.Popen[str]) -> None:
    """Wait up to a minute for `leader` to end (it cleans up after itself), then end whatever of
    its process group is left: SIGTERM, and SIGKILL to what is still there 10 s later."""
    with suppress(subprocess.TimeoutExpired):
        leader.wait(timeout=60)
    for sent in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(leader.pid, sent)
        except ProcessLookupError:
            break  # nothing left in the group
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            leader.poll()  # reaped, the leader no longer counts as one of the group
            try:
                os.killpg(leader.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
    leader.wait()


class BuildPromptClient:
    """What the floor's `load` calls (`get(path, params={"q": ...})`), answered by contextd's
    build-prompt: a POST with the query in the body. The same httpx client underneath. Counts
    the fallback flags of the answers (a degraded build is cheaper, so it must show)."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.fallbacks: Counter[str] = Counter()

    async def get(self, path: str, params: dict[str, str]) -> httpx.Response:
        response = await self.http.post(path, json={"query": params["q"]})
        if b'"fallbacks":[]' not in response.content:
            flags = FALLBACKS.search(response.content)
            self.fallbacks.update(json.loads(flags.group(1)) if flags else ["(unreadable)"])
        return response


@dataclass(frozen=True)
class DevServer:
    url: str
    redis_url: str
    database_url: str
    pid: int


def wait_healthy(base: str, server: subprocess.Popen[bytes], failure: str) -> None:
    """Until `base` answers its health check; `failure` when the server exits or 300 s pass."""
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(failure)
        time.sleep(0.5)


@contextmanager
def contextd_dev(
    workdir: Path,
    port: int,
    serve_args: list[str],
    redis_port: int | None = None,
    *,
    persist: bool = False,
) -> Iterator[DevServer]:
    """`contextd dev` (default settings but for the inspector's manifests) on an embedded
    stack of its own (Valkey on `redis_port`, else the embedded default). `persist`: the
    stack's data stays in `workdir` when it stops (the next start on it finds them), else it
    is deleted."""
    stack = EmbeddedStack(workdir / "stack", persist=persist).start(redis_port)
    env = dict(
        os.environ,
        DATABASE_URL=stack.database_url,
        REDIS_URL=stack.redis_url,
        CONTEXTD_DATA_DIR=str(workdir / "dev"),
        # `dev` keeps every build's manifest for the inspector; a deployment (`serve`) does not.
        CONTEXTD_RECALL__PERSIST_MANIFESTS="false",
    )
    log = (workdir / "contextd.log").open("w")
    command = [sys.executable, "-m", "app.runtime.cli", "dev", "--port", str(port), *serve_args]
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, server, f"contextd did not start; see {workdir / 'contextd.log'}")
        yield DevServer(base, stack.redis_url, stack.database_url, server.pid)
    finally:
        server.terminate()
        server.wait(30)
        log.close()
        stack.stop()


async def load_contextd(base: str, big_turns: int) -> int:
    """The floor's data shape in contextd; returns the chunks of the recall session."""
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        for s in range(SMALL_SESSIONS):
            turns = [
                {
                    "role": "user" if i % 2 else "assistant",
                    "content": f"turn {i} of session {s} " * 8,
                }
                for i in range(1, SMALL_TURNS + 1)
            ]
            resp = await http.post(f"/v1/sessions/floor-s{s}/turns", json={"turns": turns})
            resp.raise_for_status()
        if not big_turns:
            return 0
        await ingest(http, BIG_SESSION, big_turns, BIG_CONFIG)
        info = await wait_offloaded(http, BIG_SESSION, True, 3600)
        return int(info["counts"]["chunks"])


def wait_worker_idle(database_url: str, timeout: float = 1800) -> float:
    """Wait until no job waits or runs (the notes regenerations that follow the recall
    session's offloads can outlast its embedding): the builds are measured with the worker
    idle. Returns the seconds waited."""
    started = time.monotonic()
    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
            ).fetchone()
            if row is not None and row[0] == 0:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise SystemExit(f"the worker still had {row} jobs after {timeout:.0f}s")
            time.sleep(0.5)


def analyze_database(database_url: str) -> None:
    """`VACUUM ANALYZE`, as the floor does once its tables are loaded: both sides are measured
    with their planner statistics up to date and no dead row versions left by the load (every
    chunk's row is written twice, once offloaded and once embedded)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def forget_query_embeddings(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match="*:qemb:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


async def measure_contextd(
    floor: ModuleType,
    server: DevServer,
    requests: int,
    scenarios: tuple[str, ...],
    concurrencies: tuple[int, ...] = CLIENTS,
) -> tuple[Figures, dict[str, Counter[str]], CpuPerRequest, Windows]:
    """The floor's own measurement loop (warm-up, then each of `concurrencies`) against contextd;
    also the fallback flags of the measured builds, per scenario, the CPU time per request
    of contextd's API and its worker (a child process under `contextd dev`), its PostgreSQL, its
    Valkey and this client, and when each phase ran."""
    stack = Stack(server.pid, server.database_url, server.redis_url, os.getpid())
    figures: Figures = {}
    cpu: CpuPerRequest = {}
    windows: Windows = {}
    flags: dict[str, Counter[str]] = {}
    paths: dict[str, Callable[[int], str]] = {
        "no recall": lambda j: f"/v1/sessions/floor-s{j % SMALL_SESSIONS}/build-prompt",
        "recall": lambda j: f"/v1/sessions/{BIG_SESSION}/build-prompt",
    }
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        client = BuildPromptClient(http)
        for name in scenarios:
            await floor.load(client, paths[name], 4, 60)
            client.fallbacks.clear()
            for clients in concurrencies:
                before, began = stack.cpu(), time.monotonic()
                figures[(name, clients)] = await floor.load(client, paths[name], clients, requests)
                windows[(name, clients)] = (began, time.monotonic())
                cpu[(name, clients)] = per_request(before, stack.cpu(), requests)
            flags[name] = Counter(client.fallbacks)
    return figures, flags, cpu, windows


@dataclass(frozen=True)
class TimedBuild:
    ms: float  # as the client saw it
    timings_ms: dict[str, float]  # the server's stages
    level: str  # the watermark level the build reported
    appended_level: str | None  # the level the append before it reported (None: quiet)
    append_ms: float | None  # the append before it, as the client saw it (None: quiet)


async def after_append(
    floor: ModuleType, base: str, tries: int, seed: int
) -> tuple[list[TimedBuild], list[TimedBuild]]:
    """Recall builds on a quiet server, then builds each sent right after a 100-turn append to
    the same session (see the module docstring)."""
    rng = random.Random(seed)
    queries = floor.queries(2 * tries, seed)
    path = f"/v1/sessions/{BIG_SESSION}"
    quiet: list[TimedBuild] = []
    loaded: list[TimedBuild] = []

    async def build(query: str, append: httpx.Response | None = None) -> TimedBuild:
        started = time.perf_counter()
        resp = await http.post(f"{path}/build-prompt", json={"query": query})
        resp.raise_for_status()
        ms = (time.perf_counter() - started) * 1000
        body = resp.json()
        return TimedBuild(
            ms,
            body["timings_ms"],
            body["watermark"]["level"],
            append.json()["watermark"]["level"] if append else None,
            append.elapsed.total_seconds() * 1000 if append else None,
        )

    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        await wait_offloaded(http, BIG_SESSION, True, 3600)  # quiet: the worker is idle
        for j in range(tries):
            quiet.append(await build(queries[j]))
        for j in range(tries):
            turns = [
                {"role": "user" if i % 2 == 0 else "assistant", "content": turn_text(rng, i)}
                for i in range(APPEND_TURNS)
            ]
            appended = await http.post(f"{path}/turns", json={"turns": turns})
            appended.raise_for_status()
            loaded.append(await build(queries[tries + j], appended))
    return quiet, loaded


def p95(builds: list[TimedBuild]) -> float:
    return percentile([b.ms for b in builds], 0.95)


def speeds(machine: MachineSpeed, windows: tuple[Windows, Windows]) -> tuple[Speeds, Speeds]:
    return (
        {key: machine.factor(window) for key, window in windows[0].items()},
        {key: machine.factor(window) for key, window in windows[1].items()},
    )


def print_round(
    n: int,
    floor: Figures,
    contextd: Figures,
    flags: dict[str, Counter[str]],
    cpu: tuple[CpuPerRequest, CpuPerRequest],
    speed: tuple[Speeds, Speeds],
    load: tuple[float, ...],
) -> None:
    print(f"round {n}  (load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})")
    for name, counts in flags.items():
        if counts:
            print(f"  contextd fallbacks ({name}): {dict(counts)}")
    for key in contextd:
        f, c = floor[key], contextd[key]
        print(
            f"  {key[0]:9s} clients={key[1]:2d}  floor p50 {f[0]:7.2f} p95 {f[1]:7.2f} "
            f"{f[2]:5.0f} req/s | contextd p50 {c[0]:7.2f} p95 {c[1]:7.2f} {c[2]:5.0f} req/s | "
            f"x{c[0] / f[0]:.2f} p50, x{c[2] / f[2]:.2f} req/s"
        )
        print(
            f"    CPU ms/request  floor {cpu_line(cpu[0][key])} | contextd {cpu_line(cpu[1][key])}"
        )
        print(
            f"    machine x{speed[0][key]:.2f} | x{speed[1][key]:.2f}; p50 ratio at equal speed "
            f"x{c[0] / f[0] * speed[0][key] / speed[1][key]:.2f}"
        )
    sys.stdout.flush()


def cpu_line(parts: PartsCpu) -> str:
    return " ".join(f"{part} {ms:.2f}" for part, ms in parts.items())


def summary(
    rounds: list[tuple[Figures, Figures]], speeds: list[tuple[Speeds, Speeds]]
) -> list[dict[str, Any]]:
    rows = []
    for key in rounds[0][1]:
        p50_ratios = [c[key][0] / f[key][0] for f, c in rounds]
        equal_speed = [
            r * fs[key] / cs[key] for r, (fs, cs) in zip(p50_ratios, speeds, strict=True)
        ]
        p95_ratios = [c[key][1] / f[key][1] for f, c in rounds]
        rps_ratios = [c[key][2] / f[key][2] for f, c in rounds]
        rows.append(
            {
                "scenario": key[0],
                "clients": key[1],
                "floor_p50": statistics.median(f[key][0] for f, _ in rounds),
                "floor_p95": statistics.median(f[key][1] for f, _ in rounds),
                "floor_rps": statistics.median(f[key][2] for f, _ in rounds),
                "contextd_p50": statistics.median(c[key][0] for _, c in rounds),
                "contextd_p95": statistics.median(c[key][1] for _, c in rounds),
                "contextd_rps": statistics.median(c[key][2] for _, c in rounds),
                "p50_ratio": statistics.median(p50_ratios),
                "p50_ratio_range": (min(p50_ratios), max(p50_ratios)),
                "p50_ratio_equal_speed": statistics.median(equal_speed),
                "p50_ratio_equal_speed_range": (min(equal_speed), max(equal_speed)),
                "machine_floor": [fs[key] for fs, _ in speeds],
                "machine_contextd": [cs[key] for _, cs in speeds],
                "p95_ratio": statistics.median(p95_ratios),
                "rps_ratio": statistics.median(rps_ratios),
                "rps_ratio_range": (min(rps_ratios), max(rps_ratios)),
            }
        )
    return rows


def print_summary(rows: list[dict[str, Any]], n_rounds: int) -> None:
    print(f"\nmedians over {n_rounds} round(s); ratio = contextd / floor (range over rounds)")
    print(
        "| scenario | clients | floor p50 | contextd p50 | p50 ratio | floor p95 | contextd p95 "
        "| floor req/s | contextd req/s | req/s ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["p50_ratio_range"]
        rlo, rhi = r["rps_ratio_range"]
        print(
            f"| {r['scenario']} | {r['clients']} | {r['floor_p50']:.2f} ms | "
            f"{r['contextd_p50']:.2f} ms | {r['p50_ratio']:.2f} ({lo:.2f}-{hi:.2f}) | "
            f"{r['floor_p95']:.2f} ms | {r['contextd_p95']:.2f} ms | {r['floor_rps']:.0f} | "
            f"{r['contextd_rps']:.0f} | {r['rps_ratio']:.2f} ({rlo:.2f}-{rhi:.2f}) |"
        )
    print("\nthe machine's speed factor per round (1: the run's fastest), floor | contextd, and")
    print("the p50 ratio had both run at one speed (p50 ratio x floor's factor / contextd's)")
    for r in rows:
        lo, hi = r["p50_ratio_equal_speed_range"]
        factors = ", ".join(
            f"x{f:.2f} | x{c:.2f}"
            for f, c in zip(r["machine_floor"], r["machine_contextd"], strict=True)
        )
        print(
            f"  {r['scenario']}, {r['clients']} client(s): {factors}; p50 ratio at equal speed "
            f"{r['p50_ratio_equal_speed']:.2f} ({lo:.2f}-{hi:.2f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor-dir", type=Path, default=Path("../shared/perf"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=480, help="per scenario and concurrency")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help="comma-separated, of: no recall, recall (without recall: no big session is loaded, "
        "no after-append rounds run, the floor's recall rows are not compared)",
    )
    parser.add_argument(
        "--big-turns",
        type=int,
        default=5000,
        help="turns of the recall session; too few to cross its offload trigger fails at once",
    )
    parser.add_argument("--append-tries", type=int, default=20)
    parser.add_argument("--append-rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=random.randint(18100, 18900))
    parser.add_argument("--redis-port", type=int, default=random.randint(18100, 18900))
    parser.add_argument("--serve-args", default="", help="extra `contextd dev` arguments")
    parser.add_argument(
        "--clients",
        type=sweep_clients,
        default=CLIENTS,
        help="comma-separated concurrencies to measure both sides at (1 and 16 always are)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    scenarios = tuple(name.strip() for name in args.scenarios.split(","))
    if not scenarios or any(name not in SCENARIOS for name in scenarios):
        parser.error(f"--scenarios: comma-separated, of {', '.join(SCENARIOS)}")
    floor = floor_module(args.floor_dir.resolve())
    rounds: list[tuple[Figures, Figures]] = []
    cpus: list[tuple[CpuPerRequest, CpuPerRequest]] = []
    loads: list[tuple[float, ...]] = []
    windows: list[tuple[Windows, Windows]] = []
    appended = []
    machine = MachineSpeed()
    with (
        tempfile.TemporaryDirectory(prefix="floor-compare-") as tmp,
        contextd_dev(Path(tmp), args.port, args.serve_args.split(), args.redis_port) as server,
    ):
        base = server.url
        started = time.monotonic()
        chunks = asyncio.run(load_contextd(base, args.big_turns if "recall" in scenarios else 0))
        print(
            f"contextd: {SMALL_SESSIONS} sessions x {SMALL_TURNS} turns, {args.big_turns} turns "
            f"offloaded into {chunks} chunks and embedded in {time.monotonic() - started:.0f}s; "
            f"the worker idle {wait_worker_idle(server.database_url):.0f}s later"
        )
        analyze_database(server.database_url)
        for n in range(1, args.rounds + 1):
            load = os.getloadavg()
            forget_query_embeddings(server.redis_url)
            if n % 2:
                floor_figures, floor_cpu, floor_windows = run_floor(
                    args.floor_dir, chunks or 100, args.requests, scenarios, args.clients
                )
                ours, flags, cpu, our_windows = asyncio.run(
                    measure_contextd(floor, server, args.requests, scenarios, args.clients)
                )
            else:
                ours, flags, cpu, our_windows = asyncio.run(
                    measure_contextd(floor, server, args.requests, scenarios, args.clients)
                )
                floor_figures, floor_cpu, floor_windows = run_floor(
                    args.floor_dir, chunks or 100, args.requests, scenarios, args.clients
                )
            rounds.append((floor_figures, ours))
            cpus.append((floor_cpu, cpu))
            loads.append(load)
            windows.append((floor_windows, our_windows))
            speed = speeds(machine, windows[-1])
            print_round(n, floor_figures, ours, flags, (floor_cpu, cpu), speed, load)
        for n in range(1, args.append_rounds + 1 if "recall" in scenarios else 1):
            quiet_builds, loaded_builds = asyncio.run(
                after_append(floor, base, args.append_tries, n)
            )
            quiet, loaded = p95(quiet_builds), p95(loaded_builds)
            appended.append((quiet, loaded))
            print(
                f"after a {APPEND_TURNS}-turn append, {args.append_tries} builds: quiet p95 "
                f"{quiet:.1f} ms, right after the append p95 {loaded:.1f} ms "
                f"(x{loaded / quiet:.2f}); "
                f"{sum(b.appended_level == 'emergency' for b in loaded_builds)} appends took the "
                "window to the emergency ratio"
            )
    # The factors again, against the fastest sample of the whole run.
    rows = summary(rounds, [speeds(machine, w) for w in windows])
    machine.stop()
    print_summary(rows, len(rounds))
    print("\nCPU time per request (ms), medians over rounds, per process: the server, its")
    print("PostgreSQL (postmaster and backends), its Valkey, the client driving it")
    for key in cpus[0][1]:
        floor_parts, our_parts = (
            {
                part: statistics.median(c[side][key][part] for c in cpus)
                for part in cpus[0][side][key]
            }
            for side in (0, 1)
        )
        print(f"  {key[0]}, {key[1]} client(s): floor {cpu_line(floor_parts)}")
        print(f"  {key[0]}, {key[1]} client(s): contextd {cpu_line(our_parts)}")
    if appended:
        ratio = statistics.median(loaded / quiet for quiet, loaded in appended)
        print(f"build right after an append: p95 / quiet p95, median over rounds x{ratio:.2f}")
    end = os.getloadavg()
    print(f"load average at the end {end[0]:.1f} {end[1]:.1f} {end[2]:.1f}; {os.cpu_count()} cores")
    if args.json:
        args.json.write_text(json_report(rounds, rows, loads, chunks, appended, cpus))


def json_report(
    rounds: list[tuple[Figures, Figures]],
    rows: list[dict[str, Any]],
    loads: list[tuple[float, ...]],
    chunks: int,
    appended: list[tuple[float, float]],
    cpus: list[tuple[CpuPerRequest, CpuPerRequest]],
) -> str:
    """What `--json` writes (read by `benchmarks.plots`): each round's figures and CPU per
    request as [floor items, contextd items], an item [[scenario, clients], value]."""
    return json.dumps(
        {"rounds": [[list(f.items()), list(c.items())] for f, c in rounds], "summary": rows}
        | {"loadavg": loads, "chunks": chunks, "after_append": appended}
        | {"cpu_ms_per_request": [[list(f.items()), list(c.items())] for f, c in cpus]},
        indent=2,
        default=list,
    )


if __name__ == "__main__":
    main()
