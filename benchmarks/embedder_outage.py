"""An embeddings endpoint that accepts and never answers: build-prompt latency and flags, and the
latency of appends on the same session while builds wait, against appends with no build running.

    .venv/bin/python -m benchmarks.embedder_outage --serve-hang 18201 &   # the hanging embedder
    CONTEXTD_EMBEDDING__KIND=openai CONTEXTD_EMBEDDING__OPENAI_BASE_URL=http://127.0.0.1:18201 \\
        CONTEXTD_EMBEDDING__OPENAI_DIM=8 .venv/bin/contextd dev --port 18100 &
    .venv/bin/python -m benchmarks.embedder_outage --url http://127.0.0.1:18100 --builds 20

One session with a small window and offloaded history (so every build recalls, and so embeds
its query). Each build runs alongside one append on the same session. Prints medians and p95
(milliseconds, client side, loopback) and how many builds carried each fallback flag.
"""

import argparse
import asyncio
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Awaitable

import httpx

from benchmarks.append_latency import percentile

SMALL = {"context_limit": 2000, "reserve_tokens": 200, "min_recent_turns": 2}


async def serve_hang(port: int) -> None:
    """Accept connections, read what they send, never answer."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def turn(i: int) -> dict[str, str]:
    return {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": f"Turn {i}: order AB-{10000 + i} goes to Lyon by train, window seat. " * 3,
    }


async def timed(request: Awaitable[httpx.Response]) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    resp = await request
    return (time.perf_counter() - started) * 1000, resp


def summary(name: str, values: list[float]) -> str:
    return (
        f"{name}: median {statistics.median(values):.0f} ms, "
        f"p95 {percentile(values, 0.95):.0f} ms, max {max(values):.0f} ms (n={len(values)})"
    )


async def main_async(args: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    sid = f"bench-outage-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=120) as http:
        (await http.put(f"/v1/sessions/{sid}", json=SMALL)).raise_for_status()
        turns = [turn(i) for i in range(40)]
        (await http.post(f"/v1/sessions/{sid}/turns", json={"turns": turns})).raise_for_status()
        moved = await http.post(f"/v1/sessions/{sid}/memory", json={"type": "offload"})
        moved.raise_for_status()

        async def append(i: int) -> tuple[float, httpx.Response]:
            body = {"turns": [{"role": "user", "content": f"One more thing, number {i}."}]}
            return await timed(http.post(f"/v1/sessions/{sid}/turns", json=body))

        alone = [(await append(i))[0] for i in range(args.builds)]
        builds, during, flags = [], [], Counter[str]()
        for i in range(args.builds):
            body = {"system": "You plan trips.", "query": f"Which train goes to Lyon? {i}"}
            build = asyncio.create_task(
                timed(http.post(f"/v1/sessions/{sid}/build-prompt", json=body))
            )
            appended_ms, appended = await append(1000 + i)
            built_ms, built = await build
            built.raise_for_status()
            appended.raise_for_status()
            builds.append(built_ms)
            during.append(appended_ms)
            flags.update(built.json()["fallbacks"])
    print(summary("build-prompt while the embedder hangs", builds))
    print(summary("append alongside a build", during))
    print(summary("append with no build running", alone))
    print("fallback flags:", dict(flags))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key")
    parser.add_argument("--builds", type=int, default=20)
    parser.add_argument("--serve-hang", type=int, metavar="PORT", help="run the hanging embedder")
    args = parser.parse_args()
    asyncio.run(serve_hang(args.serve_hang) if args.serve_hang else main_async(args))


if __name__ == "__main__":
    main()
