"""Wire shapes of the remembered items, and what a request to remember one must carry."""

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Literal, Protocol

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field

from app.http.input import BIGINT_MAX, RequestBody
from app.memories.tiers import Evidence, last_seen, shown_tier
from app.store.models import Memory, MemoryVersion, Session

Source = Literal[
    "remember",
    "api",
    "user_turn",
    "assistant_turn",
    "tool_result",
    "notes_rule",
    "inference",
    "retrieved",
]
TTL_MAX_SECONDS = 10 * 365 * 24 * 3600


_RFC3339_RE = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def _rfc3339(value: object) -> object:
    """Only a date-time string as its schema says (pydantic alone also takes 0.5 as a Unix
    time)."""
    if isinstance(value, str) and not _RFC3339_RE.fullmatch(value):
        raise ValueError("a date and time with its time zone (RFC 3339)")
    if not isinstance(value, str | datetime):
        raise ValueError("a date and time with its time zone (RFC 3339), as a string")
    return value


def _in_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:  # 0001-01-01T00:00+01:00 is before the year 1 in UTC
        raise ValueError("a moment of the years 1 to 9999 in UTC") from exc


# Who an API call speaks for: the key's own application, or the user it relays (a user who
# confirms an item in the application's interface verifies it as "user").
ApiActor = Literal["api_key", "user"]
ACTOR_DESCRIPTION = "who the change comes from, recorded in its version: api_key, or user"

# A moment with its time zone, held in UTC.
Moment = Annotated[AwareDatetime, BeforeValidator(_rfc3339), AfterValidator(_in_utc)]


class RememberRequest(Protocol):
    """What `remember` reads of a request: the memory tool's call satisfies it."""

    @property
    def text(self) -> str | None: ...
    @property
    def tags(self) -> list[str] | None: ...
    @property
    def key(self) -> str | None: ...
    @property
    def scope(self) -> Literal["session", "user"] | None: ...


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a new item comes from and who writes it, with when it holds."""

    source: str
    actor: str  # user, agent, api_key, rule
    key_id: uuid.UUID | None
    source_tool: str | None = None
    turn_seqs: tuple[int, ...] = ()
    valid_from: datetime | None = None
    valid_until: datetime | None = None
    ttl_seconds: int | None = None
    # The text repeats a source (`source_tool`, `turn_seqs`) that gives orders to the model: the
    # item is quarantined although its own words may read as a plain fact.
    echoes_orders: bool = False


class MemoryIn(RequestBody):
    """A remembered item written through the API, with where its text came from."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "text": "The 9:40 to Lyon is fully booked on Fridays.",
                    "scope": "session",
                    "source": "tool_result",
                    "source_tool": "train_search",
                    "turn_seqs": [14],
                    "valid_until": "2026-12-11T00:00:00Z",
                }
            ]
        },
    )
    text: str = Field(min_length=1)
    tags: list[str] | None = Field(None, max_length=32)
    key: str | None = Field(None, min_length=1, max_length=128)
    scope: Literal["session", "user"] | None = None
    source: Source = Field(
        "api",
        description="where the text came from; remember, api and user_turn are trusted (the "
        "item is active at once), the others are untrusted (a candidate until verified)",
    )
    source_tool: str | None = Field(
        None, min_length=1, max_length=128, description="the tool whose result it was"
    )
    turn_seqs: list[Annotated[int, Field(ge=1, le=BIGINT_MAX)]] = Field(
        default_factory=list, max_length=100, description="the turns it was read in"
    )
    valid_from: Moment | None = Field(None, description="when it starts to hold")
    valid_until: Moment | None = Field(None, description="when it stops holding")
    ttl_seconds: int | None = Field(
        None, ge=1, le=TTL_MAX_SECONDS, description="it leaves the prompt this long after"
    )
    actor: ApiActor = Field("api_key", description=ACTOR_DESCRIPTION)


class MemoryPatch(RequestBody):
    """A change to a remembered item: its text, its status, when it holds. Each is a new
    revision; with `expected_revision` the change applies only to that revision (else 409)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"expected_revision": 1, "status": "verified"}]},
    )
    expected_revision: int | None = Field(
        None, ge=1, description="the `revision` you read; 409 when the item has moved on"
    )
    text: str | None = Field(None, min_length=1)
    status: Literal["verified", "quarantined"] | None = Field(
        None,
        description="verified: a candidate or quarantined item becomes a fact; quarantined: "
        "a live item leaves the prompt until verified",
    )
    valid_from: Moment | None = None
    valid_until: Moment | None = None
    ttl_seconds: int | None = Field(None, ge=1, le=TTL_MAX_SECONDS)
    reason: str | None = Field(None, max_length=500, description="why, kept in the version")
    actor: ApiActor = Field("api_key", description=ACTOR_DESCRIPTION)


class MemoryOut(BaseModel):
    memory_id: str
    text: str
    tags: list[str]
    key: str | None
    scope: Literal["session", "user"]
    source: str = Field(description="where the text came from")
    source_tool: str | None
    turn_seqs: list[int]
    actor: str = Field(description="who wrote it: user, agent, api_key or rule")
    trusted: bool
    status: str = Field(
        description="candidate, quarantined, verified, active, superseded, tombstoned or erased"
    )
    in_force: bool = Field(
        description="stated as a fact in prompts now: verified or active, and valid"
    )
    revision: int = Field(description="its lifecycle version (`GET .../versions`)")
    version: int = Field(description="the value's version along its `key`")
    supersedes: str | None
    valid_from: datetime | None
    valid_until: datetime | None
    expires_at: datetime | None
    session_id: str | None  # the session that wrote it (None once that session is deleted)
    embedded: bool = Field(description="false until the worker has embedded the item")
    tier: Literal["session", "candidate", "long_term"] | None = Field(
        description="a user-scope item's tier for this session: session (said in this session "
        "only), candidate (seen once), long_term (promoted by evidence); null for session scope"
    )
    stability: float | None = Field(
        description="0.25 (seen once) to 1.0: how settled a user-scope item is (`stable_by`)"
    )
    stable_by: list[Literal["sessions", "time", "contexts", "confirmed"]] = Field(
        description="the evidence beyond the first sighting: said again in another session, "
        "seen again days later, said and written down, confirmed by the user"
    )
    last_seen_at: datetime | None = Field(
        description="the last time a user-scope item was said, written down or confirmed (its "
        "weight in ranking falls after `memory.decay_days` without new evidence)"
    )
    created_at: datetime

    @classmethod
    def of(
        cls,
        memory: Memory,
        session: Session,
        in_force: bool,
        then: MemoryVersion | None = None,
    ) -> "MemoryOut":
        """`memory` as listed for `session`: its session id only if `session` wrote it; with
        `then`, as that version of it was."""
        state = then or memory
        evidence = [Evidence.of_json(e) for e in memory.evidence]
        return cls(
            memory_id=str(memory.id),
            text=(then.text or "") if then is not None else memory.text,
            tags=list(memory.tags),
            key=memory.key,
            scope=memory.scope,
            source=memory.source,
            source_tool=memory.source_tool,
            turn_seqs=list(memory.turn_seqs),
            actor=memory.actor,
            trusted=state.trusted,
            status=state.status,
            in_force=in_force,
            revision=state.revision,
            version=memory.version,
            supersedes=str(memory.supersedes) if memory.supersedes else None,
            valid_from=state.valid_from,
            valid_until=state.valid_until,
            expires_at=state.expires_at,
            session_id=session.external_id if memory.session_id == session.id else None,
            embedded=memory.embedding_model is not None,
            tier=shown_tier(memory.tier, evidence, str(session.id)),
            stability=memory.stability,
            stable_by=list(memory.stable_by),
            last_seen_at=last_seen(evidence, memory.created_at) if memory.tier else None,
            created_at=memory.created_at,
        )


class MemoryWritten(BaseModel):
    outcome: Literal["stored", "superseded", "candidate", "duplicate"] = Field(
        description="stored; superseded (it replaced its key's value); candidate (untrusted: "
        "not a fact until verified); duplicate (an item in force says it already, returned)"
    )
    memory: MemoryOut


class MemoryList(BaseModel):
    memories: list[MemoryOut]
    next_cursor: str | None


class MemoryVersionOut(BaseModel):
    revision: int
    status: str
    text: str | None = Field(description="null once redacted or erased")
    content_hash: str | None = Field(description="sha256 of the text, hex; null once erased")
    trusted: bool
    actor: str
    actor_key_id: str | None
    reason: str
    valid_from: datetime | None
    valid_until: datetime | None
    expires_at: datetime | None
    redacted_at: datetime | None
    created_at: datetime

    @classmethod
    def of(cls, version: MemoryVersion) -> "MemoryVersionOut":
        return cls(
            revision=version.revision,
            status=version.status,
            text=version.text,
            content_hash=version.content_hash,
            trusted=version.trusted,
            actor=version.actor,
            actor_key_id=str(version.actor_key_id) if version.actor_key_id else None,
            reason=version.reason,
            valid_from=version.valid_from,
            valid_until=version.valid_until,
            expires_at=version.expires_at,
            redacted_at=version.redacted_at,
            created_at=version.created_at,
        )


class MemoryVersionList(BaseModel):
    memory_id: str
    versions: list[MemoryVersionOut]
