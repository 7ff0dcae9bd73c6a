"""Where consecutive agent steps' prompts part: the tau-bench runs replayed into one server, a
build before every assistant step that calls tools (as `contextd eval agent` does), each pair
of consecutive builds compared message by message. Prints prefix reuse (the tokens of
`app.eval.agent.serialise` shared with the previous build, over all tokens) and, per kind of
the first message that differs (the system prompt's blocks by their header, a stub, a turn's
role, `end` when only messages were added), how many pairs part there and the share of all
tokens lost after it:

    .venv/bin/python -m benchmarks.prefix_breaks --url http://127.0.0.1:18940 \\
        --data ../shared/eval/agent/tau_bench_airline_dev.json --tasks 0-11 --limit 3500
"""

import argparse
import asyncio
import uuid
from collections import Counter
from typing import Any

import httpx

from app.eval.agent import AgentRun, common_prefix, load_runs, parse_ranges, serial_tokens
from app.eval.agent_driver import wire_turn
from app.notes.policy import NOTES_HEADER
from app.notes.values import STUB_PREFIX, VALUE_TABLE_HEADER
from app.prompt.blocks import ABOUT_USER_OPEN, RECALL_OPEN

BLOCKS = {
    NOTES_HEADER: "notes",
    VALUE_TABLE_HEADER.split(" (")[0]: "table",
    RECALL_OPEN: "recalled",
    ABOUT_USER_OPEN: "about-user",
}


def kind(message: dict[str, Any]) -> str:
    """What a message is, for the tally: a block by its header, a stub, else its role."""
    content = str(message.get("content") or "")
    if message["role"] == "system":
        return next((name for head, name in BLOCKS.items() if content.startswith(head)), "system")
    if message["role"] == "tool" and content.startswith(STUB_PREFIX):
        return "stub"
    return str(message["role"])


async def replay(
    http: httpx.AsyncClient, run: AgentRun, limit: int, breaks: Counter[str], lost: Counter[str]
) -> tuple[int, int]:
    """(shared tokens, all tokens) of the run's builds after its first."""
    sid = f"pb-{run.key}-{uuid.uuid4().hex[:6]}"
    config = {"context_limit": limit, "reserve_tokens": 500}
    (await http.put(f"/v1/sessions/{sid}", json=config)).raise_for_status()
    steps = {step.index for step in run.steps}
    previous: tuple[list[dict[str, Any]], list[int]] | None = None
    shared = total = 0
    for index, message in enumerate(run.messages):
        if index in steps:
            resp = await http.post(
                f"/v1/sessions/{sid}/build-prompt", json={"system": run.system, "format": "openai"}
            )
            resp.raise_for_status()
            messages = resp.json()["messages"]
            tokens = serial_tokens(messages)
            if previous is not None:
                common = common_prefix(previous[1], tokens)
                shared, total = shared + common, total + len(tokens)
                parted = next(
                    (kind(a) for a, b in zip(previous[0], messages, strict=False) if a != b), "end"
                )
                breaks[parted] += 1
                lost[parted] += len(tokens) - common
            previous = (messages, tokens)
        resp = await http.post(f"/v1/sessions/{sid}/turns", json={"turns": [wire_turn(message)]})
        resp.raise_for_status()
    return shared, total


async def main(args: argparse.Namespace) -> None:
    runs = load_runs(args.data, parse_ranges(args.tasks), parse_ranges(args.trials))
    breaks: Counter[str] = Counter()
    lost: Counter[str] = Counter()
    shared = total = 0
    async with httpx.AsyncClient(base_url=args.url, timeout=120) as http:
        for run in runs:
            run_shared, run_total = await replay(http, run, args.limit, breaks, lost)
            shared, total = shared + run_shared, total + run_total
    print(f"{len(runs)} runs, limit {args.limit}: prefix reuse {shared / max(total, 1):.3f}")
    for name, count in breaks.most_common():
        print(f"  {name:12s} {count:4d} pairs part here, {lost[name] / max(total, 1):.3f} lost")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--tasks", default="0-11")
    parser.add_argument("--trials", default="0-3")
    parser.add_argument("--limit", type=int, default=3500)
    asyncio.run(main(parser.parse_args()))
