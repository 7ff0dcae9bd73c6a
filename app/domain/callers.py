"""Who is calling: the tenant and scopes resolved from an API key."""

import uuid
from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    READ = "sessions:read"
    WRITE = "sessions:write"
    MEMORY_OFFLOAD = "memory:offload"
    MEMORY_FORGET = "memory:forget"


DEFAULT_SCOPES: tuple[Scope, ...] = (Scope.READ, Scope.WRITE)
ALL_SCOPES: tuple[Scope, ...] = tuple(Scope)


@dataclass(frozen=True, slots=True)
class Caller:
    tenant_id: uuid.UUID
    tenant_name: str
    scopes: frozenset[str]
    key_id: uuid.UUID | None  # None when auth is disabled

    def has(self, scope: Scope) -> bool:
        return scope.value in self.scopes
