"""The `CallerDep` alias: every endpoint that touches tenant data depends on it."""

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth import service
from app.auth.schemas import Caller
from app.core.deps import ContextDep, DbDep

# auto_error=False: our own 401 body, not FastAPI's 403; the scheme still appears in OpenAPI.
bearer_scheme = HTTPBearer(auto_error=False, description="API key from `contextd keys create`")


async def get_caller(
    request: Request,
    db: DbDep,
    context: ContextDep,
    _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Caller:
    settings = context.settings
    if settings.auth_disabled:
        cached: Caller | None = getattr(request.app.state, "dev_caller", None)
        if cached is None:
            cached = await service.dev_caller(db)
            request.app.state.dev_caller = cached
        caller = cached
    else:
        caller = await service.authenticate(db, request.headers.get("Authorization"))
    request.state.tenant = caller.tenant_name  # for the access log line
    await service.check_rate(context.rate_limiter, caller, settings.limits)
    return caller


CallerDep = Annotated[Caller, Depends(get_caller)]
