"""Acceptance of the rules generator on the scripted suite, without a server (fast).

The conversations are regenerated the way the worker does it: offloaded in batches, each batch
folded into the stored (capped) notes, and rebuilt from every offloaded turn every tenth version.
`tests/eval/test_notes_eval_e2e.py` runs the same suite through the API.
"""

import json
from datetime import UTC, datetime

import pytest

from app.core.config import NotesSettings
from app.domain.records import TurnRecord
from app.domain.tokens import message_tokens
from app.eval.notes import SuiteConversation, load_suite, score_conversation, summarise_suite
from app.notes.policy import cap, merge
from app.notes.rules import extract
from app.notes.schemas import Notes, NotesResult
from tests.eval.notes_suite import generate_suite

T0 = datetime(2024, 1, 1, tzinfo=UTC)
BATCH = 30  # turns per offload
WINDOW = 8  # turns that stay in the window


def regenerate(conv: SuiteConversation) -> tuple[NotesResult, int]:
    """The final capped notes and the last offloaded seq (seq = position + 1)."""
    defaults = NotesSettings.model_validate({})
    turns = [
        TurnRecord(n + 1, t.role, t.content, message_tokens(t.role, t.content), T0)
        for n, t in enumerate(conv.turns)
    ][:-WINDOW]
    stored = cap(Notes(), defaults.max_tokens)
    for version, start in enumerate(range(0, len(turns), BATCH), start=1):
        rebuild = version % defaults.rebuild_every_versions == 0
        previous = Notes() if rebuild else stored.notes
        batch = turns[: start + BATCH] if rebuild else turns[start : start + BATCH]
        stored = cap(merge(previous, extract(batch, previous)), defaults.max_tokens)
    return stored, turns[-1].seq


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    path = tmp_path_factory.mktemp("suite") / "suite.json"
    path.write_text(json.dumps(generate_suite(12), ensure_ascii=False))
    scores = []
    for conv in load_suite(path):
        result, covers = regenerate(conv)
        seqs = list(range(1, len(conv.turns) + 1))
        scores.append(
            score_conversation(conv, result.notes, seqs, covers, token_count=result.token_count)
        )
    return summarise_suite(scores)


@pytest.mark.parametrize("group", ["dev/en", "dev/zh", "heldout/en", "heldout/zh"])
def test_rules_meet_the_acceptance_figures(
    summary: dict[str, dict[str, object]], group: str
) -> None:
    row = summary[group]
    assert row["conversations"] == 12 and row["in_window"] == 0
    assert isinstance(row["recall"], float) and row["recall"] >= 0.9, row
    assert isinstance(row["precision"], float) and row["precision"] >= 0.95, row
    assert row["decisions_latest_only"] == 1.0, row
    assert row["dropped_items"] == 0  # the suite fits the default cap: recall is extraction's
