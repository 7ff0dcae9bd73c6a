"""A Python client generated from the committed openapi/openapi.json (openapi-python-client), used
against a live server: typed requests go out, typed responses come back with the right values."""

import importlib
import json
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.clients.toolchain import SPEC_PATH, python_generator, run
from tests.support.server import RunningServer

PACKAGE = "contextd_client"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    out = tmp_path_factory.mktemp("pyclient") / "contextd-client"
    config = out.parent / "config.json"
    # no post hooks: the generator would otherwise shell out to whatever `ruff` is on PATH
    config.write_text(json.dumps({"package_name_override": PACKAGE, "post_hooks": []}))
    proc = run(
        [
            *python_generator(),
            "generate",
            "--path",
            str(SPEC_PATH),
            "--output-path",
            str(out),
            "--config",
            str(config),
            "--meta",
            "none",
        ],
        what="openapi-python-client generate",
    )
    printed = proc.stdout + proc.stderr
    assert "Warning" not in printed and "Error" not in printed, printed
    assert (out / "__init__.py").exists() and (out / "api").is_dir()
    # `--meta none` writes the package itself at the output path
    sys.path.insert(0, str(out.parent))
    out.rename(out.parent / PACKAGE)
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(out.parent))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def mod(name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.{name}")


def test_generated_client_has_one_function_per_operation(generated: ModuleType) -> None:
    spec = json.loads(SPEC_PATH.read_text())
    for path in spec["paths"].values():
        for op in path.values():
            tag = op["tags"][0].replace(" ", "_").replace("-", "_").lower()
            module = mod(f"api.{tag}.{op['operationId']}")
            for fn in ("sync_detailed", "asyncio_detailed"):
                assert callable(getattr(module, fn)), (op["operationId"], fn)


async def test_generated_client_appends_builds_and_reads(
    generated: ModuleType, server: RunningServer, api_key: str
) -> None:
    models = mod("models")
    client = generated.AuthenticatedClient(base_url=server.url, token=api_key)
    sid = "py-client"

    configured = await mod("api.sessions.configure_session").asyncio(
        sid,
        client=client,
        body=models.SessionConfigUpdate(context_limit=16000, reserve_tokens=2000),
    )
    assert isinstance(configured, models.SessionOut)
    assert (configured.session_id, configured.context_limit) == (sid, 16000)
    assert configured.reserve_tokens == 2000 and configured.usage.limit == 14000

    append = mod("api.sessions.append_turns")
    body = models.AppendTurnsRequest(
        turns=[
            models.TurnIn(
                role=models.TurnInRole.USER,
                content="Book the 9:40 train to Lyon. Budget at most 120 EUR.",
            ),
            models.TurnIn(
                role=models.TurnInRole.ASSISTANT, content="Booked: ticket LY-40917, 96 EUR."
            ),
        ]
    )
    first = await append.asyncio_detailed(sid, client=client, body=body, idempotency_key="py-1")
    assert first.status_code == 201
    appended = first.parsed
    assert isinstance(appended, models.AppendTurnsResponse)
    assert [t.seq for t in appended.turns] == [1, 2]
    assert [t.role.value for t in appended.turns] == ["user", "assistant"]
    assert all(t.token_count > 0 for t in appended.turns)
    assert appended.watermark.level.value == "normal" and appended.offload_enqueued is False
    assert appended.usage.c1 >= sum(t.token_count for t in appended.turns)

    replay = await append.asyncio(sid, client=client, body=body, idempotency_key="py-1")
    assert [t.seq for t in replay.turns] == [1, 2]  # the first answer, nothing written twice

    built = await mod("api.prompt.build_prompt").asyncio(
        sid,
        client=client,
        body=models.BuildPromptRequest(
            system="You are a travel agent.",
            query="Which ticket did you book?",
            append=True,
            format_=models.BuildPromptRequestFormat.OPENAI,
        ),
    )
    assert isinstance(built, models.BuildPromptResponse)
    messages = [m.to_dict() for m in built.messages]
    assert messages == [
        {"role": "system", "content": "You are a travel agent."},
        {"role": "user", "content": "Book the 9:40 train to Lyon. Budget at most 120 EUR."},
        {"role": "assistant", "content": "Booked: ticket LY-40917, 96 EUR."},
        {"role": "user", "content": "Which ticket did you book?"},
    ]
    assert built.usage.limit == 14000 and 0 < built.usage.total <= built.usage.limit
    assert built.watermark.level.value == "normal" and built.recall.items == []
    assert built.build_id

    page = await mod("api.sessions.list_turns").asyncio(
        sid, client=client, role=models.ListTurnsRoleType0.USER, limit=10
    )
    assert isinstance(page, models.TurnPage)
    assert [(t.seq, t.content) for t in page.turns] == [
        (1, "Book the 9:40 train to Lyon. Budget at most 120 EUR."),
        (3, "Which ticket did you book?"),
    ]
    assert all(t.chunk_id is None for t in page.turns)

    view = await mod("api.sessions.get_session").asyncio(sid, client=client)
    assert isinstance(view, models.SessionOut)
    assert (view.counts.turns, view.counts.chunks) == (3, 0)

    missing = await mod("api.sessions.get_session").asyncio_detailed("no-such", client=client)
    assert missing.status_code == 404
    assert isinstance(missing.parsed, models.ErrorResponse)
    assert missing.parsed.error.code == "not_found"

    with pytest.raises(ValueError):
        models.TurnInRole("wizard")  # the generated enum refuses what the server would refuse


async def test_generated_client_calls_the_memory_tool(
    generated: ModuleType, server: RunningServer, api_key: str
) -> None:
    models = mod("models")
    client = generated.AuthenticatedClient(base_url=server.url, token=api_key)
    sid = "py-memory"
    call = mod("api.memory_tool.memory_tool")

    await mod("api.sessions.append_turns").asyncio(
        sid,
        client=client,
        body=models.AppendTurnsRequest(
            turns=[models.TurnIn(role=models.TurnInRole.USER, content="Invoices by email only.")]
        ),
    )
    remembered = await call.asyncio(
        sid,
        client=client,
        body=models.MemoryRequest(
            type_=models.MemoryType.REMEMBER,
            text="User wants invoices by email only, never paper",
            key="invoice",
        ),
    )
    assert isinstance(remembered, models.MemoryAnswer)
    assert remembered.type_ == models.MemoryType.REMEMBER and remembered.text

    listed = await mod("api.memory_tool.list_memories").asyncio(sid, client=client)
    assert isinstance(listed, models.MemoryList)
    assert [(m.text, m.key) for m in listed.memories] == [
        ("User wants invoices by email only, never paper", "invoice")
    ]

    recalled = await call.asyncio(
        sid,
        client=client,
        body=models.MemoryRequest(
            type_=models.MemoryType.RECALL, query="how does the user want invoices?"
        ),
    )
    assert isinstance(recalled, models.MemoryAnswer)
    assert "User wants invoices by email only, never paper" in recalled.text
    matches = recalled.data.to_dict()["matches"]
    assert matches[0]["memory_id"] == listed.memories[0].memory_id

    await mod("api.sessions.append_turns").asyncio(
        "py-empty",
        client=client,
        body=(
            models.AppendTurnsRequest(
                turns=[models.TurnIn(role=models.TurnInRole.USER, content="Hi")]
            )
        ),
    )
    nothing = await call.asyncio(
        "py-empty",
        client=client,
        body=models.MemoryRequest(
            type_=models.MemoryType.RECALL, query="zebra migration in Patagonia"
        ),
    )
    assert isinstance(nothing, models.MemoryAnswer)
    assert "no match" in nothing.text.lower() and nothing.data.to_dict()["matches"] == []

    status = await call.asyncio(
        sid, client=client, body=models.MemoryRequest(type_=models.MemoryType.STATUS)
    )
    assert isinstance(status, models.MemoryAnswer) and status.type_ == models.MemoryType.STATUS

    refused = await call.asyncio_detailed(
        sid, client=client, body=models.MemoryRequest(type_=models.MemoryType.OFFLOAD)
    )
    assert refused.status_code == 403  # the default key has no memory:offload scope
    assert isinstance(refused.parsed, models.ErrorResponse)

    definition = await mod("api.memory_tool.memory_tool_definition").asyncio(
        client=client, format_=models.MemoryToolDefinitionFormat.OPENAI
    )
    tool = definition.to_dict()
    assert tool["type"] == "function" and tool["function"]["name"] == "memory"
    assert "offload" not in tool["function"]["parameters"]["properties"]["type"]["enum"]
