"""One error hierarchy and one JSON shape, `{"error": {"code", "message", "field"}}`, for all.

Every error code is a class here (its docstring is what the code means), so the OpenAPI document
lists each code an endpoint can answer (`error_responses`), and no code is made up at a raise.
"""

import logging
from collections import defaultdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("contextd.errors")


class ContextdError(Exception):
    """A request contextd refuses."""

    status_code: int = 400
    code: str = "bad_request"

    def __init__(
        self, message: str, *, field: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.details = details

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


class Conflict(ContextdError):
    """The request conflicts with an earlier one (an Idempotency-Key reused for another body,
    a concurrent change): nothing was written."""

    status_code, code = 409, "conflict"


class PayloadTooLarge(ContextdError):
    """A turn or a batch above the configured limits."""

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


class InvalidSessionId(InvalidInput):
    """The session id in the path is not 1-128 characters of letters, digits and `._:-`."""

    code = "invalid_session_id"


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
)


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


def _validation_error_class(error: dict[str, Any]) -> type[InvalidInput]:
    kind = str(error.get("type", ""))
    loc = tuple(error.get("loc", ()))
    if len(loc) == 2 and loc[0] == "path" and loc[1] in PATH_PARAMETER_ERRORS:
        return PATH_PARAMETER_ERRORS[loc[1]]
    if kind == "json_invalid":
        return MalformedJson
    if kind == "missing":
        return MissingField
    if kind in ("literal_error", "enum"):
        return InvalidValue
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return WrongType
    return InvalidInput


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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ContextdError)
    async def _contextd_error(_: Request, exc: ContextdError) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content=exc.body())

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        err = _unreadable_body(request, first, exc.body) or _validation_error_class(first)(
            str(first.get("msg", "invalid request")),
            field=_loc_to_field(tuple(first.get("loc", ()))),
        )
        return JSONResponse(status_code=err.status_code, content=err.body())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error: ContextdError
        if exc.status_code == 404:
            error = NotFound(str(exc.detail))
        elif exc.status_code == 405:
            error = MethodNotAllowed(str(exc.detail))
        else:
            error = HttpError(str(exc.detail))
        # The status is Starlette's (e.g. 405 with its `Allow` header), the body ours.
        return JSONResponse(status_code=exc.status_code, content=error.body(), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        return JSONResponse(status_code=500, content=InternalError("internal error").body())
