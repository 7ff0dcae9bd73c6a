"""The pure scoring of `contextd eval trust` (`app.eval.trust`)."""

from app.eval.trust import (
    FORGETS,
    INJECTIONS,
    UPDATES,
    ForgetResult,
    InjectionResult,
    TrustRun,
    UpdateResult,
    failures,
    summarise,
    trust_table,
)
from app.memories.conflicts import contradicts


def test_the_scenarios_cover_both_languages_and_the_updates_contradict() -> None:
    for language in ("en", "zh"):
        assert sum(c.language == language for c in INJECTIONS) == 4
        assert sum(u.language == language for u in UPDATES) == 3
        assert sum(f.language == language for f in FORGETS) == 1
    assert all(contradicts(u.old, u.new) for u in UPDATES)
    assert all(c.data in c.result and c.order in c.result for c in INJECTIONS)


def test_summary_shares_and_misses_per_language() -> None:
    run = TrustRun(
        injections=[
            InjectionResult("en-a", "en", True, True, True),
            InjectionResult("en-b", "en", False, True, False, ["notes"]),
            InjectionResult("zh-a", "zh", True, False, True),
        ],
        updates=[
            UpdateResult("en-h", "en", True, False, True, False),
            UpdateResult("en-h", "en", False, True, True, True),
            UpdateResult("zh-h", "zh", True, True, True, True),
        ],
        forgets=[
            ForgetResult("en", "turn", 4, 0, 0.5),
            ForgetResult("zh", "turn", 4, 1, None, ["chunk"]),
        ],
        elapsed_s=1.0,
        url="http://x",
        run_id="r",
    )
    summary = summarise(run)
    assert summary["en"]["interception"] == 0.5 and summary["en"]["data_kept"] == 0.5
    assert summary["zh"]["flagged"] == 0.0
    assert summary["en"]["stale_rate"] == 0.0 and summary["en"]["stale_rate_unkeyed"] == 1.0
    assert summary["en"]["contradictions_unkeyed"] == 1.0
    assert summary["zh"]["stale_rate"] == 1.0 and summary["zh"]["contradictions_keyed"] == 1.0
    assert summary["en"]["seconds_to_zero"] == 0.5 and summary["zh"]["seconds_to_zero"] is None
    assert "| stale-memory rate (`remember`, same key) | 0.000 | 1.000 |" in trust_table(summary)
    assert failures(run) == [
        "- injection en-b: order found in notes",
        "- injection zh-a: not flagged",
        "- injection en-b: data not kept",
        "- update en-h (no key): stale, contradiction",
        "- update zh-h (same key): stale, contradiction",
        "- forget zh turn: 1 left (chunk)",
    ]
