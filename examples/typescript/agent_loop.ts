// A minimal agent loop on contextd and any OpenAI-compatible chat API (Node 20, global fetch, no
// runtime dependencies). Each line on stdin is one user message (or pass messages as arguments).
// Per message:
//   1. the user turn is stored: POST /v1/sessions/{id}/turns with an Idempotency-Key, so a
//      retried request never stores it twice;
//   2. contextd builds the prompt: POST /v1/sessions/{id}/build-prompt returns messages that fit
//      the model's window (the latest user turn is the recall query);
//   3. the model answers (POST {OPENAI_BASE_URL}/chat/completions, with contextd's `memory` tool);
//   4. the answer is appended as a turn; if the model called `memory`, the call goes to
//      POST /v1/sessions/{id}/memory, its `text` is appended as the tool result, and the loop goes
//      back to 2 until the model answers in plain text.
// Network errors, 429 and 5xx are retried (same request, same Idempotency-Key); a server that
// cannot be reached is named in the error. Final answers go to stdout, tool calls to stderr.
//
// Environment: CONTEXTD_URL (default http://127.0.0.1:8080), CONTEXTD_API_KEY (optional),
// OPENAI_BASE_URL (including /v1, default https://api.openai.com/v1), OPENAI_API_KEY,
// MODEL (default gpt-4o-mini), SESSION_ID (default agent-demo), SYSTEM_PROMPT, MAX_TOOL_ROUNDS (5),
// MAX_RETRIES (3).
//
// Run: npm install && npm run build && node dist/agent_loop.js "Hello!"   (or pipe lines in)
import { createInterface } from "node:readline";

type Json = Record<string, unknown>;
interface ToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments?: string };
}
interface ChatMessage {
  role: string;
  content?: string | null;
  tool_calls?: ToolCall[] | null;
}

const env = process.env;
const CONTEXTD_URL = (env.CONTEXTD_URL ?? "http://127.0.0.1:8080").replace(/\/$/, "");
const OPENAI_BASE_URL = (env.OPENAI_BASE_URL ?? "https://api.openai.com/v1").replace(/\/$/, "");
const MODEL = env.MODEL ?? "gpt-4o-mini";
const SESSION = env.SESSION_ID ?? "agent-demo";
// The id as one path segment: the server's session-id rule, not the router, refuses what it must.
const SESSION_PATH = `/v1/sessions/${encodeURIComponent(SESSION)}`;
const MAX_ROUNDS = Number(env.MAX_TOOL_ROUNDS ?? "5");
const MAX_RETRIES = Number(env.MAX_RETRIES ?? "3");
const RETRY_STATUSES = new Set([429, 500, 502, 503, 504]);
const SYSTEM_PROMPT =
  env.SYSTEM_PROMPT ??
  "You are a helpful assistant. Earlier parts of long conversations may have been moved out of " +
    "your context; use the memory tool to look them up instead of guessing.";

const contextdHeaders: Record<string, string> = { "Content-Type": "application/json" };
if (env.CONTEXTD_API_KEY) contextdHeaders.Authorization = `Bearer ${env.CONTEXTD_API_KEY}`;

class ContextdError extends Error {}

/** One request, retried on network errors, 429 and 5xx with the same method, body and headers
 *  (so an append's Idempotency-Key makes a retry a no-op); an unreachable server is named. */
async function send(base: string, what: string, path: string, init: RequestInit): Promise<Response> {
  for (let attempt = 0; ; attempt++) {
    try {
      const resp = await fetch(`${base}${path}`, init);
      if (!RETRY_STATUSES.has(resp.status) || attempt >= MAX_RETRIES) return resp;
    } catch (err) {
      if (attempt >= MAX_RETRIES) {
        const cause = (err as { cause?: { code?: string; message?: string } }).cause;
        throw new Error(`cannot reach ${what} at ${base}: ${cause?.code ?? cause?.message ?? String(err)}`);
      }
    }
    await new Promise((done) => setTimeout(done, 500 * 2 ** attempt));
  }
}

async function contextd(method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<Response> {
  return send(CONTEXTD_URL, "contextd (CONTEXTD_URL)", path, {
    method,
    headers: { ...contextdHeaders, ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

async function contextdJson<T>(
  method: string,
  path: string,
  body?: unknown,
  headers?: Record<string, string>,
): Promise<T> {
  const resp = await contextd(method, path, body, headers);
  if (resp.status >= 400) {
    throw new ContextdError(`${method} ${path}: HTTP ${resp.status} ${await resp.text()}`);
  }
  return (await resp.json()) as T;
}

/** contextd's `memory` tool definition, ready for function calling (none if absent). */
async function memoryTool(): Promise<Json[]> {
  const resp = await contextd("GET", "/v1/memory/tool?format=openai");
  if (resp.status === 404) return []; // a contextd without the memory tool: plain chat
  if (resp.status >= 400) {
    throw new ContextdError(`GET /v1/memory/tool: HTTP ${resp.status} ${await resp.text()}`);
  }
  return [(await resp.json()) as Json];
}

async function append(turn: Json): Promise<void> {
  const key = { "Idempotency-Key": crypto.randomUUID() }; // one key for every retry of this append
  await contextdJson("POST", `${SESSION_PATH}/turns`, { turns: [turn] }, key);
}

/** Run one tool call; errors go back to the model as the tool result, not a crash. */
async function callMemory(call: ToolCall): Promise<string> {
  if (call.function.name !== "memory") return `error: unknown tool '${call.function.name}'`;
  let args: Json;
  try {
    args = JSON.parse(call.function.arguments || "{}") as Json;
  } catch (err) {
    return `error: arguments are not JSON (${String(err)})`;
  }
  const resp = await contextd("POST", `${SESSION_PATH}/memory`, args);
  if (resp.status >= 400) {
    const body = (await resp.json().catch(() => ({}))) as { error?: { code?: string; message?: string } };
    return `error: ${body.error?.code ?? resp.status}: ${body.error?.message ?? ""}`;
  }
  const text = ((await resp.json()) as { text: string }).text;
  console.error(`memory ${String(args.type)}: ${text.split("\n")[0] ?? ""}`);
  return text;
}

async function reply(userText: string, tools: Json[]): Promise<string> {
  await append({ role: "user", content: userText });
  for (let round = 0; round < MAX_ROUNDS; round++) {
    const prompt = await contextdJson<{ messages: Json[] }>(
      "POST",
      `${SESSION_PATH}/build-prompt`,
      { system: SYSTEM_PROMPT, tools, format: "openai" },
    );
    const request: Json = { model: MODEL, messages: prompt.messages };
    if (tools.length > 0) request.tools = tools;
    const resp = await send(OPENAI_BASE_URL, "the chat API (OPENAI_BASE_URL)", "/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${env.OPENAI_API_KEY ?? ""}` },
      body: JSON.stringify(request),
    });
    if (resp.status >= 400) throw new Error(`chat API: HTTP ${resp.status} ${await resp.text()}`);
    const completion = (await resp.json()) as { choices: { message: ChatMessage }[] };
    const message = completion.choices[0].message;
    const calls = message.tool_calls ?? [];
    const content = calls.length > 0 ? (message.content ?? null) : (message.content ?? "");
    await append({ role: "assistant", content, tool_calls: calls.length > 0 ? calls : null });
    if (calls.length === 0) return content ?? "";
    for (const call of calls) {
      await append({ role: "tool", tool_call_id: call.id, content: await callMemory(call) });
    }
  }
  return `(no answer after ${MAX_ROUNDS} model calls)`;
}

async function* userMessages(): AsyncGenerator<string> {
  const args = process.argv.slice(2);
  if (args.length > 0) {
    yield* args;
    return;
  }
  for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    yield line.trim();
  }
}

try {
  const tools = await memoryTool();
  for await (const text of userMessages()) {
    if (text) console.log(await reply(text, tools));
  }
} catch (err) {
  console.error(`agent_loop: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
}
