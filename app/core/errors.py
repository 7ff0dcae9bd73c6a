"""One error hierarchy and one JSON shape, `{"error": {"code", "message", "field"}}`, for all."""

import logging
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from app.core.server import BodyError

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


class RequestTimeout(ContextdError):  # documents app.core.server's 408
    status_code, code = 408, "request_timeout"


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


COMMON_ERRORS = error_responses(
    Unauthorized, Forbidden, NotFound, InvalidInput, RateLimited, ServiceUnavailable
)


@dataclass(frozen=True)
class Rule:
    """A 4xx a request can get although its JSON matches the schema: a rule across fields, or
    one on stored state or configured limits, which JSON Schema cannot state."""

    status: int
    code: str
    rule: str


def with_rules(description: str, *rules: Rule) -> dict[str, Any]:
    """`description` and `openapi_extra` of an operation that enforces `rules`: listed for
    readers in the description and, machine-readable, as `x-rules` (the API tests accept a
    schema-valid request's 4xx only when its code is listed there)."""
    listed = "\n".join(f"- {r.status} `{r.code}`: {r.rule}" for r in rules)
    return {
        "description": f"{description}\n\nRules beyond the schema:\n{listed}",
        "openapi_extra": {"x-rules": [asdict(r) for r in rules]},
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


def _validation_code(error: dict[str, Any]) -> str:
    kind = str(error.get("type", ""))
    loc = tuple(error.get("loc", ()))
    if len(loc) == 2 and loc[0] == "path":
        return f"invalid_{loc[1]}"  # e.g. invalid_session_id
    if kind in ("invalid_text", "too_deep"):  # app.core.input
        return kind
    if kind == "json_invalid":
        return "malformed_json"
    if kind == "missing":
        return "missing_field"
    if kind in ("literal_error", "enum"):
        return "invalid_value"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return "wrong_type"
    return "invalid_input"


def error_json(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(code=code, message=message))
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


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


def install_error_handlers(app: FastAPI, retry_after_seconds: int) -> None:
    @app.exception_handler(ContextdError)
    async def _contextd_error(_: Request, exc: ContextdError) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content=exc.body(), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        # A body-wide check (app.core.input) names the field inside the body itself.
        field = (first.get("ctx") or {}).get("field") or _loc_to_field(tuple(first.get("loc", ())))
        err = InvalidInput(str(first.get("msg", "invalid request")), field=field)
        err.code = _validation_code(first)
        return JSONResponse(status_code=422, content=err.body())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc, BodyError):
            return error_json(exc.status_code, exc.code, exc.detail, exc.headers)
        if exc.status_code == 400:  # FastAPI could not decode the body: not UTF-8 JSON
            return error_json(422, "malformed_json", "the body is not UTF-8 encoded JSON")
        if exc.status_code == 405:
            allow = ", ".join(allowed_methods(request.app, request.scope))
            return error_json(405, "method_not_allowed", str(exc.detail), {"Allow": allow})
        code = {404: "not_found"}.get(exc.status_code, "http_error")
        return error_json(exc.status_code, code, str(exc.detail), exc.headers)

    async def _database_unavailable(_: Request, exc: Exception) -> JSONResponse:
        logger.warning("database unavailable: %s", type(exc).__name__)
        return error_json(
            503,
            "unavailable",
            "the database cannot be reached; retry later",
            {"Retry-After": str(retry_after_seconds)},
        )

    for kind in DATABASE_UNAVAILABLE:
        app.add_exception_handler(kind, _database_unavailable)
