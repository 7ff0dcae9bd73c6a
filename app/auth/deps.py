"""Who may call an endpoint, said in its signature: every endpoint that touches tenant data takes
one of the caller aliases below, which authenticate the key and check its scope.

- `ReadCaller`: the key has `sessions:read`.
- `WriteCaller`: the key has `sessions:write`.
- `ToolCaller`: any valid key; the memory tool checks each call's type against its own rules
  (`app.agent.policy.RULES`), since what a call may do depends on its body.
"""

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth import service
from app.core.context import AppContext
from app.core.db import unit_of_work
from app.domain.callers import Caller, Scope
from app.http.deps import ContextDep, DbDep

# auto_error=False: our own 401 body, not FastAPI's 403; the scheme still appears in OpenAPI.
bearer_scheme = HTTPBearer(auto_error=False, description="API key from `contextd keys create`")


async def get_caller(
    request: Request,
    db: DbDep,
    context: ContextDep,
    _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Caller:
    """The caller, its request counted against its per-minute limit (429 above it)."""
    caller = await identify_caller(request, db, context)
    await service.check_rate(context.rate_limiter, caller, context.settings.limits)
    return caller


async def identify_caller(request: Request, db: AsyncSession, context: AppContext) -> Caller:
    """The caller of `request` (its API key; the dev tenant with auth disabled), its request not
    counted yet: `get_caller` counts it at once, build-prompt while it reads the session."""
    if context.settings.auth_disabled:
        cached: Caller | None = getattr(request.app.state, "dev_caller", None)
        if cached is None:
            # Its own committed transaction: the request's may roll back (a 404, a read that
            # never commits), and a cached caller must not name a tenant that was never stored.
            async with unit_of_work(context.sessionmaker) as own:
                cached = await service.dev_caller(own)
            request.app.state.dev_caller = cached
        caller = cached
    else:
        caller = await service.authenticate(db, request.headers.get("Authorization"))
    request.state.tenant = caller.tenant_name  # for the access log line
    return caller


def _with_scope(scope: Scope) -> Callable[[Caller], Awaitable[Caller]]:
    async def caller_with_scope(caller: Annotated[Caller, Depends(get_caller)]) -> Caller:
        service.require_scope(caller, scope)
        return caller

    caller_with_scope.__name__ = f"caller_with_{scope.name.lower()}"
    return caller_with_scope


ReadCaller = Annotated[Caller, Depends(_with_scope(Scope.READ))]
WriteCaller = Annotated[Caller, Depends(_with_scope(Scope.WRITE))]
ToolCaller = Annotated[Caller, Depends(get_caller)]
