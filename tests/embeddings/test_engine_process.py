"""The e5 engine process: restarted when it died, failures surface as EmbedderUnavailable."""

import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest

from app.embeddings.base import EmbedderUnavailable
from app.embeddings.engine_process import EngineProcess


@pytest.fixture
def engine() -> Iterator[EngineProcess]:
    engine = EngineProcess("original")
    yield engine
    engine.close()


def test_an_engine_that_died_between_calls_is_started_again(engine: EngineProcess) -> None:
    first = engine.encode(["which region did the billing service go to?"], True, 512)
    pid = engine.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert engine._process is not None and engine._process.wait() == -signal.SIGKILL
    again = engine.encode(["which region did the billing service go to?"], True, 512)
    assert engine.pid not in (None, pid)
    np.testing.assert_allclose(again, first, rtol=0, atol=1e-6)


def test_ctrl_c_is_left_to_the_parent(engine: EngineProcess) -> None:
    # A terminal's Ctrl-C reaches the whole process group; the engine stops with its parent.
    first = engine.encode(["我女儿对花生过敏"], True, 512)
    pid = engine.pid
    assert pid is not None
    os.kill(pid, signal.SIGINT)
    np.testing.assert_allclose(engine.encode(["我女儿对花生过敏"], True, 512), first, atol=1e-6)
    assert engine.pid == pid and engine._process is not None and engine._process.poll() is None


def test_a_call_that_fails_fails_alone_and_the_engine_goes_on(engine: EngineProcess) -> None:
    assert engine.encode(["warm"], True, 512).shape == (1, 384)
    pid = engine.pid
    with pytest.raises(EmbedderUnavailable, match="the e5 engine failed"):
        engine.encode([None], True, 512)  # type: ignore[list-item]
    assert engine.pid == pid
    assert engine.encode(["我女儿对花生过敏"], False, 512).shape == (1, 384)


def test_a_model_that_cannot_load_is_unavailable() -> None:
    engine = EngineProcess("no-such-variant")
    with pytest.raises(EmbedderUnavailable, match="did not start"):
        engine.encode(["anything"], True, 512)
    assert engine.pid is None
