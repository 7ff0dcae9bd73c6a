"""One error hierarchy and one JSON shape, `{"error": {"code", "message", "field"}}`, for all.

Every error code is a class here (its docstring is what the code means), so the OpenAPI document
lists each code an endpoint can answer (`error_responses`), and no code is made up at a raise.
"""

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError


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
    """JSON nested deeper than the limit (`app.http.input.MAX_JSON_DEPTH` levels)."""

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
