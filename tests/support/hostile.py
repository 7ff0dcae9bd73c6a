"""Hostile strings every surface must refuse or store faithfully, never answer with a 5xx or
internal text: the set the security rounds probe with."""

import uuid

HOSTILE_STRINGS: dict[str, str] = {
    "nul": "a\x00b",
    "300 chars": "x" * 300,
    "tombstone": f"~erasing~{uuid.UUID(int=7)}",
    "slash and space": "a/b c",
    "html": "<script>alert(1)</script>",
    "rtl marks": "\u202eabc\u200f",
    "lone surrogate": "a\ud800b",
}

# Words of internal error text (SQL, driver and Python names) no answer may carry.
INTERNAL_WORDS = (
    "select ",
    "insert ",
    "update ",
    "sqlalchemy",
    "psycopg",
    "traceback",
    "external_id",
    "[sql",
    "parameters:",
)


def internal_text(text: str) -> list[str]:
    """The internal words `text` holds (none, for a clean answer)."""
    lowered = text.lower()
    return [word for word in INTERNAL_WORDS if word in lowered]
