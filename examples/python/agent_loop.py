"""A minimal agent loop on contextd and any OpenAI-compatible chat API (only dependency: httpx).

Each line on stdin is one user message (or pass messages as arguments). Per message:

1. the user turn is stored: `POST /v1/sessions/{id}/turns` with an `Idempotency-Key`, so a
   retried request never stores it twice;
2. contextd builds the prompt: `POST /v1/sessions/{id}/build-prompt` returns messages that fit
   the model's window (recent turns verbatim, notes, recalled history once older turns have been
   offloaded; the latest user turn is the recall query);
3. the model answers (`POST {OPENAI_BASE_URL}/chat/completions`, with contextd's `memory` tool);
4. the answer is appended as a turn; if the model called `memory`, the call goes to
   `POST /v1/sessions/{id}/memory`, its `text` is appended as the tool result, and the loop goes
   back to 2 until the model answers in plain text.

Network errors, 429 and 5xx are retried (the same request, the same Idempotency-Key); a server
that cannot be reached is named in the error. The final answer of each message is printed on
stdout; tool calls are logged on stderr.

Environment:
  CONTEXTD_URL      contextd base URL (default http://127.0.0.1:8080)
  CONTEXTD_API_KEY  contextd API key (unset: no Authorization header, e.g. `contextd dev`)
  OPENAI_BASE_URL   chat API base URL including /v1 (default https://api.openai.com/v1)
  OPENAI_API_KEY    chat API key
  MODEL             model name (default gpt-4o-mini)
  SESSION_ID        contextd session (default agent-demo)
  SYSTEM_PROMPT     system prompt (default: a short helpful-assistant prompt)
  MAX_TOOL_ROUNDS   model calls per message at most (default 5)
  MAX_RETRIES       retries of a failed request (default 3)

Run:  python examples/python/agent_loop.py "Hello!"   or   python agent_loop.py < messages.txt
"""

import json
import os
import sys
import time
import uuid
from typing import Any

import httpx

SYSTEM_PROMPT = (
    "You are a helpful assistant. Earlier parts of long conversations may have been moved out of "
    "your context; use the memory tool to look them up instead of guessing."
)


RETRY_STATUSES = {429, 500, 502, 503, 504}


class ContextdError(RuntimeError):
    pass


class Agent:
    def __init__(self, env: dict[str, str]) -> None:
        headers = {}
        if env.get("CONTEXTD_API_KEY"):
            headers["Authorization"] = f"Bearer {env['CONTEXTD_API_KEY']}"
        self.contextd = httpx.Client(
            base_url=env.get("CONTEXTD_URL", "http://127.0.0.1:8080"), headers=headers, timeout=60
        )
        self.model = httpx.Client(
            base_url=env.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/"),
            headers={"Authorization": f"Bearer {env.get('OPENAI_API_KEY', '')}"},
            timeout=120,
        )
        self.model_name = env.get("MODEL", "gpt-4o-mini")
        self.session = env.get("SESSION_ID", "agent-demo")
        self.system = env.get("SYSTEM_PROMPT", SYSTEM_PROMPT)
        self.max_rounds = int(env.get("MAX_TOOL_ROUNDS", "5"))
        self.retries = int(env.get("MAX_RETRIES", "3"))
        self.tools = self._memory_tool()

    def _send(
        self, client: httpx.Client, what: str, method: str, path: str, **kwargs: Any
    ) -> httpx.Response:
        """One request, retried on network errors, 429 and 5xx: the same method, body and headers
        each time (so an append's Idempotency-Key makes a retry a no-op)."""
        attempt = 0
        while True:
            try:
                resp = client.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise RuntimeError(f"cannot reach {what} at {client.base_url}: {exc}") from exc
            else:
                if resp.status_code not in RETRY_STATUSES or attempt == self.retries:
                    return resp
            time.sleep(0.5 * 2**attempt)
            attempt += 1

    def _contextd(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        resp = self._send(self.contextd, "contextd (CONTEXTD_URL)", method, path, **kwargs)
        if resp.status_code >= 400:
            raise ContextdError(f"{method} {path}: HTTP {resp.status_code} {resp.text}")
        return resp.json()

    def _memory_tool(self) -> list[dict[str, Any]]:
        """contextd's `memory` tool definition, ready for function calling (none if absent)."""
        resp = self._send(
            self.contextd,
            "contextd (CONTEXTD_URL)",
            "GET",
            "/v1/memory/tool",
            params={"format": "openai"},
        )
        if resp.status_code == 404:  # a contextd without the memory tool: plain chat
            return []
        if resp.status_code >= 400:
            raise ContextdError(f"GET /v1/memory/tool: HTTP {resp.status_code} {resp.text}")
        return [resp.json()]

    def _append(self, turn: dict[str, Any]) -> None:
        key = {"Idempotency-Key": str(uuid.uuid4())}  # one key for every retry of this append
        self._contextd(
            "POST", f"/v1/sessions/{self.session}/turns", json={"turns": [turn]}, headers=key
        )

    def _call_memory(self, call: dict[str, Any]) -> str:
        """Run one tool call; errors go back to the model as the tool result, not a crash."""
        if call["function"]["name"] != "memory":
            return f"error: unknown tool {call['function']['name']!r}"
        try:
            args = json.loads(call["function"].get("arguments") or "{}")
        except json.JSONDecodeError as exc:
            return f"error: arguments are not JSON ({exc})"
        resp = self._send(
            self.contextd,
            "contextd (CONTEXTD_URL)",
            "POST",
            f"/v1/sessions/{self.session}/memory",
            json=args,
        )
        if resp.status_code >= 400:
            error = resp.json().get("error", {}) if resp.content else {}
            return f"error: {error.get('code', resp.status_code)}: {error.get('message', '')}"
        text = resp.json()["text"]
        print(f"memory {args.get('type')}: {text.splitlines()[0] if text else ''}", file=sys.stderr)
        return text

    def reply(self, user_text: str) -> str:
        self._append({"role": "user", "content": user_text})
        for _ in range(self.max_rounds):
            prompt = self._contextd(
                "POST",
                f"/v1/sessions/{self.session}/build-prompt",
                json={"system": self.system, "tools": self.tools, "format": "openai"},
            )
            request: dict[str, Any] = {"model": self.model_name, "messages": prompt["messages"]}
            if self.tools:
                request["tools"] = self.tools
            resp = self._send(
                self.model,
                "the chat API (OPENAI_BASE_URL)",
                "POST",
                "/chat/completions",
                json=request,
            )
            if resp.status_code >= 400:
                raise RuntimeError(f"chat API: HTTP {resp.status_code} {resp.text}")
            message = resp.json()["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            content = message.get("content") if calls else message.get("content") or ""
            self._append({"role": "assistant", "content": content, "tool_calls": calls or None})
            if not calls:
                return message.get("content") or ""
            for call in calls:
                self._append(
                    {"role": "tool", "tool_call_id": call["id"], "content": self._call_memory(call)}
                )
        return f"(no answer after {self.max_rounds} model calls)"


def main(argv: list[str]) -> int:
    messages = argv or (line.strip() for line in sys.stdin)
    try:
        agent = Agent(dict(os.environ))
        for text in messages:
            if text:
                print(agent.reply(text), flush=True)
    except (ContextdError, RuntimeError, httpx.HTTPError) as exc:
        print(f"agent_loop: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
