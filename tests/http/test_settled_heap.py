"""A serving process keeps its startup objects out of the cyclic collector's reach
(`app.http.server.settled_heap`) and gives them back when it stops."""

import gc

from app.core.config import Settings
from app.http.server import YOUNG_GENERATION_OBJECTS
from tests.support.server import run_server


def test_a_server_freezes_its_startup_objects_while_it_serves(settings: Settings) -> None:
    before = gc.get_threshold()
    with run_server(settings):
        assert gc.get_freeze_count() > 10_000  # modules, schemas, tables: what startup made
        assert gc.get_threshold() == (YOUNG_GENERATION_OBJECTS, *before[1:])
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
