import json

from app.runtime.api import create_app
from app.runtime.cli import OPENAPI_PATH


def test_committed_openapi_matches_the_app() -> None:
    served = create_app().openapi()
    committed = json.loads(OPENAPI_PATH.read_text())
    assert committed == served, "openapi/openapi.json is stale: run `contextd openapi`"


def test_operation_ids_are_stable_names() -> None:
    spec = create_app().openapi()
    ids = [op["operationId"] for path in spec["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert {"append_turns", "list_turns", "get_session", "configure_session"} <= set(ids)
    assert all(i.replace("_", "").isalnum() and i.islower() for i in ids)
