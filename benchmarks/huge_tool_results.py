"""Huge tool results: how long the append that layers one takes, the build after it, and how
long /healthz stalls meanwhile.

    .venv/bin/contextd dev --port 18200 &          # in another terminal / directory
    .venv/bin/python -m benchmarks.huge_tool_results --url http://127.0.0.1:18200 [--runs 5]

Each run makes a fresh session and appends a user turn, a tool call and its result in one
request (the result layered on arrival: chunked into C3, its view in the window), then builds a
prompt. A probe requests /healthz every 20 ms throughout; its slowest answer is the longest
stall anyone else saw. Cases: a 2 MB English log, a 1 MB JSON, a 2 MB Chinese log (those of
`tests/sessions/test_huge_tool_results.py`). Prints each run and the median and p95 over the
runs (milliseconds, client side, loopback), and the machine's load average before and after
(the figures follow it: the append is CPU work on both the API's and the database's side).
"""

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid

import httpx

from benchmarks.append_latency import percentile
from benchmarks.long_turns import probe
from tests.sessions.test_huge_tool_results import call, chinese_log, english_log, result


def order_json() -> str:
    items = [{"sku": f"SKU{i:06d}", "qty": i % 9, "warehouse": "LYS-2"} for i in range(9_000)]
    order = {"order": {"order_id": "ORD-DEEP-42", "total": "1234.50 EUR", "state": "held"}}
    return json.dumps({"before": items, "result": {"inner": order}, "after": items}, indent=1)


CASES = {
    "2 MB English log": english_log(19_000),
    "1 MB JSON": order_json(),
    "2 MB Chinese log": chinese_log(14_000),
}


async def one_run(http: httpx.AsyncClient, text: str) -> tuple[float, float, float]:
    """(append ms, build ms, worst /healthz ms) of one session."""
    sid = f"huge-{uuid.uuid4().hex[:8]}"
    turns = [
        {"role": "user", "content": "Find what happened to the order."},
        call("call_0", "read_log", json.dumps({"path": "/var/log/app.log"})),
        result("call_0", text),
    ]
    body = json.dumps({"turns": turns}, ensure_ascii=False).encode()
    stop, worst = asyncio.Event(), [0.0]
    prober = asyncio.create_task(probe(http, stop, worst))
    started = time.perf_counter()
    resp = await http.post(
        f"/v1/sessions/{sid}/turns", content=body, headers={"Content-Type": "application/json"}
    )
    resp.raise_for_status()
    appended = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    built = await http.post(f"/v1/sessions/{sid}/build-prompt", json={"system": "Operations."})
    built.raise_for_status()
    build = (time.perf_counter() - started) * 1000
    stop.set()
    await prober
    return appended, build, worst[0]


async def main(args: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    print("load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=600) as http:
        for name, text in CASES.items():
            runs = [await one_run(http, text) for _ in range(args.runs)]
            for n, (appended, build, stall) in enumerate(runs, 1):
                print(f"{name} run {n}: append {appended:.0f} build {build:.0f} stall {stall:.0f}")
            for label, column in (("append", 0), ("build", 1), ("healthz worst", 2)):
                values = [r[column] for r in runs]
                print(
                    f"{name} ({len(text.encode()):,} bytes): {label} "
                    f"p50 {statistics.median(values):.0f} ms, p95 {percentile(values, 0.95):.0f} ms"
                )
    print("load average (1, 5, 15 min) after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key")
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
