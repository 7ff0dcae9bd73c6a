"""A session id holding "/", sent as one percent-encoded path segment (as the clients send every
id), is refused by the session-id rule (422 naming `session_id`), never split by the router into
a 404 or into another route's path."""

import httpx

from app.core.errors import InvalidSessionId


def refused(resp: httpx.Response) -> bool:
    error = resp.json()["error"]
    return (
        resp.status_code == 422
        and error["code"] == "invalid_session_id"
        and error["field"] == "session_id"
        and error["message"] == InvalidSessionId.RULE
    )


async def test_an_encoded_slash_in_a_session_id_is_the_rules_422(client: httpx.AsyncClient) -> None:
    turn = {"role": "user", "content": "Only this one."}
    assert (await client.post("/v1/sessions/x/turns", json={"turns": [turn]})).status_code == 201

    # Decoded, these paths are session x's turns and session a's turns of "b c".
    for method, path, body in (
        ("GET", "/v1/sessions/x%2Fturns", None),
        ("GET", "/v1/sessions/x%2fturns?limit=5", None),
        ("DELETE", "/v1/sessions/x%2Fturns", None),
        ("PUT", "/v1/sessions/a%2Fb%20c", {}),
        ("POST", "/v1/sessions/a%2Fb/turns", {"turns": [turn]}),
        ("POST", "/v1/sessions/a%2F/build-prompt", {}),
    ):
        resp = await client.request(method, path, json=body)
        assert refused(resp), (method, path, resp.status_code, resp.text)

    turns = (await client.get("/v1/sessions/x/turns")).json()["turns"]
    assert [t["content"] for t in turns] == ["Only this one."]  # x neither deleted nor appended
    assert (await client.get("/v1/sessions/a")).status_code == 404
