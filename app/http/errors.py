"""The error hierarchy of `app.core.errors` on the wire: the OpenAPI responses each endpoint
declares (`error_responses`, `with_rules`), request validation mapped to our codes, and the
handlers that turn every exception into `{"error": {"code", "message", "field"}}`."""

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from app.core.errors import (
    DATABASE_UNAVAILABLE,
    TIME_LIMIT_SQLSTATES,
    ContextdError,
    ErrorResponse,
    Forbidden,
    HttpError,
    InvalidBuildId,
    InvalidChunkId,
    InvalidInput,
    InvalidReceiptId,
    InvalidSessionId,
    InvalidText,
    InvalidValue,
    MalformedJson,
    MethodNotAllowed,
    MisdirectedRequest,
    MissingField,
    NotFound,
    RateLimited,
    ServiceUnavailable,
    TooDeep,
    TransactionConflict,
    Unauthorized,
    UnsupportedMediaType,
    WrongType,
    sqlstate,
    transaction_conflict,
)

logger = logging.getLogger("contextd.errors")


def error_responses(*errors: type[ContextdError]) -> dict[int | str, dict[str, Any]]:
    """`responses=` of a route or router: each status with the one error model, its description
    listing every code the route can answer with that status and what it means."""
    codes: dict[int, dict[str, str]] = defaultdict(dict)
    for err in errors:
        codes[err.status_code][err.code] = " ".join((err.__doc__ or "").split())
    return {
        status: {
            "model": ErrorResponse,
            "description": "\n".join(f"- `{code}`: {meaning}" for code, meaning in found.items()),
        }
        for status, found in sorted(codes.items())
    }


# What any endpoint touching tenant data can answer.
COMMON_ERRORS: tuple[type[ContextdError], ...] = (
    Unauthorized,
    Forbidden,
    NotFound,
    InvalidInput,
    MalformedJson,
    MissingField,
    WrongType,
    InvalidValue,
    InvalidSessionId,
    InvalidText,
    TooDeep,
    TransactionConflict,
    MisdirectedRequest,
    RateLimited,
    ServiceUnavailable,
)


@dataclass(frozen=True)
class Rule:
    """A 4xx a request can get although its JSON matches the schema: a rule across fields, or
    one on stored state or configured limits, which JSON Schema cannot state."""

    error: type[ContextdError]
    rule: str


def with_rules(description: str, *rules: Rule) -> dict[str, Any]:
    """`description` and `openapi_extra` of an operation that enforces `rules`: listed for
    readers in the description and, machine-readable, as `x-rules` (the API tests accept a
    schema-valid request's 4xx only when its code is listed there)."""
    listed = "\n".join(f"- {r.error.status_code} `{r.error.code}`: {r.rule}" for r in rules)
    return {
        "description": f"{description}\n\nRules beyond the schema:\n{listed}",
        "openapi_extra": {
            "x-rules": [
                {"status": r.error.status_code, "code": r.error.code, "rule": r.rule} for r in rules
            ]
        },
    }


def _is_union_tag(part: object) -> bool:
    """Whether a `loc` part names the member of a union pydantic tried (`system: str |
    list[SystemMessage]` gives `system.str`, `system.list[SystemMessage][0].role`), not a field."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


def _loc_to_field(loc: tuple[Any, ...], *, located: bool) -> str | None:
    """The field a validation error's `loc` names. `located`: FastAPI's, whose first part says
    where the value was (body, query, path, header); only that part is dropped, so a body field
    named `query` keeps its name. A body that is not an object names the body itself."""
    if located and loc == ("body",):
        return "body"
    if located and loc[:1] == ("header",) and len(loc) == 2:
        # FastAPI names a header as it matched it, lower-cased: named as it is written (the 409
        # of a reused Idempotency-Key and the 415 naming Content-Type write it so too).
        return "-".join(word.capitalize() for word in str(loc[1]).split("-"))
    out = ""
    for part in loc[1:] if located else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_union_tag(part):
            out += f".{part}" if out else str(part)
    return out or None


def first_error(errors: Sequence[Any]) -> dict[str, Any]:
    """The error to answer with: the first, or, when it is one member of a union refusing the
    value, the member error that went deepest into it (a list of system messages with a wrong
    role is answered about the role, not with "should be a valid string")."""
    if not errors:
        return {}
    first = dict(errors[0])
    loc = tuple(first.get("loc", ()))
    tag = next((i for i, part in enumerate(loc) if _is_union_tag(part)), None)
    if tag is None:
        return first
    members = [dict(e) for e in errors if tuple(e.get("loc", ()))[:tag] == loc[:tag]]
    return max(members, key=lambda e: len(e.get("loc", ())))


PATH_PARAMETER_ERRORS: dict[str, type[InvalidInput]] = {
    "session_id": InvalidSessionId,
    "chunk_id": InvalidChunkId,
    "build_id": InvalidBuildId,
    "receipt_id": InvalidReceiptId,
}


# Custom validation error types (`PydanticCustomError`) raised by request models.
CUSTOM_VALIDATION_ERRORS: dict[str, type[InvalidInput]] = {
    InvalidText.code: InvalidText,
    TooDeep.code: TooDeep,
}


def _path_parameter(loc: tuple[Any, ...]) -> str | None:
    return str(loc[1]) if len(loc) == 2 and loc[0] == "path" else None


def _validation_message(error: dict[str, Any]) -> str:
    """pydantic's message, except for a session id: the rule itself, as every surface says it."""
    if _path_parameter(tuple(error.get("loc", ()))) == "session_id":
        return InvalidSessionId.RULE
    return str(error.get("msg", "invalid request"))


def _validation_error_class(error: dict[str, Any]) -> type[InvalidInput]:
    kind = str(error.get("type", ""))
    loc = tuple(error.get("loc", ()))
    if _path_parameter(loc) in PATH_PARAMETER_ERRORS:
        return PATH_PARAMETER_ERRORS[loc[1]]
    if kind in CUSTOM_VALIDATION_ERRORS:
        return CUSTOM_VALIDATION_ERRORS[kind]
    if kind == "json_invalid":
        return MalformedJson
    if kind == "missing":
        return MissingField
    if kind in ("literal_error", "enum"):
        return InvalidValue
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return WrongType
    return InvalidInput


def validation_error(error: dict[str, Any], *, located: bool = True) -> InvalidInput:
    """A pydantic validation error as contextd answers it, on every surface (REST bodies and
    parameters; MCP tool arguments, whose `loc` starts at the field: `located=False`)."""
    # A body-wide check (app.http.input) names the field inside the body itself.
    loc = tuple(error.get("loc", ()))
    field = (error.get("ctx") or {}).get("field") or _loc_to_field(loc, located=located)
    if field == "body" and str(error.get("type", "")).startswith(("model_", "dict_")):
        return WrongType("the body should be a JSON object", field="body")
    return _validation_error_class(error)(_validation_message(error), field=field)


def _unreadable_body(request: Request, error: dict[str, Any], body: Any) -> ContextdError | None:
    """A body that is not JSON at all: say why and where, instead of a type error or a character
    offset posing as a field name. None for every other validation error."""
    if error.get("type") == "json_invalid" and isinstance(body, str):
        pos = int(error["loc"][-1])
        line = body.count("\n", 0, pos) + 1
        column = pos - (body.rfind("\n", 0, pos) + 1) + 1
        reason = (error.get("ctx") or {}).get("error", "invalid JSON")
        message = f"malformed JSON at line {line}, column {column} (character {pos}): {reason}"
        return MalformedJson(message, field="body")
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    is_json = content_type == "application/json" or content_type.endswith("+json")
    if tuple(error.get("loc", ())) == ("body",) and isinstance(body, bytes) and not is_json:
        sent = f"as {content_type!r}" if content_type else "without a Content-Type header"
        message = f"the body was sent {sent}; send JSON with 'Content-Type: application/json'"
        return UnsupportedMediaType(message, field="Content-Type")
    return None


class BodyError(StarletteHTTPException):
    """A `ContextdError` raised while the application reads the request body (`app.http.server`):
    FastAPI turns any other exception there into a bare 400, but lets HTTP exceptions through."""

    def __init__(self, error: ContextdError) -> None:
        super().__init__(error.status_code, error.message, headers=error.headers)
        self.error = error


HTTP_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(app: Starlette, scope: Scope) -> list[str]:
    """Methods some route serves at the request's path (the `Allow` header of a 405; Starlette
    names only the first such route's)."""
    return [
        method
        for method in HTTP_METHODS
        if any(
            route.matches({**scope, "method": method})[0] is Match.FULL
            for route in app.router.routes
        )
    ]


def install_error_handlers(app: FastAPI, retry_after_seconds: int) -> None:
    """Every refusal as the one JSON shape. An exception no handler takes is answered by
    `app.core.observability.RequestContextMiddleware` (a 500 that keeps the connection)."""

    @app.exception_handler(ContextdError)
    async def _contextd_error(_: Request, exc: ContextdError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = first_error(exc.errors())
        err = _unreadable_body(request, first, exc.body) or validation_error(first)
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc, BodyError):
            return exc.error.response()
        error: ContextdError
        if exc.status_code == 400:  # FastAPI could not decode the body: not UTF-8 JSON
            return MalformedJson("the body is not UTF-8 encoded JSON", field="body").response()
        if exc.status_code == 404:
            error = NotFound(str(exc.detail))
        elif exc.status_code == 405:
            allow = ", ".join(allowed_methods(request.app, request.scope))
            error = MethodNotAllowed(str(exc.detail), headers={"Allow": allow})
        else:
            error = HttpError(str(exc.detail), headers=dict(exc.headers or {}) or None)
        # The status is Starlette's, the body ours.
        return JSONResponse(
            status_code=exc.status_code, content=error.body(), headers=error.headers
        )

    async def _database_unavailable(_: Request, exc: Exception) -> JSONResponse:
        conflict = transaction_conflict(exc)
        if conflict is not None:  # not retried where it happened
            logger.warning("transaction conflict: %s", conflict.message)
            return conflict.response()
        limit = TIME_LIMIT_SQLSTATES.get(sqlstate(exc) or "")
        logger.warning("database unavailable: %s", limit or type(exc).__name__)
        return ServiceUnavailable(
            f"{limit}; retry later" if limit else "the database cannot be reached; retry later",
            headers={"Retry-After": str(retry_after_seconds)},
        ).response()

    for kind in DATABASE_UNAVAILABLE:
        app.add_exception_handler(kind, _database_unavailable)
