// Types of cairn/openai (openai.js): a framework's model calls and function
// tools made durable. See docs/frameworks.md.

import type { Context, StepOptions } from "./index.js";

/** A WHATWG fetch, as the `openai` client's `fetch` option takes it. */
export type BridgeFetch = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

/**
 * A fetch that answers POST .../chat/completions with one journaled
 * ctx.tool("llm.chat") call (replayed from the journal after a restart, as a
 * byte-identical response; streamed as server-sent events when the request
 * asks for "stream": true) and anything else with a 404 naming what it serves.
 * A ToolError becomes an OpenAI-shaped HTTP error (403 refused, 413 too_large,
 * 502 failed or bad_output, 409 settled, 503 unavailable, 504 timeout).
 */
export function openaiFetch(ctx: Context): BridgeFetch;

/**
 * `fn` as a durable step named "tool:" + name, for a framework tool's execute:
 * a replay returns the journaled result without calling `fn`. The result must
 * be JSON; undefined becomes null. `options` are ctx.step's (e.g. retry).
 */
export function durableTool<A extends unknown[], R>(
  ctx: Context,
  name: string,
  fn: (...args: A) => R | Promise<R>,
  options?: StepOptions,
): (...args: A) => Promise<[Awaited<R>] extends [undefined | void] ? null : Awaited<R>>;
