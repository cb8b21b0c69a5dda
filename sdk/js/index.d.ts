// Types of cairn's JavaScript/TypeScript SDK (index.js). docs/typescript.md
// explains the API; protocol/PROTOCOL.md, the wire protocol under it.

/** Any value a journal holds: what JSON can represent. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/**
 * How a failing step asks to be retried; the host decides from this and the
 * run's policy. After attempt n fails it waits
 * min(initialDelayMs * multiplier^(n-1), maxDelayMs), scaled by a random
 * factor in [1 - jitter, 1], then makes attempt n+1.
 */
export interface RetryOptions {
  /** Attempts in all, at most the run policy's retry.step_attempts. Default 3. */
  maxAttempts?: number;
  /** Default 100. */
  initialDelayMs?: number;
  /** Default 2. */
  multiplier?: number;
  /** Default 10 000. */
  maxDelayMs?: number;
  /** Longest one attempt may run, enforced by the host (it kills the sandbox); 0: the policy's default. */
  timeoutMs?: number;
  /** In [0, 1]; 0 gives the exact delays. Default 0.2. */
  jitter?: number;
}

export interface StepOptions {
  retry?: RetryOptions;
}

export interface WaitOptions {
  /** Give up after this long; absent: wait without a limit. */
  timeoutMs?: number;
}

/** A started child run, as ctx.startChild returns it. */
export interface ChildHandle {
  readonly runId: string;
}

/**
 * The workflow's view of its run. Journaled calls (step, tool, sleep,
 * sleepUntil, waitSignal, startChild, join, now, random) are performed one at
 * a time in the order they were called, also when the workflow calls them
 * concurrently; each rejects with CancelledError once the run is cancelled,
 * also while it waits for a timer, signal or child. None may be called inside
 * a step's function.
 */
export interface Context {
  /**
   * Runs `fn` and journals its result; on replay returns the journaled result
   * without calling `fn`. The result must be JSON (NaN, Infinity, BigInt, a
   * Map or Set fail the step for good); the step resolves to it as replay
   * will return it (a Date becomes its ISO string). Rejects with StepFailed
   * once its attempts are exhausted; a TerminalError thrown by `fn` ends them
   * at once. `name` must be the same on every execution.
   */
  step<T>(name: string, fn: () => T | Promise<T>, options?: StepOptions): Promise<Awaited<T>>;
  /** Calls a host tool granted by the run's policy (e.g. "llm.chat", "http.fetch"); rejects with ToolError. */
  tool<T = Json>(name: string, args?: unknown): Promise<T>;
  /** A durable timer: survives restarts, and is not waited for again on replay. */
  sleep(ms: number): Promise<void>;
  sleepUntil(time: Date | number): Promise<void>;
  /** The signal's payload (null if it has none), or null when `timeoutMs` passed first. */
  waitSignal<T = Json>(name: string, options?: WaitOptions): Promise<T | null>;
  /** Starts a child run of `agent` without waiting for it; rejects with ChildError when the host refuses. */
  startChild(agent: string, input?: unknown): Promise<ChildHandle>;
  /** The child's output; rejects with ChildFailed when it failed or was cancelled. */
  join<T = Json>(child: ChildHandle): Promise<T>;
  /** The wall clock, journaled as "ctx.now" (integer ms). */
  now(): Promise<Date>;
  /** A uniform number in [0, 1), journaled as "ctx.random". */
  random(): Promise<number>;
  /**
   * Whether this run takes the branch of patch `id` (Temporal's `patched`):
   * `if (await ctx.patched("fix-rounding")) { new code } else { old code }`.
   * True in a run that reaches this point with this code (a marker is
   * journaled, so its replays take the same branch), false in a run whose
   * journal was written by code that passed this point without it. Remove
   * the call only when no run that recorded it can replay again.
   */
  patched(id: string): Promise<boolean>;
  /** A live, non-durable event for whoever watches the run; dropped while replaying. */
  emit(data: unknown): void;
  /** True once the host's cancel has arrived (read whenever the workflow awaits). */
  readonly cancelled: boolean;
  readonly runId: string;
  /** The run's attempt, 1-based: each start of its sandbox counts. */
  readonly attempt: number;
  /** True while the workflow is fast-forwarded through journaled operations. */
  readonly replaying: boolean;
}

export type Workflow<I = any, O = unknown> = (ctx: Context, input: I) => O | Promise<O>;

/**
 * Runs `workflow` as the agent of the run that started this process (the
 * channel is fd CAIRN_CHANNEL_FD), then exits: 0 after done, 1 after the run
 * failed, 2 when not started by cairn, 3 when the host broke the channel.
 */
export function main<I = any, O = unknown>(workflow: Workflow<I, O>): void;

/** Throw from a step to fail it at once, without further attempts. */
export class TerminalError extends Error {}

/** A step failed for good; also thrown again on replay of that step. */
export class StepFailed extends Error {
  constructor(step: string, type: string, cause: string);
  readonly step: string;
  /** The class name of what the step threw, e.g. "TypeError". */
  readonly type: string;
  /** Its message. */
  readonly cause: string;
}

/** A tool call did not succeed. */
export class ToolError extends Error {
  constructor(tool: string, type: string, message: string);
  readonly tool: string;
  /** "refused", "timeout", "too_large", "bad_output", "unavailable", "failed" or "settled". */
  readonly type: string;
}

/** The run was cancelled; the run ends cancelled even if the workflow catches this. */
export class CancelledError extends Error {
  constructor(reason: string);
  readonly reason: string;
}

/** The host did not start a child run. */
export class ChildError extends Error {
  constructor(agent: string, type: string, message: string);
  readonly agent: string;
  /** "no_such_agent" or "refused". */
  readonly type: string;
}

/** A joined child run failed or was cancelled. */
export class ChildFailed extends Error {
  constructor(runId: string, type: string, cause: string);
  readonly runId: string;
  /** "child_failed", "child_cancelled" or "refused". */
  readonly type: string;
  /** The child's error message. */
  readonly cause: string;
}

/** The code no longer matches the journal; the run fails even if this is caught. */
export class NondeterminismError extends Error {}
