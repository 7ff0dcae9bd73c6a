"""Identifiers of the product: the session-id rule every surface applies."""

import re

SESSION_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"


_SESSION_ID = re.compile(SESSION_ID_PATTERN)


def is_session_id(value: object) -> bool:
    """The session-id rule of every surface: REST paths (the same pattern, in the OpenAPI
    document), MCP tool calls, the memory tool, the inspector. Names outside it (`~erasing~...`
    tombstones among them) can never name a session."""
    return isinstance(value, str) and _SESSION_ID.fullmatch(value) is not None
