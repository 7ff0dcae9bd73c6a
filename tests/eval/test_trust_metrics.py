"""The pure scoring of `contextd eval trust` (`app.eval.trust`)."""

from app.eval.trust import (
    BUDGETS,
    EXPIRIES,
    INJECTIONS,
    REVOCATION_KINDS,
    REVOCATIONS,
    UPDATES,
    BudgetResult,
    ExpiryResult,
    InjectionResult,
    RevocationResult,
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
        assert sum(r.language == language for r in REVOCATIONS) == 1
        assert sum(e.language == language for e in EXPIRIES) == 1
        assert sum(b.language == language for b in BUDGETS) == 1
    assert all(contradicts(u.old, u.new) for u in UPDATES)
    assert all(c.data in c.result and c.order in c.result for c in INJECTIONS)
    for case in REVOCATIONS:
        assert all(v in case.turn and v in case.turn_item for v in case.turn_values)
        assert all(v in case.result and v in case.tool_item for v in case.tool_values)
        assert case.values("untrusted_source") == case.tool_values == case.values("tool_result")
        assert case.values("user") == case.turn_values
    for budget in BUDGETS:
        assert budget.constraint_term in budget.constraint
        assert budget.injection.language == budget.update.language == budget.language


def run_of(revocations: list[RevocationResult]) -> TrustRun:
    return TrustRun(
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
        revocations=revocations,
        expiries=[ExpiryResult("en", True, False), ExpiryResult("zh", True, True, ["probe"])],
        budgets=[
            BudgetResult("en", 80, False, False, False, False),
            BudgetResult("en", 120, True, True, True, False),
            BudgetResult("zh", 120, True, False, True, True),
        ],
        elapsed_s=1.0,
        url="http://x",
        run_id="r",
    )


def test_summary_shares_and_misses_per_language() -> None:
    run = run_of(
        [
            RevocationResult("en", "turn", 4, 0, 0, 0.5),
            RevocationResult("en", "user", 3, 0, 0, 1.5),
            RevocationResult("zh", "turn", 4, 1, 1, None, ["chunk"]),
        ]
    )
    summary = summarise(run)
    assert summary["en"]["interception"] == 0.5 and summary["en"]["data_kept"] == 0.5
    assert summary["zh"]["flagged"] == 0.0
    assert summary["en"]["stale_rate"] == 0.0 and summary["en"]["stale_rate_unkeyed"] == 1.0
    assert summary["en"]["contradictions_unkeyed"] == 1.0
    assert summary["zh"]["stale_rate"] == 1.0 and summary["zh"]["contradictions_keyed"] == 1.0
    assert summary["en"]["seconds_to_zero"] == 1.5 and summary["zh"]["seconds_to_zero"] is None
    assert summary["en"]["left_user"] == 0 and summary["en"]["seconds_user"] == 1.5
    assert summary["en"]["left_session"] is None
    assert summary["zh"]["derived_served"] == 1 and summary["zh"]["derived_left"] == 1
    assert summary["en"]["expiry_stale"] == 0.0 and summary["zh"]["expiry_stale"] == 1.0
    assert summary["en"]["budget_builds"] == 1  # the 422 is not counted
    assert (
        summary["en"]["budget_constraint_kept"] == 1.0 and summary["en"]["budget_order_shown"] == 1
    )
    assert summary["en"]["budget_constraint_dropped"] == 0  # the order beside the constraint
    assert summary["zh"]["budget_constraint_dropped"] == summary["zh"]["budget_stale"] == 1
    table = trust_table(summary)
    assert "| stale-memory rate (`remember`, same key) | 0.000 | 1.000 |" in table
    assert "| derived items left: user (seconds until 0) | 0 (1.500 s) | – (– s) |" in table
    assert "| derived items left: turn (seconds until 0) | 0 (0.500 s) | 1 (– s) |" in table
    assert failures(run) == [
        "- injection en-b: order found in notes",
        "- injection zh-a: not flagged",
        "- injection en-b: data not kept",
        "- update en-h (no key): stale, contradiction",
        "- update zh-h (same key): stale, contradiction",
        "- revocation zh turn: 1 served right after (chunk), 1 left at the deadline",
        "- expiry zh: stale in probe",
        "- budget zh at 120 tokens: constraint dropped while an order shown, stale fact shown",
    ]


def test_every_revocation_kind_has_its_row() -> None:
    run = run_of([RevocationResult("en", kind, 2, 0, 0, 0.1) for kind in REVOCATION_KINDS])
    table = trust_table(summarise(run))
    for kind in REVOCATION_KINDS:
        assert (
            f"| derived items left: {kind.replace('_', ' ')} (seconds until 0) | 0 (0.100 s)"
            in (table)
        )
