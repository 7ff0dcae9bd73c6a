// Uses the client generated from openapi/openapi.json (openapi-typescript types + openapi-fetch)
// against a live contextd and prints what it got as one JSON object on stdout; the Python test
// (tests/clients/test_typescript_client.py) asserts on it. Compiled with `tsc --strict`, so a
// request or response that does not match the generated types fails the test before it runs.
import createClient from "openapi-fetch";
import type { paths } from "./schema.js";

const baseUrl = process.env.CONTEXTD_URL ?? "http://127.0.0.1:8080";
const apiKey = process.env.CONTEXTD_API_KEY ?? "";
const sessionId = process.env.SESSION_ID ?? "ts-client";

const client = createClient<paths>({
  baseUrl,
  headers: { Authorization: `Bearer ${apiKey}` },
});
const session = { params: { path: { session_id: sessionId } } };

function fail(step: string, error: unknown): never {
  console.error(`${step}: ${JSON.stringify(error)}`);
  process.exit(1);
}

const configured = await client.PUT("/v1/sessions/{session_id}", {
  ...session,
  body: { context_limit: 16000, reserve_tokens: 2000 },
});
if (!configured.data) fail("configure_session", configured.error);

const firstTurns = {
  turns: [
    { role: "user" as const, content: "Book the 9:40 train to Lyon. Budget at most 120 EUR." },
    { role: "assistant" as const, content: "Booked: ticket LY-40917, 96 EUR." },
  ],
};
const withKey = { path: { session_id: sessionId }, header: { "idempotency-key": "ts-1" } };

const appended = await client.POST("/v1/sessions/{session_id}/turns", {
  params: withKey,
  body: firstTurns,
});
if (!appended.data) fail("append_turns", appended.error);

// the same Idempotency-Key and body: the first answer again, nothing written
const replayed = await client.POST("/v1/sessions/{session_id}/turns", {
  params: withKey,
  body: firstTurns,
});
if (!replayed.data) fail("append_turns replay", replayed.error);

// the same key with another body: a typed error, not a write
const conflicting = await client.POST("/v1/sessions/{session_id}/turns", {
  params: withKey,
  body: { turns: [{ role: "user", content: "Something else." }] },
});

const built = await client.POST("/v1/sessions/{session_id}/build-prompt", {
  ...session,
  body: {
    system: "You are a travel agent.",
    query: "Which ticket did you book?",
    append: true,
    format: "openai",
  },
});
if (!built.data) fail("build_prompt", built.error);

const listed = await client.GET("/v1/sessions/{session_id}/turns", {
  params: { path: { session_id: sessionId }, query: { limit: 10, role: "user" } },
});
if (!listed.data) fail("list_turns", listed.error);

const viewed = await client.GET("/v1/sessions/{session_id}", session);
if (!viewed.data) fail("get_session", viewed.error);

const invalid = await client.POST("/v1/sessions/{session_id}/turns", {
  ...session,
  // a role outside the enum: the type checker would refuse it, so it is cast on purpose
  body: { turns: [{ role: "wizard" as "user", content: "hi" }] },
});

console.log(
  JSON.stringify({
    configured: configured.data,
    appended: appended.data,
    replayed: replayed.data,
    conflicting: { status: conflicting.response.status, error: conflicting.error },
    built: built.data,
    listed: listed.data,
    viewed: viewed.data,
    invalid: { status: invalid.response.status, error: invalid.error },
  }),
);
