"""What a newcomer with curl sees for a body that is not JSON: a status and message that say what
to fix and where, never a type error or a character offset posing as a field name."""

import httpx
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
