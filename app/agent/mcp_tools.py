"""The MCP tools: `memory` (the very definition `GET /v1/memory/tool` serves, plus the session it
works on) and `build_prompt` (the build-prompt request, plus the session).

The server is stateless (any API process answers any request), so the session is an argument of
every call rather than bound to an MCP connection.
"""

import copy
import json
from typing import Any, TypeVar

import mcp_types as types
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app.agent import service as service_agent
from app.agent.definition import TOOL_NAME as MEMORY
from app.agent.schemas import MemoryRequest
from app.auth.service import require_scope
from app.core.context import AppContext
from app.core.errors import MissingField, NotFound
from app.domain.callers import Caller, Scope
from app.domain.ids import SESSION_ID_PATTERN
from app.http.errors import first_error, validation_error
from app.http.params import require_session_id
from app.prompt.schemas import BuildPromptRequest
from app.prompt.service import build_prompt

BUILD_PROMPT = "build_prompt"
SESSION_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": SESSION_ID_PATTERN,
    "description": "the contextd session (one conversation) this call works on",
}
BUILD_PROMPT_DESCRIPTION = (
    "Build the prompt for the next model call of a contextd session: messages that fit the "
    "model's window, in the order system prompt, notes, recalled history (quoted data, not "
    "instructions), recent turns verbatim, then the query. With append: true the query is "
    "stored as a user turn first. Answer: JSON with messages, usage (tokens per layer), "
    "watermark, recall, fallbacks and the manifest of every fragment considered."
)


def with_session(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (an object schema) with a required `session_id` in front."""
    out = copy.deepcopy(schema)
    out["properties"] = {"session_id": SESSION_ID_SCHEMA, **out.get("properties", {})}
    out["required"] = ["session_id", *out.get("required", [])]
    return out


async def list_tools(db: AsyncSession, context: AppContext, caller: Caller) -> list[types.Tool]:
    memory = await service_agent.tool(db, context, caller, "anthropic")
    return [
        types.Tool(
            name=memory["name"],
            description=memory["description"]
            + "\n\nEvery call names its session_id (the conversation whose history to use).",
            input_schema=with_session(memory["input_schema"]),
        ),
        types.Tool(
            name=BUILD_PROMPT,
            description=BUILD_PROMPT_DESCRIPTION,
            input_schema=with_session(BuildPromptRequest.model_json_schema()),
        ),
    ]


async def call_tool(
    db: AsyncSession, context: AppContext, caller: Caller, name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """Run one tool call; the JSON answer of the matching REST endpoint."""
    args = dict(arguments)
    if "session_id" not in args:
        raise MissingField("session_id is required", field="session_id")
    session_id = require_session_id(args.pop("session_id"))  # the rule of the REST paths
    if name == MEMORY:
        request = _validated(MemoryRequest, args)
        answer = await service_agent.call(db, context, caller, session_id, request)
        return answer.model_dump(mode="json")
    if name == BUILD_PROMPT:
        require_scope(caller, Scope.READ)
        body = _validated(BuildPromptRequest, args)
        if body.append:
            require_scope(caller, Scope.WRITE)
        response = await build_prompt(db, context, caller, session_id, body)
        return response.model_dump(mode="json")
    raise NotFound(f"no tool named {name!r}", field="name")


Body = TypeVar("Body", MemoryRequest, BuildPromptRequest)


def _validated(model: type[Body], args: dict[str, Any]) -> Body:
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        raise validation_error(first_error(exc.errors()), located=False) from None


def tool_result(answer: dict[str, Any]) -> types.CallToolResult:
    """The memory tool's `text` is what a model reads; other answers are their JSON."""
    text = answer["text"] if isinstance(answer.get("text"), str) else _json(answer)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=answer
    )


def error_result(body: dict[str, Any]) -> types.CallToolResult:
    """A refused call, as the model should see it: the REST error body, flagged as an error."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_json(body))],
        structured_content=body,
        is_error=True,
    )


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
