"""One error hierarchy and one JSON shape, `{"error": {"code", "message", "field"}}`, for all."""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("contextd.errors")


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None
    details: dict[str, Any] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class ContextdError(Exception):
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
    status_code, code = 400, "bad_request"


class Unauthorized(ContextdError):
    status_code, code = 401, "unauthorized"


class Forbidden(ContextdError):
    status_code, code = 403, "forbidden"


class NotFound(ContextdError):
    status_code, code = 404, "not_found"


class Conflict(ContextdError):
    status_code, code = 409, "conflict"


class PayloadTooLarge(ContextdError):
    status_code, code = 413, "payload_too_large"


class InvalidInput(ContextdError):
    status_code, code = 422, "invalid_input"


class BudgetExceeded(ContextdError):
    status_code, code = 422, "budget_exceeded"


class RateLimited(ContextdError):
    status_code, code = 429, "rate_limited"


class ServiceUnavailable(ContextdError):
    status_code, code = 503, "unavailable"


def error_responses(*errors: type[ContextdError]) -> dict[int | str, dict[str, Any]]:
    """`responses=` entry for an endpoint: documents each error status with the one error model."""
    out: dict[int | str, dict[str, Any]] = {}
    for err in errors:
        out.setdefault(err.status_code, {"model": ErrorResponse, "description": err.code})
    return out


COMMON_ERRORS = error_responses(Unauthorized, Forbidden, NotFound, InvalidInput)


def _loc_to_field(loc: tuple[Any, ...]) -> str | None:
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or None


def _validation_code(error: dict[str, Any]) -> str:
    kind = str(error.get("type", ""))
    loc = tuple(error.get("loc", ()))
    if len(loc) == 2 and loc[0] == "path":
        return f"invalid_{loc[1]}"  # e.g. invalid_session_id
    if kind == "json_invalid":
        return "malformed_json"
    if kind == "missing":
        return "missing_field"
    if kind in ("literal_error", "enum"):
        return "invalid_value"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return "wrong_type"
    return "invalid_input"


def _unreadable_body(
    request: Request, error: dict[str, Any], body: Any
) -> tuple[int, ErrorResponse] | None:
    """A body that is not JSON at all: say why and where, instead of a type error or a character
    offset posing as a field name. None for every other validation error."""
    if error.get("type") == "json_invalid" and isinstance(body, str):
        pos = int(error["loc"][-1])
        line = body.count("\n", 0, pos) + 1
        column = pos - (body.rfind("\n", 0, pos) + 1) + 1
        reason = (error.get("ctx") or {}).get("error", "invalid JSON")
        message = f"malformed JSON at line {line}, column {column} (character {pos}): {reason}"
        return 422, ErrorResponse(
            error=ErrorBody(code="malformed_json", message=message, field="body")
        )
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    is_json = content_type == "application/json" or content_type.endswith("+json")
    if tuple(error.get("loc", ())) == ("body",) and isinstance(body, bytes) and not is_json:
        sent = f"as {content_type!r}" if content_type else "without a Content-Type header"
        message = f"the body was sent {sent}; send JSON with 'Content-Type: application/json'"
        return 415, ErrorResponse(
            error=ErrorBody(code="unsupported_media_type", message=message, field="Content-Type")
        )
    return None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ContextdError)
    async def _contextd_error(_: Request, exc: ContextdError) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content=exc.body())

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        unreadable = _unreadable_body(request, first, exc.body)
        if unreadable is not None:
            status, body = unreadable
            return JSONResponse(status_code=status, content=body.model_dump(exclude_none=True))
        err = InvalidInput(
            str(first.get("msg", "invalid request")),
            field=_loc_to_field(tuple(first.get("loc", ()))),
        )
        err.code = _validation_code(first)
        return JSONResponse(status_code=422, content=err.body())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        body = ErrorResponse(error=ErrorBody(code=code, message=str(exc.detail)))
        return JSONResponse(status_code=exc.status_code, content=body.model_dump(exclude_none=True))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        body = ErrorResponse(error=ErrorBody(code="internal_error", message="internal error"))
        return JSONResponse(status_code=500, content=body.model_dump(exclude_none=True))
