"""API keys: created once and shown once, stored as a SHA-256 hash, each bound to one tenant.

Keys carry 256 bits of randomness, so a fast hash is enough (no password stretching needed).
"""

import base64
import hashlib
import hmac
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from app.core.config import Limits
from app.core.errors import Forbidden, InvalidInput, NotFound, Unauthorized
from app.core.ratelimit import RateLimiter, rate_limited
from app.domain.callers import ALL_SCOPES, Caller, Scope
from app.store import keys as keys_store
from app.store.models import ApiKey, Tenant

KEY_PREFIX = "ctxd_"
DEV_TENANT = "default"
TENANT_NAME_MAX_CHARS = 128  # tenants.name


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


def check_tenant_name(name: str) -> str:
    """A tenant's name as an operator types it: not empty, not padded (" acme" would be a second
    tenant beside "acme"), printable, at most `TENANT_NAME_MAX_CHARS`."""
    if not name or name != name.strip() or not name.isprintable():
        raise InvalidInput(
            f"tenant name {name!r} must be printable, not empty, without spaces around it",
            field="tenant",
        )
    if len(name) > TENANT_NAME_MAX_CHARS:
        raise InvalidInput(
            f"tenant name is {len(name)} characters; at most {TENANT_NAME_MAX_CHARS}",
            field="tenant",
        )
    return name


async def create_key(db: AsyncSession, tenant_name: str, scopes: Iterable[str]) -> tuple[str, str]:
    """Create a key for `tenant_name` (creating the tenant if new). Returns (key, key id)."""
    tenant = await keys_store.get_or_create_tenant(db, check_tenant_name(tenant_name))
    secret = secrets.token_urlsafe(32)
    key = f"{KEY_PREFIX}{secret}"
    row = await keys_store.add_key(
        db, tenant.id, key[: len(KEY_PREFIX) + 6], hash_key(key), parse_scopes(scopes)
    )
    return key, str(row.id)


@dataclass(frozen=True)
class KeyRecord:
    """What an operator sees of a key: never the key itself, only its first characters."""

    key_id: str
    tenant: str
    prefix: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None


def _record(key: ApiKey, tenant: Tenant) -> KeyRecord:
    return KeyRecord(
        str(key.id), tenant.name, key.key_prefix, list(key.scopes), key.created_at, key.revoked_at
    )


async def list_keys(db: AsyncSession, tenant_name: str | None = None) -> list[KeyRecord]:
    """Every key, or `tenant_name`'s (a name no key was ever created for is a NotFound: a typo
    should not look like a tenant without keys)."""
    found = await keys_store.list_keys(db, tenant_name)
    if tenant_name is not None and not found:
        raise NotFound(f"no tenant named {tenant_name!r}", field="tenant")
    return [_record(key, tenant) for key, tenant in found]


async def revoke_key(db: AsyncSession, key_id: str) -> KeyRecord:
    """Revoke a key: from the next request on it is a 401 (every request reads the key)."""
    try:
        key_uuid = uuid.UUID(key_id)
    except ValueError:
        raise InvalidInput(f"{key_id!r} is not a key id", field="key_id") from None
    found = await keys_store.revoke_key(db, key_uuid)
    if found is None:
        raise NotFound(f"no key with id {key_id}", field="key_id")
    return _record(*found)


async def authenticate(db: AsyncSession, authorization: str | None) -> Caller:
    if not authorization:
        raise Unauthorized("missing Authorization: Bearer <key> header", field="Authorization")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <key>'", field="Authorization")
    found = await keys_store.find_active_key(db, hash_key(token.strip()))
    if found is None:
        raise Unauthorized("invalid or revoked API key", field="Authorization")
    key, tenant = found
    return Caller(tenant.id, tenant.name, frozenset(key.scopes), key.id)


def signed_token(key: str, key_id: str, expires_at: int) -> str:
    """A token standing for `key` until `expires_at` (Unix seconds) that does not hold it: the
    key's id, the expiry and an HMAC of both keyed with the key's stored hash, which only the
    server and the key's holder can compute. Revoking the key ends every token of it."""
    return f"{key_id}.{expires_at}.{_token_mac(hash_key(key), key_id, expires_at)}"


def _token_mac(key_hash: str, key_id: str, expires_at: int) -> str:
    mac = hmac.new(key_hash.encode(), f"{key_id}.{expires_at}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


async def authenticate_signed_token(db: AsyncSession, token: str, now: float) -> Caller:
    """The caller a `signed_token` stands for, while it is unexpired and its key active."""
    key_id, _, rest = token.partition(".")
    expires, _, mac = rest.partition(".")
    try:
        key_uuid = uuid.UUID(key_id)
        expires_at = int(expires)
    except ValueError:
        raise Unauthorized("invalid sign-in; sign in again", field="Cookie") from None
    if expires_at <= now:
        raise Unauthorized("the sign-in has expired; sign in again", field="Cookie")
    found = await keys_store.find_active_key_by_id(db, key_uuid)
    expected = _token_mac(found[0].key_hash, key_id, expires_at) if found else ""
    if found is None or not hmac.compare_digest(expected.encode(), mac.encode()):
        raise Unauthorized("invalid or revoked API key", field="Cookie")
    key, tenant = found
    return Caller(tenant.id, tenant.name, frozenset(key.scopes), key.id)


async def dev_caller(db: AsyncSession) -> Caller:
    """The caller when auth is disabled: the `default` tenant with every scope."""
    tenant = await keys_store.get_or_create_tenant(db, DEV_TENANT)
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
        raise rate_limited("requests with this API key", limit, "Authorization")
