// cairn/openai: makes a framework's model calls and function tools durable.
//
// openaiFetch(ctx) is a WHATWG fetch for the `openai` client (and so for
// @openai/agents' chat-completions model): each POST .../chat/completions
// becomes one journaled ctx.tool("llm.chat", ...) call, made by the host with
// its key under the run's grant; on replay the journaled reply comes back and
// no request reaches a model. durableTool(ctx, name, fn) makes a function
// tool's body a step named "tool:NAME", so a replay returns its journaled
// result instead of running the body again. See docs/frameworks.md.
import { createHash } from "node:crypto";

import { ToolError } from "./index.js";

// What llm.chat forwards to the model server (README, "Tools"); anything else
// in a request body would be dropped by the host, so it is not journaled.
const requestFields = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop",
  "seed", "presence_penalty", "frequency_penalty", "n", "tools", "tool_choice", "parallel_tool_calls",
  "response_format"];
const messageFields = ["role", "content", "name", "tool_calls", "tool_call_id"];

// A tool error type as the HTTP status an OpenAI client surfaces; only the
// transient ones invite the client to retry (each retry is one more journaled call).
const statusOf = { refused: 403, too_large: 413, bad_output: 502, failed: 502, unavailable: 503, timeout: 504,
  settled: 409 };
const retryable = new Set(["unavailable", "timeout"]);

function picked(object, fields) {
  const out = {};
  for (const field of fields)
    if (object[field] !== undefined && object[field] !== null) out[field] = object[field];
  return out;
}

function jsonResponse(status, body, headers = {}) {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });
}

function errorResponse(status, message, type, code, retry = false) {
  return jsonResponse(status, { error: { message, type, param: null, code } },
    { "x-should-retry": retry ? "true" : "false" });
}

// The journaled llm.chat result as the `choices[0].message` of a completion.
function messageOf(result) {
  const toolCalls = Array.isArray(result.tool_calls) && result.tool_calls.length > 0 ? result.tool_calls : null;
  const content = typeof result.content === "string" && (result.content !== "" || !toolCalls) ? result.content : null;
  const message = { role: result.role ?? "assistant", content, refusal: null };
  if (toolCalls) message.tool_calls = toolCalls;
  return message;
}

// Server-sent events of one completion, built from the whole journaled reply.
function sseOf(completion, includeUsage) {
  const { id, created, model } = completion;
  const { message, finish_reason: finishReason } = completion.choices[0];
  const chunk = (delta, finish) => ({ id, object: "chat.completion.chunk", created, model,
    choices: [{ index: 0, delta, finish_reason: finish }] });
  const events = [chunk(message.content === null ? { role: message.role } : { role: message.role, content: message.content },
    null)];
  if (message.tool_calls)
    events.push(chunk({ tool_calls: message.tool_calls.map((call, index) => ({ index, ...call })) }, null));
  events.push(chunk({}, finishReason));
  if (includeUsage)
    events.push({ id, object: "chat.completion.chunk", created, model, choices: [], usage: completion.usage });
  return events.map((e) => `data: ${JSON.stringify(e)}\n\n`).join("") + "data: [DONE]\n\n";
}

// A fetch that answers POST .../chat/completions through the host's llm.chat
// and refuses everything else with a 404 naming what it serves. The answer is
// a function of the journaled result and the run id only (no clock, no random
// id), so a replay gives the client byte-identical responses.
export function openaiFetch(ctx) {
  let calls = 0;  // ordinal of this fetch's model calls, the same on every replay
  return async function cairnFetch(input, init = undefined) {
    const request = new Request(input, init);
    const path = new URL(request.url).pathname;
    if (request.method !== "POST" || !path.endsWith("/chat/completions"))
      return errorResponse(404, `cairn's fetch bridge serves only POST .../chat/completions (through the host's ` +
        `llm.chat), not ${request.method} ${path}; with @openai/agents call setOpenAIAPI("chat_completions") or use ` +
        `OpenAIChatCompletionsModel`, "invalid_request_error", "unsupported_endpoint");
    let body;
    try {
      body = JSON.parse(await request.text());
    } catch (e) {
      return errorResponse(400, `the request body is not JSON: ${e.message}`, "invalid_request_error", "bad_body");
    }
    if (body === null || typeof body !== "object" || !Array.isArray(body.messages))
      return errorResponse(400, 'the request body must be an object with a "messages" array',
        "invalid_request_error", "bad_body");
    const args = picked(body, requestFields);
    args.messages = body.messages.map((m) => (m && typeof m === "object" ? picked(m, messageFields) : m));
    const ordinal = calls++;
    let result;
    try {
      result = await ctx.tool("llm.chat", args);
    } catch (e) {
      if (!(e instanceof ToolError)) throw e;  // cancellation, non-determinism: the run's fate, not the client's
      return errorResponse(statusOf[e.type] ?? 500, e.message, "cairn_tool_error", e.type, retryable.has(e.type));
    }
    const id = "chatcmpl-cairn-" + createHash("sha256")
      .update(`${ctx.runId}\n${ordinal}\n${JSON.stringify(result)}`).digest("hex").slice(0, 32);
    const message = messageOf(result);
    const completion = {
      id, object: "chat.completion", created: 0, model: result.model ?? args.model ?? "",
      choices: [{ index: 0, message, finish_reason: result.finish_reason ?? (message.tool_calls ? "tool_calls" : "stop"),
        logprobs: null }],
      usage: result.usage ?? { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 },
    };
    if (body.stream !== true) return jsonResponse(200, completion, { "x-request-id": id });
    return new Response(sseOf(completion, body.stream_options?.include_usage === true),
      { status: 200, headers: { "content-type": "text/event-stream", "x-request-id": id } });
  };
}

// `fn` as a durable step named "tool:NAME": its result is journaled once and a
// replay returns it without calling `fn`. Pass it as a framework tool's
// execute, e.g. tool({name, parameters, execute: durableTool(ctx, name, fn)}).
// The body runs at least once (again only if it crashed before its result was
// journaled); undefined becomes null, since a step's value is JSON.
export function durableTool(ctx, name, fn, options = undefined) {
  return (...args) => ctx.step(`tool:${name}`, async () => {
    const value = await fn(...args);
    return value === undefined ? null : value;
  }, options);
}
