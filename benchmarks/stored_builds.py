"""What storing each build's manifest costs a build: wall time of sequential builds at 1 client on a
200-turn session (the baseline prompt, ~200 manifest entries), p50/p95.

Run it against `contextd dev` (which stores every build's manifest) and against
`CONTEXTD_RECALL__PERSIST_MANIFESTS=false contextd dev` (which stores none), in turn:

    .venv/bin/python -m benchmarks.stored_builds --url http://127.0.0.1:8080 [--builds 300]
"""

import argparse
import asyncio
import time
import uuid

import httpx

from benchmarks.build_prompt_latency import percentile

WARM_UP = 20


async def run(url: str, api_key: str | None, builds: int) -> None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        sid = f"stored-builds-{uuid.uuid4().hex[:8]}"
        turns = [
            {
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"Note {i}: parcel AB-{10000 + i} costs {i} EUR, day {i % 30}.",
            }
            for i in range(200)
        ]
        for start in range(0, len(turns), 50):
            chunk = {"turns": turns[start : start + 50]}
            (await http.post(f"/v1/sessions/{sid}/turns", json=chunk)).raise_for_status()
        walls: list[float] = []
        entries = 0
        for i in range(WARM_UP + builds):
            body = {"system": "Be brief.", "query": f"Where is parcel AB-{10000 + i % 200}?"}
            started = time.perf_counter()
            built = await http.post(f"/v1/sessions/{sid}/build-prompt", json=body)
            wall = (time.perf_counter() - started) * 1000
            built.raise_for_status()
            entries = len(built.json()["manifest"])
            if i >= WARM_UP:
                walls.append(wall)
        await http.delete(f"/v1/sessions/{sid}")
    print(
        f"builds {builds}, manifest entries {entries}: "
        f"p50 {percentile(walls, 0.5):.1f} ms, p95 {percentile(walls, 0.95):.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--builds", type=int, default=300)
    args = parser.parse_args()
    asyncio.run(run(args.url, args.api_key, args.builds))


if __name__ == "__main__":
    main()
