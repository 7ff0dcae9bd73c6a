"""Pure rules of the memory tool: who may call which type, the parameters of each type, what
counts as a recall match. No I/O, no settings objects."""

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from app.agent.schemas import MemoryRequest, MemoryType
from app.core.errors import (
    ConflictingFields,
    Forbidden,
    InvalidInput,
    MissingField,
    UnexpectedField,
)
from app.domain.callers import Caller, Scope
from app.domain.stem import stem
from app.domain.text import match_terms, terms


@dataclass(frozen=True)
class TypeRule:
    required: tuple[str, ...] = ()  # all of these
    one_of: tuple[str, ...] = ()  # exactly one of these
    optional: tuple[str, ...] = ()
    scope: Scope | None = None  # the key scope the type needs (None: any key)
    privileged: Scope | None = None  # off unless the key has it or the tenant enables the type

    @property
    def params(self) -> tuple[str, ...]:
        return (*self.required, *self.one_of, *self.optional)


RULES: dict[MemoryType, TypeRule] = {
    MemoryType.HELP: TypeRule(),
    MemoryType.RECALL: TypeRule(
        required=("query",), optional=("top_k", "budget_tokens", "as_of"), scope=Scope.READ
    ),
    MemoryType.REMEMBER: TypeRule(
        required=("text",), optional=("tags", "key", "scope"), scope=Scope.WRITE
    ),
    MemoryType.STATUS: TypeRule(scope=Scope.READ),
    MemoryType.OFFLOAD: TypeRule(optional=("until_tokens",), privileged=Scope.MEMORY_OFFLOAD),
    MemoryType.FORGET: TypeRule(
        one_of=("chunk_id", "turn_range", "memory_id"), privileged=Scope.MEMORY_FORGET
    ),
    MemoryType.VERIFY: TypeRule(required=("memory_id",), scope=Scope.WRITE),
}


@dataclass(frozen=True)
class Enablement:
    """Privileged types switched on for every key: by the deployment or by the tenant's settings."""

    offload: bool = False
    forget: bool = False

    @classmethod
    def of(cls, deployment: "Enablement", tenant_settings: Mapping[str, Any]) -> "Enablement":
        memory = tenant_settings.get("memory") or {}
        return cls(
            offload=deployment.offload or bool(memory.get("offload")),
            forget=deployment.forget or bool(memory.get("forget")),
        )


def may_call(caller: Caller, kind: MemoryType, enabled: Enablement) -> bool:
    rule = RULES[kind]
    if rule.scope is not None and not caller.has(rule.scope):
        return False
    if rule.privileged is None or caller.has(rule.privileged):
        return True
    tenant_on = enabled.offload if kind is MemoryType.OFFLOAD else enabled.forget
    return tenant_on and caller.has(Scope.WRITE)


def allowed_types(caller: Caller, enabled: Enablement) -> list[MemoryType]:
    return [kind for kind in MemoryType if may_call(caller, kind, enabled)]


def check_allowed(caller: Caller, kind: MemoryType, enabled: Enablement) -> None:
    if may_call(caller, kind, enabled):
        return
    rule = RULES[kind]
    if rule.privileged is not None and not caller.has(rule.privileged):
        raise Forbidden(
            f"memory type {kind.value!r} is off for this API key: it needs the scope "
            f"{rule.privileged.value!r} (or the tenant setting memory.{kind.value}=true)",
            field="type",
        )
    assert rule.scope is not None
    raise Forbidden(
        f"memory type {kind.value!r} needs the scope {rule.scope.value!r}", field="type"
    )


def check_params(request: MemoryRequest) -> None:
    """422 naming the field: a required parameter missing, or one the type does not take."""
    rule = RULES[request.type]
    given = {name for name in MemoryRequest.model_fields if name != "type"}
    given = {name for name in given if getattr(request, name) is not None}
    for name in rule.required:
        if name not in given:
            _missing(request.type, name)
    if rule.one_of:
        chosen = given & set(rule.one_of)
        if len(chosen) != 1:
            error = ConflictingFields if chosen else MissingField
            raise error(
                f"{request.type.value} takes exactly one of {', '.join(rule.one_of)}",
                field=rule.one_of[0] if not chosen else sorted(chosen)[1],
            )
    for name in sorted(given - set(rule.params)):
        raise UnexpectedField(
            f"{name!r} is not a parameter of type {request.type.value!r} "
            f"(it takes: {', '.join(rule.params) or 'nothing'})",
            field=name,
        )
    if request.turn_range is not None:
        first, last = request.turn_range
        if first < 1 or last < first:
            raise InvalidInput(
                "turn_range is [first, last] with 1 <= first <= last", field="turn_range"
            )


def _missing(kind: MemoryType, name: str) -> None:
    raise MissingField(f"type {kind.value!r} needs the parameter {name!r}", field=name)


# A hit found by the vector arm alone matches when its cosine similarity stands this far above the
# median of the arm's candidates. e5 (multilingual-e5-small) gives every pair of texts 0.70-0.83,
# so an absolute threshold cannot tell an answer from small talk, but a fact asked for in the
# other language stands out (measured on 20 chunks of facts and small talk): "What is the hotel
# budget per night?" vs the chunk with 酒店每晚预算不超过900元 +0.042, 酒店每晚的预算是多少？ vs the
# English one +0.054, "Which airline should I avoid?" +0.053; questions about nothing there
# ("What is the capital of Peru?", "How do I bake bread?", 秘鲁的首都是哪里？) +0.008 to +0.013.
VECTOR_MATCH_MARGIN = 0.03


def is_match(
    query_terms: Collection[str],
    text: str,
    *,
    exact_hit: bool,
    vector_margin: float | None = None,
) -> bool:
    """A hit is a match when the exact arm found it (ID / quoted string verbatim), it shares a
    word (by stem) or a CJK bigram with the query, or its vector similarity stands out from the
    median of the other candidates' by `VECTOR_MATCH_MARGIN` (a question in one language, the
    fact in another).
    Being someone's nearest neighbour is not enough: the nearest neighbour of an unrelated
    question is still someone's nearest neighbour, and "no match" is better than an invitation
    to invent."""
    if exact_hit or (vector_margin is not None and vector_margin >= VECTOR_MATCH_MARGIN):
        return True
    wanted = match_terms(query_terms)
    # Compared by stem, as the lexical arm ranks them ("dancing" matches "danced").
    return bool({stem(t) for t in wanted} & {stem(t) for t in terms(text)})
