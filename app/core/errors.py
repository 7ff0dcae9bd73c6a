"""One error hierarchy and one JSON shape, `{"error": {"code", "message", "field"}}`, for all.

Every error code is a class here (its docstring is what the code means), so the OpenAPI document
lists each code an endpoint can answer (`error_responses`), and no code is made up at a raise.
"""

import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

logger = logging.getLogger("contextd.errors")


class ContextdError(Exception):
    """A request contextd refuses."""

    status_code: int = 400
    code: str = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details
        self.headers = headers  # response headers, e.g. Retry-After

    def response(self) -> JSONResponse:
        return JSONResponse(status_code=self.status_code, content=self.body(), headers=self.headers)

    def body(self) -> dict[str, Any]:
        return ErrorResponse(
            error=ErrorBody(
                code=self.code, message=self.message, field=self.field, details=self.details
            )
        ).model_dump(exclude_none=True)


class BadRequest(ContextdError):
    """The request cannot be read."""

    status_code, code = 400, "bad_request"


class Unauthorized(ContextdError):
    """No API key, a malformed Authorization header, or an unknown or revoked key."""

    status_code, code = 401, "unauthorized"


class Forbidden(ContextdError):
    """The API key lacks the scope this call needs."""

    status_code, code = 403, "forbidden"


class NotFound(ContextdError):
    """No such session, chunk, memory, build or receipt in the caller's tenant."""

    status_code, code = 404, "not_found"


class MethodNotAllowed(ContextdError):
    """The path exists, but not with this method."""

    status_code, code = 405, "method_not_allowed"


class RequestTimeout(ContextdError):
    """The request body did not arrive whole in time; the connection is closed."""

    status_code, code = 408, "request_timeout"


class Conflict(ContextdError):
    """The request conflicts with an earlier one (an Idempotency-Key reused for another body,
    a concurrent change): nothing was written."""

    status_code, code = 409, "conflict"


class TransactionConflict(Conflict):
    """A concurrent request or job held rows this one needed, and PostgreSQL ended it to break
    a deadlock or a serialization failure; retried a few times first. Nothing of the failed
    attempt was written (`details` names the cause); retry after `Retry-After`."""

    code = "transaction_conflict"


class PayloadTooLarge(ContextdError):
    """A request body, turn, metadata object or batch above the configured limits."""

    status_code, code = 413, "payload_too_large"


class UnsupportedMediaType(ContextdError):
    """The body was not sent as JSON (`Content-Type: application/json`)."""

    status_code, code = 415, "unsupported_media_type"


class InvalidInput(ContextdError):
    """A value out of range or not allowed here; `field` names it."""

    status_code, code = 422, "invalid_input"


class MalformedJson(InvalidInput):
    """The body is not valid JSON."""

    code = "malformed_json"


class InvalidText(InvalidInput):
    """A string or object key holds a NUL character (U+0000) or a lone UTF-16 surrogate, which
    cannot be stored."""

    code = "invalid_text"


class TooDeep(InvalidInput):
    """JSON nested deeper than the limit (`app.core.input.MAX_JSON_DEPTH` levels)."""

    code = "too_deep"


class MissingField(InvalidInput):
    """A required field is absent."""

    code = "missing_field"


class WrongType(InvalidInput):
    """A field has the wrong JSON type."""

    code = "wrong_type"


class InvalidValue(InvalidInput):
    """A field is not one of its allowed values."""

    code = "invalid_value"


class UnexpectedField(InvalidInput):
    """A field this call does not take."""

    code = "unexpected_field"


class ConflictingFields(InvalidInput):
    """Fields that exclude each other were given together."""

    code = "conflicting_fields"


class TooLong(InvalidInput):
    """A text above its length limit."""

    code = "too_long"


class MissingToolCallId(InvalidInput):
    """A tool turn without the `tool_call_id` it answers."""

    code = "missing_tool_call_id"


class UnknownToolCall(InvalidInput):
    """A tool turn answering a call no assistant turn issued."""

    code = "unknown_tool_call"


class DuplicateToolCallId(InvalidInput):
    """Two tool calls of one assistant turn with the same id."""

    code = "duplicate_tool_call_id"


class DuplicateToolResult(InvalidInput):
    """A tool turn answering a call id whose every call already has its result."""

    code = "duplicate_tool_result"


class InvalidSessionId(InvalidInput):
    """The session id is not 1-128 characters of letters, digits and `._:-`."""

    code = "invalid_session_id"
    # The one message of every surface that takes a session id (REST path, MCP, memory tool).
    RULE = "a session id is 1-128 characters, each a letter (A-Z, a-z), a digit or one of . _ : -"


class InvalidChunkId(InvalidInput):
    """The chunk id in the path is not a UUID."""

    code = "invalid_chunk_id"


class InvalidBuildId(InvalidInput):
    """The build id in the path is not a UUID."""

    code = "invalid_build_id"


class InvalidReceiptId(InvalidInput):
    """The receipt id in the path is too long."""

    code = "invalid_receipt_id"


class BudgetExceeded(InvalidInput):
    """The system prompt, tools and query alone do not fit the window (figures in `details`)."""

    code = "budget_exceeded"


class MisdirectedRequest(ContextdError):
    """The request's Host header names a host this server does not answer for (not in
    `CONTEXTD_ALLOWED_HOSTS`): a web page reaching it by DNS rebinding, or a misconfiguration."""

    status_code, code = 421, "misdirected_request"


class RateLimited(ContextdError):
    """Too many calls of this kind; retry later."""

    status_code, code = 429, "rate_limited"


class HttpError(ContextdError):
    """Another refusal at the HTTP level, with the status it names."""

    code = "http_error"


class InternalError(ContextdError):
    """A fault of contextd; nothing was written."""

    status_code, code = 500, "internal_error"


class ServiceUnavailable(ContextdError):
    """A store contextd depends on is unreachable; retry later."""

    status_code, code = 503, "unavailable"


def error_classes() -> list[type[ContextdError]]:
    """Every error code's class, the base first."""
    found: list[type[ContextdError]] = [ContextdError]
    for cls in found:
        found.extend(sub for sub in cls.__subclasses__() if sub not in found)
    return found


class ErrorBody(BaseModel):
    code: str = Field(
        description="stable snake_case code; one of: "
        + ", ".join(sorted({f"`{c.code}`" for c in error_classes()}))
    )
    message: str = Field(description="for people; may change")
    field: str | None = Field(None, description="the field (or header) at fault, when one is")
    details: dict[str, Any] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


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


def _loc_to_field(loc: tuple[Any, ...]) -> str | None:
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or None


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


def validation_error(error: dict[str, Any]) -> InvalidInput:
    """A pydantic validation error as contextd answers it, on every surface (REST bodies and
    parameters, MCP tool arguments)."""
    # A body-wide check (app.core.input) names the field inside the body itself.
    field = (error.get("ctx") or {}).get("field") or _loc_to_field(tuple(error.get("loc", ())))
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
    """A `ContextdError` raised while the application reads the request body (`app.core.server`):
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


# The database cannot be reached (down, restarting, connection lost, pool exhausted): a 503 the
# client may retry, not a 500.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError, SQLAlchemyTimeoutError)
# Errors PostgreSQL ends a transaction with because of another one (SQLSTATE: what happened):
# the same work may succeed when run again (`app.core.db.retrying_transaction`).
TRANSIENT_SQLSTATES = {"40P01": "deadlock detected", "40001": "serialization failure"}
# PostgreSQL reachable, but a time limit of `create_engine` ended the statement.
TIME_LIMIT_SQLSTATES = {
    "55P03": "a lock wait exceeded CONTEXTD_DB__LOCK_TIMEOUT_SECONDS",
    "57014": "a statement exceeded CONTEXTD_DB__STATEMENT_TIMEOUT_SECONDS",
}
RETRY_AFTER_CONFLICT_SECONDS = 1


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error raised through SQLAlchemy, when the driver gave one."""
    found = getattr(exc.orig, "sqlstate", None) if isinstance(exc, DBAPIError) else None
    return found if isinstance(found, str) else None


def transaction_conflict(exc: BaseException, attempts: int = 1) -> TransactionConflict | None:
    """The 409 of a deadlock or serialization failure (None for any other error)."""
    state = sqlstate(exc)
    cause = TRANSIENT_SQLSTATES.get(state or "")
    if cause is None:
        return None
    tries = f" ({attempts} attempts)" if attempts > 1 else ""
    return TransactionConflict(
        f"{cause}: a concurrent request or job held rows this one needed{tries}; nothing of "
        "the failed attempt was written, retry",
        details={"sqlstate": state, "cause": cause, "attempts": attempts},
        headers={"Retry-After": str(RETRY_AFTER_CONFLICT_SECONDS)},
    )


def install_error_handlers(app: FastAPI, retry_after_seconds: int) -> None:
    """Every refusal as the one JSON shape. An exception no handler takes is answered by
    `app.core.observability.RequestContextMiddleware` (a 500 that keeps the connection)."""

    @app.exception_handler(ContextdError)
    async def _contextd_error(_: Request, exc: ContextdError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        err = _unreadable_body(request, first, exc.body) or validation_error(first)
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc, BodyError):
            return exc.error.response()
        error: ContextdError
        if exc.status_code == 400:  # FastAPI could not decode the body: not UTF-8 JSON
            return MalformedJson("the body is not UTF-8 encoded JSON").response()
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
