"""One call to an OpenAI-compatible `/v1/chat/completions` endpoint asking for a JSON object
(or, for the eval's answering model, plain text).

Shared by the optional LLM notes generator, the optional LLM query rewrite and the eval's
answering model and judge: same URL rule,
timeout (enforced as a total with `asyncio.timeout`), reply decoding and error wording; callers
validate the decoded object against their own schema, and get a failure as their own exception
(`ask_json`).
"""

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

import httpx


class ChatUnavailable(Exception):
    """The chat endpoint could not give a JSON reply (timeout, connection, HTTP error, bad body)."""


@dataclass(frozen=True)
class ChatEndpoint:
    """One chat model: where it answers, its name, its bearer key, the budget of a call."""

    base_url: str
    model: str
    api_key: str | None
    timeout_s: float


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
    """The JSON value in the reply of one JSON-mode chat completion (temperature 0)."""
    payload = {
        "model": model,
        "messages": messages,
        "response_format": {"type": "json_object"},
        "temperature": 0,
    }
    body = await _completion(client, base_url, api_key, payload, timeout_s, purpose=purpose)
    return decode_reply(body)


async def chat_text(
    client: httpx.AsyncClient,
    endpoint: ChatEndpoint,
    messages: list[dict[str, Any]],
    *,
    purpose: str,
) -> str:
    """The text of the reply of one plain chat completion (temperature 0) at `endpoint`: a model
    that answers in prose, where JSON mode would change what it is asked."""
    payload = {"model": endpoint.model, "messages": messages, "temperature": 0}
    body = await _completion(
        client, endpoint.base_url, endpoint.api_key, payload, endpoint.timeout_s, purpose=purpose
    )
    return reply_content(body)


async def _completion(
    client: httpx.AsyncClient,
    base_url: str,
    api_key: str | None,
    payload: dict[str, Any],
    timeout_s: float,
    *,
    purpose: str,
) -> Any:
    """The decoded body of one chat completion request; `ChatUnavailable` on any failure."""
    url = chat_completions_url(base_url)
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


async def ask_json(
    client: httpx.AsyncClient,
    endpoint: ChatEndpoint,
    messages: list[dict[str, str]],
    *,
    purpose: str,
    failure: type[Exception],
) -> Any:
    """`chat_json` at `endpoint`, its failure raised as the caller's own `failure` (same
    message)."""
    try:
        return await chat_json(
            client,
            endpoint.base_url,
            endpoint.model,
            endpoint.api_key,
            messages,
            endpoint.timeout_s,
            purpose=purpose,
        )
    except ChatUnavailable as exc:
        raise failure(str(exc)) from exc


def reply_content(body: Any) -> str:
    """`choices[0].message.content` of a chat completion body."""
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ChatUnavailable("reply has no choices[0].message.content") from exc
    if not isinstance(content, str):
        raise ChatUnavailable("choices[0].message.content is not a string")
    return content


def decode_reply(body: Any) -> Any:
    """`choices[0].message.content` parsed as JSON (a ```json fence around it is accepted)."""
    text = reply_content(body).strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ChatUnavailable(f"reply content is not valid JSON: {exc}") from exc
