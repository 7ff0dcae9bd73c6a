"""Checks added to schemathesis's own
(loaded with SCHEMATHESIS_HOOKS=tests.system.schemathesis_hooks).

`schemathesis.toml` lets a schema-valid request get a 413 or 422, because some rules span fields,
stored state or configured limits, which JSON Schema cannot state. This check narrows that back:
such an answer must carry an error code its operation documents in `x-rules`.
"""

from typing import Any

import schemathesis


@schemathesis.check
def rejected_only_by_documented_rules(ctx: Any, response: Any, case: Any) -> bool | None:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if response.status_code not in (413, 422):
        return None
    rules = case.operation.definition.raw.get("x-rules", [])
    code = (response.json().get("error") or {}).get("code")
    if not any(r["status"] == response.status_code and r["code"] == code for r in rules):
        raise AssertionError(
            f"schema-valid request answered {response.status_code} {code!r}, which is not a rule "
            f"{case.operation.label} documents in x-rules: {[r['code'] for r in rules]}"
        )
    return None
