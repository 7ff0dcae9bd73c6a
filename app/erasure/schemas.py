"""Wire shapes of erasure: the answer to a session delete and the erase receipt."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel


class EraseReceiptOut(BaseModel):
    receipt_id: str
    session_id: str
    target: dict[str, Any]
    status: Literal["pending", "completed", "failed"]
    stores: dict[str, Any]
    attempts: int
    requested_at: datetime
    completed_at: datetime | None


class SessionErased(BaseModel):
    session_id: str
    erase_receipt_id: str
    status: Literal["pending"] = "pending"
