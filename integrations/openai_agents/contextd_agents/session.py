"""`ContextdSession`: the Agents SDK `Session` protocol on contextd's REST API.

The SDK reads a session's history (`get_items`) before it stores the new input, and gives
`get_items` nothing of that input, so a prompt built there recalls for the previous user turn.
`run_config()` moves the build to `call_model_input_filter`, which the SDK calls before each model
call: recall answers the input being answered, and mid-tool-loop the latest exchange. `Runner.run`
stores the input before its first model call; a streamed run stores it after that call's filter,
so until it is stored the input (seen by `session_input_callback`) is sent as the build's query."""

import json
import uuid
from typing import Any
from urllib.parse import quote

import httpx
from agents import FunctionTool, RunConfig, RunContextWrapper, SessionSettings
from agents.run_config import CallModelData, ModelInputData

from contextd_agents.items import item_to_turn, message_to_items, text_of, turn_to_item

PAGE = 500  # turns per page when walking a session's history


class ContextdError(RuntimeError):
    """contextd refused a call (the message carries its error code and text)."""


class ContextdSession:
    """Conversation history kept in contextd session `session_id`.

    `get_items()` is what the model should see next for the latest stored turn: contextd's
    budgeted context (notes, recalled history, the recent window). Run agents with
    `run_config=session.run_config()` so the prompt is built at each model call, from the input
    being answered. `system`: the agent's instructions, counted in the budget (the SDK sends them
    itself, so they are not returned as an item)."""

    session_settings = None

    def __init__(
        self,
        session_id: str,
        base_url: str = "http://127.0.0.1:8080",
        api_key: str | None = None,
        *,
        system: str = "",
        retries: int = 2,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.session_id = session_id
        self.system = system
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = client or httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60)
        self._unstored_input: list[Any] = []  # a run's input, until add_items stores it

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- the Session protocol ---------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[dict[str, Any]]:
        if limit is not None:
            if limit <= 0:
                return []
            turns = await self._turns()
            return [turn_to_item(t) for t in turns[-limit:]]
        return await self._budgeted_items()

    async def add_items(self, items: list[Any]) -> None:
        if not items:
            return
        turns = [item_to_turn(_plain(item)) for item in items]
        # one key for every attempt of this call: a retried append is a no-op on the server
        headers = {"Idempotency-Key": f"agents-{uuid.uuid4()}"}
        await self._request("POST", "turns", json={"turns": turns}, headers=headers)
        self._unstored_input = []  # the SDK stores a run's input before anything else of it

    async def pop_item(self) -> dict[str, Any] | None:
        turns = await self._turns()
        if not turns:
            return None
        last = turns[-1]
        forget = {"type": "forget", "turn_range": [last["seq"], last["seq"]]}
        await self._request("POST", "memory", json=forget)
        return turn_to_item(last)

    async def clear_session(self) -> None:
        await self._request("DELETE", None, missing_ok=True)

    # --- the prompt at each model call -------------------------------------------------------

    def run_config(self, **options: Any) -> RunConfig:
        """A `RunConfig` (with `options`) for runs on this session: the SDK reads no history
        before the run (`limit=0`), and each model call gets contextd's prompt built once the
        input being answered is stored. One per session: the filter reads this session."""
        return RunConfig(
            call_model_input_filter=self.model_input,
            session_input_callback=self.run_input,
            session_settings=SessionSettings(limit=0),
            **options,
        )

    def run_input(self, history: list[Any], new_items: list[Any]) -> list[Any]:
        """`RunConfig.session_input_callback`: the SDK's history and the new input, unchanged
        (so the SDK stores the input as it would); the input is kept until it is stored."""
        self._unstored_input = list(new_items)
        return [*history, *new_items]

    async def model_input(self, data: CallModelData[Any]) -> ModelInputData:
        """`RunConfig.call_model_input_filter`: the SDK's input is replaced by the budgeted
        context, which holds the new input (as the query while it is not stored yet) and this
        run's stored tool rounds."""
        query = next(
            (
                text_of(item.get("content"))
                for item in reversed([_plain(i) for i in self._unstored_input])
                if item.get("role") == "user"
            ),
            None,
        )
        return ModelInputData(
            input=await self._budgeted_items(query),  # type: ignore[arg-type]  # plain dicts
            instructions=data.model_data.instructions,
        )

    # --- contextd calls -----------------------------------------------------------------------

    async def _budgeted_items(self, query: str | None = None) -> list[dict[str, Any]]:
        """build-prompt as input items: for `query` (not stored), else for the latest stored
        turn (the recall query then)."""
        body: dict[str, Any] = {"system": self.system, "format": "openai"}
        if query is not None:
            body["query"] = query
        resp = await self._request("POST", "build-prompt", json=body, missing_ok=True)
        if resp is None:
            return []
        messages = resp["messages"][1:] if self.system else resp["messages"]
        return [item for message in messages for item in message_to_items(message)]

    async def memory(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """One call of contextd's memory tool on this session (`{type, text, data}`)."""
        answer = await self._request("POST", "memory", json=arguments)
        assert answer is not None
        return answer

    async def memory_tool_definition(self) -> dict[str, Any]:
        resp = await self._send("GET", "/v1/memory/tool", params={"format": "openai"})
        return dict(resp.json())

    async def _turns(self) -> list[dict[str, Any]]:
        turns: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": PAGE}
            if cursor:
                params["cursor"] = cursor
            page = await self._request("GET", "turns", params=params, missing_ok=True)
            if page is None:
                return []
            turns.extend(page["turns"])
            cursor = page["next_cursor"]
            if not cursor:
                return turns

    async def _request(
        self, method: str, tail: str | None, *, missing_ok: bool = False, **kwargs: Any
    ) -> dict[str, Any] | None:
        # Every character reaches the server, whose one session-id rule refuses what it must.
        session = quote(self.session_id, safe="", errors="surrogatepass")
        path = f"/v1/sessions/{session}" + (f"/{tail}" if tail else "")
        resp = await self._send(method, path, missing_ok=missing_ok, **kwargs)
        if resp.status_code == 404 and missing_ok:
            return None
        return dict(resp.json())

    async def _send(
        self, method: str, path: str, *, missing_ok: bool = False, **kwargs: Any
    ) -> httpx.Response:
        """Send with retries on network errors and 5xx (same headers, so same idempotency key)."""
        attempt = 0
        while True:
            try:
                resp = await self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise ContextdError(f"{method} {self._http.base_url}{path}: {exc!r}") from exc
                attempt += 1
                continue
            if resp.status_code >= 500 and attempt < self.retries:
                attempt += 1
                continue
            if resp.status_code >= 400 and not (missing_ok and _no_such_session(resp)):
                raise ContextdError(f"{method} {path}: HTTP {resp.status_code} {resp.text}")
            return resp


def _no_such_session(resp: httpx.Response) -> bool:
    """A 404 for a session not stored yet (not one for a path no route serves)."""
    if resp.status_code != 404:
        return False
    try:
        return bool(resp.json()["error"].get("field") == "session_id")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def _plain(item: Any) -> dict[str, Any]:
    """Items may be pydantic models or TypedDicts; contextd stores their JSON form."""
    if hasattr(item, "model_dump"):
        return dict(item.model_dump(exclude_unset=True, mode="json"))
    return json.loads(json.dumps(item, default=str))


async def memory_tool(session: ContextdSession) -> FunctionTool:
    """contextd's `memory` tool (its definition from the server) as an Agents SDK tool on
    `session`; the model reads the answer's `text`, an error comes back as text too."""
    definition = (await session.memory_tool_definition())["function"]

    async def invoke(_: RunContextWrapper[Any], arguments: str) -> str:
        try:
            answer = await session.memory(json.loads(arguments or "{}"))
        except (ContextdError, json.JSONDecodeError) as exc:
            return f"error: {exc}"
        return str(answer["text"])

    return FunctionTool(
        name=definition["name"],
        description=definition["description"],
        params_json_schema=definition["parameters"],
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )
