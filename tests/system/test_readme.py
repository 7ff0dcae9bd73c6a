"""The README, executed: its test command is the one CI runs, every fallback flag is documented
(docs/CONCEPTS.md), and its walkthrough — every shell command of the walkthrough sections, in
order, as written — runs against a fresh `contextd dev` in a directory of its own and answers as
documented. (The configuration page and the links: tests/system/test_docs.py.)

A documented answer is the comment `# -> ...` under a command (continued on `#     ...` lines);
`...` (or `…`) stands for any text, everything else must match the command's output exactly."""

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.dev import dev_server, user_env
from tests.support.server import free_port

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CONCEPTS = REPO / "docs" / "CONCEPTS.md"
WALKTHROUGH = (
    "Five minutes with curl",
    "The memory tool",
    "Look at a session: the inspector",
    "MCP",
    "Authentication",
)
FALLBACK_LITERAL = re.compile(r'(?:fallbacks|flags)\.append\("([a-z_]+)"\)')


@dataclass
class Step:
    command: str
    expected: list[str] = field(default_factory=list)

    def pattern(self) -> re.Pattern[str]:
        parts = re.split(r"\.\.\.|…", "\n".join(self.expected))
        return re.compile(".*?".join(re.escape(p) for p in parts), re.DOTALL)


def sections(text: str) -> dict[str, str]:
    out, title = {}, ""
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            title = line[3:].strip()
            out[title] = ""
        elif title:
            out[title] += line
    return out


def bash_blocks(body: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", body, re.DOTALL | re.MULTILINE)


def complete(command: str) -> bool:
    """A whole shell statement (bash itself decides: quotes, loops, substitutions)."""
    if command.rstrip().endswith("\\"):
        return False
    return subprocess.run(["bash", "-n", "-c", command], capture_output=True).returncode == 0


def steps(block: str) -> list[Step]:
    out: list[Step] = []
    pending: list[str] = []
    for line in block.splitlines():
        if pending:
            pending.append(line)
        elif line.startswith("# -> "):
            out[-1].expected.append(line[len("# -> ") :])
            continue
        elif line.startswith("#     ") and out and out[-1].expected:
            out[-1].expected[-1] += line[1:].strip()
            continue
        elif not line.strip() or line.startswith("#"):
            continue
        else:
            pending = [line]
        if complete("\n".join(pending)):
            out.append(Step("\n".join(pending)))
            pending = []
    assert not pending, f"unfinished command in the README: {pending}"
    return out


def walkthrough() -> list[tuple[str, Step]]:
    found = sections(README.read_text())
    out = []
    for title in WALKTHROUGH:
        assert title in found, f"README has no section {title!r}"
        blocks = bash_blocks(found[title])
        assert blocks, f"section {title!r} has no bash block"
        out += [(title, step) for block in blocks for step in steps(block)]
    return out


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """CI does no set-up of its own that `make test` lacks: a fresh machine following the README
    gets what CI gets (Chromium and the other prerequisites come from `make test` itself)."""
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in sections(README.read_text())["Quick start"]
    commands = [
        line.strip()
        for line in ci.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[-1] == "make test"
    assert [c for c in commands if re.search(r"apt-get|pip |npm |playwright", c)] == []
    makefile = (REPO / "Makefile").read_text()
    test_target = re.search(r"^test: (.*?)(?:##|$)", makefile, re.MULTILINE)
    assert test_target is not None and "prerequisites" in test_target.group(1).split()
    assert "tests/support/prerequisites.sh" in makefile


def test_every_fallback_flag_is_documented() -> None:
    raised = {
        flag
        for path in (REPO / "app").rglob("*.py")
        for flag in FALLBACK_LITERAL.findall(path.read_text())
    }
    table = sections(CONCEPTS.read_text())["Fallback flags"]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE))
    assert len(raised) >= 10 and raised == documented


def test_every_walkthrough_command_answers_as_documented(tmp_path: Path) -> None:
    """Top to bottom, in a scratch directory (its own `.contextd/`), as a new user would; the
    README's port 8080 is the only thing changed."""
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    (tmp_path / "examples").symlink_to(REPO / "examples")
    port = free_port()
    todo = walkthrough()
    assert len(todo) >= 30
    with dev_server(tmp_path, port):
        for title, step in todo:
            command = step.command.replace("localhost:8080", f"127.0.0.1:{port}")
            command = command.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
            done = subprocess.run(
                ["bash", "-c", "set -eo pipefail\n" + command],
                cwd=tmp_path,
                env=user_env(),
                capture_output=True,
                text=True,
                timeout=120,
            )
            where = f"[{title}] {step.command}"
            assert done.returncode == 0, f"{where}\nexit {done.returncode}: {done.stderr}"
            if step.expected:
                output = done.stdout.strip()
                assert step.pattern().fullmatch(output), f"{where}\n--- documented\n" + (
                    "\n".join(step.expected) + f"\n--- got\n{output}"
                )
