"""One call to an OpenAI-compatible `/v1/chat/completions` endpoint asking for a JSON object.

Shared by the optional LLM notes generator and the optional LLM query rewrite: same URL rule,
timeout (enforced as a total with `asyncio.timeout`) and error wording; callers parse the reply.
"""

import asyncio
import re
from typing import Any

import httpx


class ChatUnavailable(Exception):
    """The chat endpoint could not give a JSON reply (timeout, connection, HTTP error, bad body)."""


def chat_completions_url(base_url: str) -> str:
    """`{base}/v1/chat/completions` whether or not `base_url` already ends in `/v1`."""
    base = base_url.rstrip("/")
    if not re.search(r"/v1$", base):
        base = f"{base}/v1"
    return f"{base}/chat/completions"


async def chat_json(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    api_key: str | None,
    messages: list[dict[str, str]],
    timeout_s: float,
    *,
    purpose: str,
) -> Any:
    """The decoded response body of one JSON-mode chat completion (temperature 0)."""
    url = chat_completions_url(base_url)
    payload = {
        "model": model,
        "messages": messages,
        "response_format": {"type": "json_object"},
        "temperature": 0,
    }
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with asyncio.timeout(timeout_s):
            response = await client.post(url, json=payload, headers=headers, timeout=timeout_s)
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise ChatUnavailable(f"{purpose} at {url} timed out after {timeout_s}s") from exc
    except httpx.HTTPError as exc:
        raise ChatUnavailable(
            f"{purpose} request to {url} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if response.status_code >= 400:
        raise ChatUnavailable(
            f"{purpose} at {url} returned HTTP {response.status_code}: {response.text[:200]}"
        )
    try:
        return response.json()
    except ValueError as exc:
        raise ChatUnavailable(f"{purpose} at {url} returned a non-JSON body") from exc
