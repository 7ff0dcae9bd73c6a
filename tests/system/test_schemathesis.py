"""schemathesis against the committed OpenAPI document and a live server: every operation, every
check (plus tests/system/schemathesis_hooks.py), all phases including stateful sequences. A bounded
run; docs/RELIABILITY.md gives the command for a long one."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.server import RunningServer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_PER_OPERATION = 15
SEED = 20261130  # fixed, so that a failure in CI replays the same way


def test_every_operation_passes_every_check(server: RunningServer, admin_key: str) -> None:
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        str(ROOT / "openapi" / "openapi.json"),
        f"--url={server.url}",
        f"--header=Authorization: Bearer {admin_key}",
        "--checks=all",
        f"--max-examples={EXAMPLES_PER_OPERATION}",
        f"--seed={SEED}",
        "--workers=1",
        "--request-timeout=30",
        "--no-color",
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.system.schemathesis_hooks"}
    run = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    summary = run.stdout[-6000:]
    assert run.returncode == 0, summary
    spec = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    operations = sum(len(methods) for methods in spec["paths"].values())
    assert f"Tested: {operations}" in run.stdout, summary  # every operation of the document
