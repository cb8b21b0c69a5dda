// cairn/openai against a fake context: what each model request journals, the
// responses a client gets (live and on replay), errors, and durable tools.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ToolError } from "../index.js";
import { durableTool, openaiFetch } from "../openai.js";

const url = "https://cairn.invalid/v1/chat/completions";

// Answers llm.chat from `replies` in order, recording each call's arguments.
function fakeCtx(replies) {
  const calls = [];
  return {
    runId: "run-1",
    calls,
    async tool(name, args) {
      calls.push({ name, args });
      const reply = replies[calls.length - 1];
      if (reply instanceof Error) throw reply;
      return structuredClone(reply);
    },
    async step(name, fn, options) {
      calls.push({ name, options });
      return fn();
    },
  };
}

const textReply = { content: "Hello.", role: "assistant", model: "m", finish_reason: "stop",
  usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 } };
const callReply = { content: "", role: "assistant", model: "m", finish_reason: "tool_calls",
  tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Oslo"}' } }] };

function post(fetch, body) {
  return fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
}

test("a chat completion request is one llm.chat call with the fields llm.chat forwards", async () => {
  const ctx = fakeCtx([textReply]);
  const response = await post(openaiFetch(ctx), {
    model: "m", stream: false, store: true, metadata: { a: 1 }, temperature: null, top_p: 0.5,
    messages: [{ role: "user", content: "hi", refusal: null, audio: {} }],
    tools: [{ type: "function", function: { name: "f", parameters: {} } }],
  });
  assert.equal(response.status, 200);
  assert.deepEqual(ctx.calls, [{ name: "llm.chat", args: {
    model: "m", top_p: 0.5, messages: [{ role: "user", content: "hi" }],
    tools: [{ type: "function", function: { name: "f", parameters: {} } }] } }]);
  const completion = await response.json();
  assert.equal(completion.object, "chat.completion");
  assert.deepEqual(completion.choices[0].message, { role: "assistant", content: "Hello.", refusal: null });
  assert.equal(completion.choices[0].finish_reason, "stop");
  assert.deepEqual(completion.usage, textReply.usage);
});

test("a replayed reply gives a byte-identical response, and the id depends on the run and the call", async () => {
  const live = await (await post(openaiFetch(fakeCtx([textReply, textReply])), { messages: [] })).text();
  const replay = await (await post(openaiFetch(fakeCtx([textReply])), { messages: [] })).text();
  assert.equal(replay, live);
  const bridge = openaiFetch(fakeCtx([textReply, textReply]));
  const first = await (await post(bridge, { messages: [] })).json();
  const second = await (await post(bridge, { messages: [] })).json();
  assert.notEqual(first.id, second.id);
  assert.match(first.id, /^chatcmpl-cairn-[0-9a-f]{32}$/);
  assert.equal(first.created, 0);
});

test("tool calls come back with null content and finish_reason tool_calls", async () => {
  const completion = await (await post(openaiFetch(fakeCtx([callReply])), { messages: [] })).json();
  assert.equal(completion.choices[0].message.content, null);
  assert.deepEqual(completion.choices[0].message.tool_calls, callReply.tool_calls);
  assert.equal(completion.choices[0].finish_reason, "tool_calls");
});

test("a streaming request gets server-sent events built from the one journaled reply", async () => {
  const ctx = fakeCtx([{ ...callReply, content: "Checking.", usage: textReply.usage }]);
  const response = await post(openaiFetch(ctx), { messages: [], stream: true, stream_options: { include_usage: true } });
  assert.equal(response.headers.get("content-type"), "text/event-stream");
  assert.equal(ctx.calls[0].args.stream, undefined);
  const events = (await response.text()).split("\n\n").filter(Boolean).map((e) => e.replace(/^data: /, ""));
  assert.equal(events.at(-1), "[DONE]");
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
  assert.ok(chunks.every((c) => c.object === "chat.completion.chunk"));
  assert.equal(chunks.map((c) => c.choices[0]?.delta.content ?? "").join(""), "Checking.");
  assert.deepEqual(chunks[1].choices[0].delta.tool_calls, [{ index: 0, ...callReply.tool_calls[0] }]);
  assert.equal(chunks[2].choices[0].finish_reason, "tool_calls");
  assert.deepEqual(chunks[3].usage, textReply.usage);
});

test("a ToolError is an OpenAI-shaped HTTP error; only transient ones invite a retry", async () => {
  const cases = [["refused", 403, "false"], ["failed", 502, "false"], ["unavailable", 503, "true"],
    ["timeout", 504, "true"]];
  for (const [type, status, retry] of cases) {
    const ctx = fakeCtx([new ToolError("llm.chat", type, `llm.chat: it was ${type}`)]);
    const response = await post(openaiFetch(ctx), { messages: [{ role: "user", content: "hi" }] });
    assert.equal(response.status, status);
    assert.equal(response.headers.get("x-should-retry"), retry);
    const body = await response.json();
    assert.equal(body.error.code, type);
    assert.match(body.error.message, new RegExp(type));
  }
});

test("an error that is not a ToolError (a cancellation) is not turned into a response", async () => {
  const ctx = fakeCtx([new Error("cancelled by the operator")]);
  await assert.rejects(post(openaiFetch(ctx), { messages: [] }), /cancelled by the operator/);
});

test("another endpoint or method gets a 404 naming what is served, and nothing is journaled", async () => {
  const ctx = fakeCtx([]);
  const bridge = openaiFetch(ctx);
  for (const response of [await bridge("https://cairn.invalid/v1/models"),
    await bridge("https://cairn.invalid/v1/responses", { method: "POST", body: "{}" }),
    await bridge(url, { method: "GET" })]) {
    assert.equal(response.status, 404);
    assert.match((await response.json()).error.message, /POST \.\.\.\/chat\/completions/);
  }
  const bad = await bridge(url, { method: "POST", body: "{not json" });
  assert.equal(bad.status, 400);
  assert.deepEqual(ctx.calls, []);
});

test("durableTool runs the body as a step named tool:NAME and journals undefined as null", async () => {
  const ctx = fakeCtx([]);
  const seen = [];
  const execute = durableTool(ctx, "lookup", async (input, extra) => { seen.push([input, extra]); }, { retry: {} });
  assert.equal(await execute({ q: 1 }, "context"), null);
  assert.deepEqual(seen, [[{ q: 1 }, "context"]]);
  assert.deepEqual(ctx.calls, [{ name: "tool:lookup", options: { retry: {} } }]);
});
