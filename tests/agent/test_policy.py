"""Pure rules of the memory tool: parameters per type, who may call what, matches."""

import uuid

import pytest

from app.agent.definition import parameters_schema
from app.agent.policy import (
    RULES,
    Enablement,
    allowed_types,
    check_allowed,
    check_params,
    is_match,
)
from app.agent.schemas import MemoryRequest, MemoryType
from app.core.errors import Forbidden, InvalidInput
from app.domain.callers import Caller, Scope
from app.domain.text import terms


def caller(*scopes: Scope) -> Caller:
    return Caller(uuid.uuid4(), "t", frozenset(s.value for s in scopes), None)


def test_privileged_types_need_their_scope_or_the_tenant_switch() -> None:
    plain = caller(Scope.READ, Scope.WRITE)
    off = Enablement()
    assert allowed_types(plain, off) == [
        MemoryType.HELP,
        MemoryType.RECALL,
        MemoryType.REMEMBER,
        MemoryType.STATUS,
        MemoryType.VERIFY,  # sessions:write: the agent confirms what it was told
    ]
    with pytest.raises(Forbidden, match="memory:forget"):
        check_allowed(plain, MemoryType.FORGET, off)
    tenant_on = Enablement.of(off, {"memory": {"forget": True}})
    assert MemoryType.FORGET in allowed_types(plain, tenant_on)
    assert MemoryType.OFFLOAD not in allowed_types(plain, tenant_on)
    forget_only = caller(Scope.READ, Scope.MEMORY_FORGET)
    assert allowed_types(forget_only, off) == [
        MemoryType.HELP,
        MemoryType.RECALL,
        MemoryType.STATUS,
        MemoryType.FORGET,
    ]
    enum = parameters_schema(allowed_types(forget_only, off))["properties"]["type"]["enum"]
    assert enum == ["help", "recall", "status", "forget"]


def test_the_definition_offers_every_parameter_help_lists() -> None:
    """The function schema is closed (`additionalProperties: false`): a parameter `help` names
    but the schema leaves out is one a model with strict function calling can never send."""
    every = list(MemoryType)
    schema = parameters_schema(every)
    offered = set(schema["properties"]) - {"type"}
    assert schema["additionalProperties"] is False
    assert offered == {p for kind in every for p in RULES[kind].params}
    assert offered == set(MemoryRequest.model_fields) - {"type"}
    for kind in every:
        for name in RULES[kind].params:
            assert schema["properties"][name]["description"].split(":")[0].count(kind.value), (
                kind,
                name,
            )


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"type": "recall"}, "query", "missing_field"),
        ({"type": "remember", "tags": ["x"]}, "text", "missing_field"),
        ({"type": "forget"}, "chunk_id", "missing_field"),
        ({"type": "forget", "chunk_id": "a", "memory_id": "b"}, "memory_id", "conflicting_fields"),
        ({"type": "status", "query": "x"}, "query", "unexpected_field"),
        ({"type": "forget", "turn_range": [5, 2]}, "turn_range", "invalid_input"),
    ],
)
def test_parameters_are_checked_per_type(body: dict, field: str, code: str) -> None:
    with pytest.raises(InvalidInput) as err:
        check_params(MemoryRequest.model_validate(body))
    assert (err.value.field, err.value.code) == (field, code)


def test_a_match_needs_a_shared_word_or_bigram_or_an_exact_hit() -> None:
    query = terms("what was the Lyon budget")
    assert is_match(query, "Budget at most 120 EUR for Lyon.", exact_hit=False)
    assert not is_match(query, "We talked about the weather.", exact_hit=False)
    assert is_match(query, "unrelated text", exact_hit=True)
    # Vector-only: the hit must stand out from the other candidates, not merely be nearest.
    assert is_match(query, "我女儿对花生过敏", exact_hit=False, vector_margin=0.07)
    assert not is_match(query, "我女儿对花生过敏", exact_hit=False, vector_margin=0.013)
    cjk = terms("发票邮箱")
    assert is_match(cjk, "请把发票寄到邮箱", exact_hit=False)
    assert not is_match(cjk, "发现一个箱子", exact_hit=False)  # shared characters, no bigram
    # Words are compared by stem, like the lexical arm ranks them.
    assert is_match(terms("who was dancing?"), "Bart danced at the party.", exact_hit=False)
    assert not is_match(terms("who was dancing?"), "Bart sang at the party.", exact_hit=False)
    # A possessive's "s" is no shared word: "It's raining" is no match for the target.
    target = terms("What is my company's quarterly revenue target?")
    assert not is_match(target, "It's raining again here.", exact_hit=False)
