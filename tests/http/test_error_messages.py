"""What a newcomer with curl sees for a body that is not JSON: a status and message that say what
to fix and where, never a type error or a character offset posing as a field name."""

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.sessions.test_bad_input import tenant_rows


async def test_a_form_encoded_body_is_415_naming_the_content_type(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    # what `curl -d '{...}'` sends without -H 'Content-Type: application/json'
    resp = await client.post(
        "/v1/sessions/ct/turns",
        content=b'{"turns":[{"role":"user","content":"hi"}]}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert resp.status_code == 415
    assert resp.json() == {
        "error": {
            "code": "unsupported_media_type",
            "message": "the body was sent as 'application/x-www-form-urlencoded'; send JSON "
            "with 'Content-Type: application/json'",
            "field": "Content-Type",
        }
    }
    assert await tenant_rows(engine, tenant_name) == (0, 0)


async def test_a_body_without_content_type_is_415_too(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/v1/sessions/ct/turns", content=b'{"turns":[{"role":"user","content":"hi"}]}'
    )
    assert resp.status_code == 415
    assert resp.json()["error"]["message"] == (
        "the body was sent without a Content-Type header; send JSON with "
        "'Content-Type: application/json'"
    )


async def test_malformed_json_names_line_and_column(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str
) -> None:
    body = '{"turns": [\n  {"role": "user" "content": "hi"}\n]}'
    resp = await client.post(
        "/v1/sessions/mj/turns", content=body, headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 422
    assert resp.json() == {
        "error": {
            "code": "malformed_json",
            "message": "malformed JSON at line 2, column 19 (character 30): "
            "Expecting ',' delimiter",
            "field": "body",
        }
    }
    assert body[30] == '"'  # the column points at the token where the comma was expected
    assert await tenant_rows(engine, tenant_name) == (0, 0)


@pytest.mark.parametrize(
    ("path", "body", "field", "code"),
    [
        ("/v1/sessions/fq/build-prompt", {"query": 5}, "query", "wrong_type"),
        ("/v1/sessions/fq/memory", {"type": "recall", "query": 5}, "query", "wrong_type"),
        ("/v1/sessions/fq/memory", {"type": "recall", "query": ""}, "query", "invalid_input"),
        (
            "/v1/sessions/fq/build-prompt",
            {"system": [{"role": "user", "content": "You are a travel agent."}]},
            "system[0].role",
            "invalid_value",
        ),
    ],
    ids=["build-prompt query", "recall query", "empty recall query", "system message role"],
)
async def test_a_field_named_query_and_a_union_member_are_named_as_sent(
    client: httpx.AsyncClient, path: str, body: dict[str, object], field: str, code: str
) -> None:
    """`query` is also where FastAPI says a query-string parameter came from: only the location
    is left out of the name. A union (`system`: text or messages) is answered about the member
    the value was meant for, without pydantic's member tags in the name."""
    resp = await client.post(path, json=body)
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert (error["field"], error["code"]) == (field, code)


@pytest.mark.parametrize(
    "content",
    [b"[1, 2]", b'"Book the 9:40 train"', b"42"],
    ids=["array", "string", "number"],
)
async def test_a_body_that_is_not_an_object_is_named_body(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant_name: str, content: bytes
) -> None:
    for path in ("/v1/sessions/nb/turns", "/v1/sessions/nb/build-prompt", "/v1/sessions/nb"):
        method = "PUT" if path == "/v1/sessions/nb" else "POST"
        resp = await client.request(
            method, path, content=content, headers={"Content-Type": "application/json"}
        )
        assert resp.status_code == 422, path
        assert resp.json() == {
            "error": {
                "code": "wrong_type",
                "message": "the body should be a JSON object",
                "field": "body",
            }
        }, path
    assert await tenant_rows(engine, tenant_name) == (0, 0)


async def test_a_body_that_is_not_utf8_is_named_body(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/v1/sessions/nu/turns",
        content=b'{"turns": [{"role": "user", "content": "caf\xe9"}]}',
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 422
    assert resp.json()["error"] == {
        "code": "malformed_json",
        "message": "the body is not UTF-8 encoded JSON",
        "field": "body",
    }


async def test_a_header_is_named_as_it_is_written(client: httpx.AsyncClient) -> None:
    resp = await client.post(
        "/v1/sessions/hd/turns",
        json={"turns": [{"role": "user", "content": "hi"}]},
        headers={"Idempotency-Key": "k" * 300},
    )
    assert resp.status_code == 422
    assert resp.json()["error"]["field"] == "Idempotency-Key"
