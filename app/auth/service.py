"""API keys: created once and shown once, stored as a SHA-256 hash, each bound to one tenant.

Keys carry 256 bits of randomness, so a fast hash is enough (no password stretching needed).
"""

import hashlib
import secrets
from collections.abc import Iterable

from sqlalchemy.ext.asyncio import AsyncSession

from app.auth import repository
from app.auth.schemas import ALL_SCOPES, Caller, Scope
from app.core.config import Limits
from app.core.errors import Forbidden, InvalidInput, Unauthorized
from app.core.ratelimit import RateLimiter, rate_limited

KEY_PREFIX = "ctxd_"
DEV_TENANT = "default"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_scopes(names: Iterable[str]) -> list[str]:
    valid = {s.value for s in ALL_SCOPES}
    out = []
    for name in names:
        if name not in valid:
            raise InvalidInput(f"unknown scope {name!r}; known: {sorted(valid)}", field="scope")
        out.append(name)
    return sorted(set(out))


async def create_key(db: AsyncSession, tenant_name: str, scopes: Iterable[str]) -> tuple[str, str]:
    """Create a key for `tenant_name` (creating the tenant if new). Returns (key, key id)."""
    tenant = await repository.get_or_create_tenant(db, tenant_name)
    secret = secrets.token_urlsafe(32)
    key = f"{KEY_PREFIX}{secret}"
    row = await repository.add_key(
        db, tenant.id, key[: len(KEY_PREFIX) + 6], hash_key(key), parse_scopes(scopes)
    )
    return key, str(row.id)


async def authenticate(db: AsyncSession, authorization: str | None) -> Caller:
    if not authorization:
        raise Unauthorized("missing Authorization: Bearer <key> header", field="Authorization")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <key>'", field="Authorization")
    found = await repository.find_active_key(db, hash_key(token.strip()))
    if found is None:
        raise Unauthorized("invalid or revoked API key", field="Authorization")
    key, tenant = found
    return Caller(tenant.id, tenant.name, frozenset(key.scopes), key.id)


async def dev_caller(db: AsyncSession) -> Caller:
    """The caller when auth is disabled: the `default` tenant with every scope."""
    tenant = await repository.get_or_create_tenant(db, DEV_TENANT)
    return Caller(tenant.id, tenant.name, frozenset(s.value for s in Scope), None)


def require_scope(caller: Caller, scope: Scope) -> None:
    if not caller.has(scope):
        raise Forbidden(f"this API key lacks the scope {scope.value!r}", field="scope")


async def check_rate(limiter: RateLimiter, caller: Caller, limits: Limits) -> None:
    """429 once the caller's key (the tenant's, with auth disabled) passes its per-minute limit."""
    limit = limits.requests_per_minute_per_key
    if not limit:
        return
    count = await limiter.hit(f"key:{caller.key_id or caller.tenant_id}")
    if count > limit:
        raise rate_limited("this API key's requests", limit, "Authorization")
