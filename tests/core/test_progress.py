"""A long command shows it is moving: `done/total (percent)`, elapsed time and what is left, at
most every few seconds and always at the end, on stderr (stdout keeps the results)."""

import pytest

from app.core.progress import Progress, say


def test_progress_lines_are_rate_limited_and_the_last_is_always_written() -> None:
    now = [100.0]
    lines: list[str] = []
    progress = Progress("questions asked", 4, every_s=2.0, write=lines.append, clock=lambda: now[0])
    progress.advance()  # 0 s since the start: too soon
    now[0] = 103.0
    progress.advance()  # 3 s: written, half done, about 3 s left
    now[0] = 104.0
    progress.advance()  # 1 s since the last line: too soon
    now[0] = 104.5
    progress.advance()  # the last one: always written
    assert lines == [
        "questions asked: 2/4 (50%), 3 s, about 3 s left",
        "questions asked: 4/4 (100%), 4 s",
    ]


def test_progress_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    Progress("chunks re-embedded", 1).advance()
    say("re-embedding 1 chunks")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "chunks re-embedded: 1/1 (100%), 0 s",
        "re-embedding 1 chunks",
    ]
