"""The notes-quality scores (pure) and the scripted suite generator."""

import json
import math
from collections.abc import Sequence
from pathlib import Path

from app.eval.notes import (
    MustKeep,
    SuiteConversation,
    SuiteTurn,
    load_observations,
    load_suite,
    observation_terms,
    score_conversation,
    score_observations,
    suite_table,
    summarise_observations,
    summarise_suite,
)
from app.notes.schemas import NoteItem, Notes
from tests.eval.notes_suite import KINDS, NONFACTS, TEMPLATES, generate_suite, split_of

CONV = SuiteConversation(
    id="en-dev-0",
    language="en",
    split="dev",
    turns=(
        SuiteTurn("user", "My name is Ada Park.", "keep"),  # 0 -> seq 11
        SuiteTurn("assistant", "Noted.", "reply"),  # 1
        SuiteTurn("user", "What are your hours?", "question"),  # 2
        SuiteTurn("user", "Let's go with DHL for the shipping.", "keep"),  # 3
        SuiteTurn("user", "Actually, switch the shipping to UPS.", "keep"),  # 4
        SuiteTurn("user", "The gate code is 4411.", "keep"),  # 5
        SuiteTurn("user", "I'm allergic to kiwi.", "keep"),  # 6, stays in the window
    ),
    items=(
        MustKeep("name", 0, ("Ada Park",), (), False),
        MustKeep("decision", 3, ("DHL",), (), True),
        MustKeep("decision", 4, ("UPS",), (3,), False),
        MustKeep("code", 5, ("4411",), (), False),
        MustKeep("health", 6, ("kiwi",), (), False),
    ),
)
SEQS = [11, 12, 13, 14, 15, 16, 17]


def note(text: str, seq: int | None, source: str = "user") -> NoteItem:
    return NoteItem.model_validate({"text": text, "seq": seq, "source": source})


def test_a_conversation_score_counts_kept_missed_non_facts_and_stale_versions() -> None:
    notes = Notes(
        facts=[note("my name is ada park", 11), note("gate code 4412", 16)],  # code: wrong value
        decisions=[note("Let's go with DHL", 14), note("switch the shipping to UPS", 15)],
        open=[note("What are your hours?", 13)],  # a question in the notes
        remembered=[note("likes tea", None, "memory")],  # not counted
    )
    score = score_conversation(CONV, notes, SEQS, covers_until_seq=16, token_count=50)
    assert [(i.kind, i.kept, i.in_window, i.latest_only) for i in score.items] == [
        ("name", True, False, False),
        ("decision", True, False, False),  # kept, but the DHL version is still cited
        ("code", False, False, False),
        ("health", False, True, False),  # never offloaded: not scored
    ]
    assert (score.notes_items, score.non_fact_items) == (5, 1)
    assert score.non_fact_examples == ["What are your hours?"]
    assert score.missed_examples == ["code: The gate code is 4411."]

    [(name, row)] = summarise_suite([score]).items()
    assert name == "dev/en"
    assert (row["must_keep"], row["in_window"], row["recall"]) == (3, 1, 2 / 3)
    assert row["precision"] == 4 / 5 and row["decisions_latest_only"] == 0.0
    assert row["decisions_changed"] == 1 and row["updates_changed"] == 0
    assert math.isnan(row["updates_latest_only"])
    assert row["kinds"]["code"] == {"n": 1, "recall": 0.0}
    assert "| dev | en | 1 | 3 | 0.667 | 5 | 1 | 0.800 | 1 | 0.000 | 0 | – |" in suite_table(
        {name: row}
    )


def test_latest_only_holds_when_only_the_latest_version_is_cited() -> None:
    notes = Notes(decisions=[note("Actually, switch the shipping to UPS.", 15)])
    [_, decision, *_] = score_conversation(CONV, notes, SEQS, covers_until_seq=17).items
    assert decision.kept and decision.changed and decision.latest_only


def test_observations_are_covered_by_half_their_key_terms_in_one_item() -> None:
    sample = {
        "observation": {
            "session_1_observation": {
                "Ann": [["Ann adopted a beagle named Rex in March.", "D1:2"]],
                "Bob": [["Bob plays the cello every Sunday.", ["D1:3", "D:1:04", "D9:9"]]],
            }
        }
    }
    observations = load_observations(sample, ["D1:1", "D1:2", "D1:3", "D1:4"])
    assert [(o.speaker, o.dia_ids) for o in observations] == [
        ("Ann", ("D1:2",)),
        ("Bob", ("D1:3", "D1:4")),  # malformed ids normalised, unknown ones dropped
    ]
    assert observation_terms("Ann adopted a beagle named Rex in March.", ["Ann", "Bob"]) == {
        "adopted", "beagle", "named", "rex", "march",
    }  # fmt: skip
    roles = {"Ann": "user", "Bob": "assistant"}
    half = Notes(facts=[note("Ann: we adopted a beagle, Rex", 2)])  # 3 of 5 terms
    score = score_observations("s1", observations, roles, half, {2: "D1:2", 3: "D1:3"})
    assert score.covered == {"user": [True], "assistant": [False]}
    assert score.cited == {"user": [True], "assistant": [False]}
    spread = Notes(facts=[note("a beagle", 7), note("named Rex", 8)])  # two items, 2 terms each
    assert score_observations("s1", observations, roles, spread, {}).covered["user"] == [False]
    table = summarise_observations([score])
    assert table["all"] == {"n": 2.0, "key_terms": 0.5, "source_cited": 0.5}
    assert table["user"]["key_terms"] == 1.0 and table["assistant"]["key_terms"] == 0.0


def test_the_suite_is_seeded_labelled_and_its_parts_share_no_template(tmp_path: Path) -> None:
    suite = generate_suite(2)
    assert suite == generate_suite(2)  # one seed, one file
    lists: list[Sequence[object]] = [*TEMPLATES.values(), *NONFACTS.values()]
    for templates in lists:
        dev, held = split_of(templates, "dev"), split_of(templates, "heldout")
        assert dev and held and not set(map(str, dev)) & set(map(str, held)), templates
        assert sorted(map(str, dev + held)) == sorted(map(str, templates))
    conversations = suite["conversations"]
    assert [(c["split"], c["language"]) for c in conversations][::2] == [
        ("dev", "en"), ("dev", "zh"), ("heldout", "en"), ("heldout", "zh"),
    ]  # fmt: skip
    for conv in conversations:
        turns, items = conv["turns"], conv["items"]
        assert len(turns) > 100 and {i["kind"] for i in items} >= set(KINDS)
        for item in items:
            assert turns[item["turn"]]["label"] == "keep" and turns[item["turn"]]["role"] == "user"
            for term in item["terms"]:
                assert term.casefold() in turns[item["turn"]]["content"].casefold()
            for earlier in item["supersedes"]:
                assert earlier < item["turn"] and turns[earlier]["label"] == "keep"
        changed = [i for i in items if i["supersedes"]]
        assert any(i["kind"] == "decision" for i in changed)
        assert all(
            i["superseded"] == any(i["turn"] in c["supersedes"] for c in items) for i in items
        )
        user_labels = {t["label"] for t in turns if t["role"] == "user"}
        assert user_labels == {"keep", "question", "request", "chitchat"}
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite, ensure_ascii=False))
    loaded = load_suite(path, limit=1)
    assert [c.id for c in loaded] == [
        "en-dev-0",
        "zh-dev-0",
        "en-heldout-10000",
        "zh-heldout-10000",
    ]
    assert loaded[0].items[0].terms == tuple(conversations[0]["items"][0]["terms"])
