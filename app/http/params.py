"""Path parameters every router shares: the session id, checked by one rule on every surface."""

from typing import Annotated

from fastapi import Path

from app.core.errors import InvalidSessionId
from app.domain.ids import SESSION_ID_PATTERN, is_session_id


def require_session_id(value: object) -> str:
    """`value` if it is a session id; else the 422 a REST path with it answers."""
    if not is_session_id(value):
        raise InvalidSessionId(InvalidSessionId.RULE, field="session_id")
    assert isinstance(value, str)
    return value


SessionIdPath = Annotated[
    str,
    Path(
        pattern=SESSION_ID_PATTERN,
        description="client-chosen id: letters, digits and . _ : - (1-128 chars)",
        examples=["agent-42:run-7"],
    ),
]
