// The memory tool through the generated client. Prints one JSON object;
// tests/clients/test_typescript_client.py asserts on it.
import createClient from "openapi-fetch";
import type { paths } from "./schema.js";

const client = createClient<paths>({
  baseUrl: process.env.CONTEXTD_URL ?? "http://127.0.0.1:8080",
  headers: { Authorization: `Bearer ${process.env.CONTEXTD_API_KEY ?? ""}` },
});
const sessionId = process.env.SESSION_ID ?? "ts-memory";
const session = { params: { path: { session_id: sessionId } } };
const emptySession = { params: { path: { session_id: `${sessionId}-empty` } } };

function fail(step: string, error: unknown): never {
  console.error(`${step}: ${JSON.stringify(error)}`);
  process.exit(1);
}

// sessions are created by their first append
for (const target of [session, emptySession]) {
  const created = await client.POST("/v1/sessions/{session_id}/turns", {
    ...target,
    body: { turns: [{ role: "user", content: "Hi" }] },
  });
  if (!created.data) fail("append_turns", created.error);
}

const remembered = await client.POST("/v1/sessions/{session_id}/memory", {
  ...session,
  body: { type: "remember", text: "User wants invoices by email only, never paper", key: "invoice" },
});
if (!remembered.data) fail("memory remember", remembered.error);

const listed = await client.GET("/v1/sessions/{session_id}/memories", session);
if (!listed.data) fail("list_memories", listed.error);

const recalled = await client.POST("/v1/sessions/{session_id}/memory", {
  ...session,
  body: { type: "recall", query: "how does the user want invoices?" },
});
if (!recalled.data) fail("memory recall", recalled.error);

const nothing = await client.POST("/v1/sessions/{session_id}/memory", {
  ...emptySession,
  body: { type: "recall", query: "zebra migration in Patagonia" },
});
if (!nothing.data) fail("memory recall (no match)", nothing.error);

const status = await client.POST("/v1/sessions/{session_id}/memory", {
  ...session,
  body: { type: "status" },
});
if (!status.data) fail("memory status", status.error);

const refused = await client.POST("/v1/sessions/{session_id}/memory", {
  ...session,
  body: { type: "offload" },
});

const tool = await client.GET("/v1/memory/tool", { params: { query: { format: "openai" } } });
if (!tool.data) fail("memory tool definition", tool.error);

console.log(
  JSON.stringify({
    remember: remembered.data,
    memories: listed.data.memories.map((m) => ({ memory_id: m.memory_id, text: m.text, key: m.key })),
    recall: recalled.data,
    nothing: nothing.data,
    status: status.data,
    refused: { status: refused.response.status, error: refused.error },
    tool: tool.data,
  }),
);
