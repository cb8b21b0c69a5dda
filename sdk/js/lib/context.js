// The workflow's view of its run (ctx). Journaled operations are performed
// one at a time in the order they were called, whatever the workflow awaits
// first: each call takes its place in a queue synchronously, so code that
// calls ctx concurrently (Promise.all over tool calls) replays in the same
// order and matches its journal.

import { AsyncLocalStorage } from "node:async_hooks";
import { ChildError, ChildFailed, StepFailed, TerminalError, ToolError } from "./errors.js";
import { maxDurationMs, maxErrorMessageBytes, maxNameBytes } from "./messages.js";
import { toWellFormed } from "./well_formed.js";
import { FrameTooLarge, clip, safeString, toJsonText } from "./wire.js";

const defaultRetry = {
  maxAttempts: 3,
  initialDelayMs: 100,
  multiplier: 2,
  maxDelayMs: 10_000,
  timeoutMs: 0,
  jitter: 0.2,
};

// `value` as a name the protocol accepts (a step, tool, signal or agent name, a run id).
function nameOf(value, what) {
  if (typeof value !== "string") throw new TypeError(`${what} must be a string, not ${typeof value}`);
  const name = toWellFormed(value);
  const bytes = Buffer.byteLength(name);
  if (bytes === 0 || bytes > maxNameBytes)
    throw new RangeError(`${what} must be 1 to ${maxNameBytes} bytes of UTF-8, not ${bytes}`);
  return name;
}

function number(value, what) {
  if (typeof value !== "number" || Number.isNaN(value)) throw new TypeError(`${what} must be a number`);
  return value;
}

// A duration for the wire: whole milliseconds within [0, 100 years].
function wireMs(value, what) {
  return Math.min(Math.max(Math.floor(number(value, what)), 0), maxDurationMs);
}

// The begin message's tail: the attempt's timeout and the retries asked for
// (PROTOCOL.md §3.2); the host decides every retry from them and its policy.
function retryRequest(retry) {
  const r = { ...defaultRetry, ...retry };
  const attempts = Math.min(Math.max(Math.floor(number(r.maxAttempts, "retry.maxAttempts")), 1), 1_000_000);
  const multiplier = Math.min(Math.max(number(r.multiplier, "retry.multiplier"), 0), 1000);
  const jitter = Math.min(Math.max(number(r.jitter, "retry.jitter"), 0), 1);
  return (
    `"timeout_ms":${wireMs(r.timeoutMs, "retry.timeoutMs")},"max_attempts":${attempts},` +
    `"initial_delay_ms":${wireMs(r.initialDelayMs, "retry.initialDelayMs")},"multiplier":${multiplier},` +
    `"max_delay_ms":${wireMs(r.maxDelayMs, "retry.maxDelayMs")},"jitter":${jitter}}`
  );
}
const noRetry = retryRequest({ maxAttempts: 1 });

// What a failed attempt reports: the error's message and its class name.
function errorOf(e) {
  if (!(e instanceof Error)) {
    const message = clip(`a value that is not an Error was thrown: ${safeString(e)}`, maxErrorMessageBytes);
    return { message, type: "unknown" };
  }
  const type = clip(e.constructor?.name || e.name || "Error", maxNameBytes);
  return { message: clip(safeString(e.message), maxErrorMessageBytes), type };
}

// What the code receives from a live step: the value as replay will return
// it, parsed back from the journaled text (a Date becomes its string, an
// undefined member disappears), so that live and replayed runs see the same.
function asReplayed(value, text) {
  switch (typeof value) {
    case "undefined":
      return null;
    case "boolean":
      return value;
    case "number":
      return value + 0; // -0 is journaled as 0
    case "string":
      return toWellFormed(value);
    default:
      return value === null ? null : JSON.parse(text);
  }
}

export class Context {
  #s;
  #tail = Promise.resolve();
  #inStep = new AsyncLocalStorage();

  constructor(session) {
    this.#s = session;
  }

  get runId() {
    return this.#s.start.run_id;
  }
  // The run's attempt, 1-based: each start of its sandbox counts.
  get attempt() {
    return this.#s.start.attempt;
  }
  get replaying() {
    return this.#s.replaying;
  }
  // True once the host's cancel has arrived (it is read whenever the workflow awaits).
  get cancelled() {
    return this.#s.cancelReason !== null;
  }

  step(name, fn, options = {}) {
    return this.#call(() => {
      const n = nameOf(name, "a step's name");
      if (typeof fn !== "function") throw new TypeError(`step '${n}' needs a function to run`);
      const retry = retryRequest(options.retry);
      return () => this.#runStep(n, "step", fn, retry);
    });
  }

  tool(name, args = {}) {
    return this.#call(() => {
      const n = nameOf(name, "a tool's name");
      const argsText = toJsonText(args, `the arguments of tool '${n}'`);
      const head = `{"t":"tool","name":${JSON.stringify(n)},"args":${argsText},"seq":`;
      return async () => {
        const r = await this.#hostOperation(n, "tool", (seq) => `${head}${seq}}`);
        if (r.status === "ok") return r.output;
        throw new ToolError(n, r.error.type ?? "error", r.error.message);
      };
    });
  }

  sleep(ms) {
    return this.#call(() => {
      const d = wireMs(ms, "ctx.sleep's duration");
      return () => this.#sleep((seq) => `{"t":"sleep","seq":${seq},"duration_ms":${d}}`);
    });
  }

  sleepUntil(time) {
    return this.#call(() => {
      const t = number(time instanceof Date ? time.getTime() : time, "ctx.sleepUntil's time");
      // Saturates at 100 years from now, as a sleep does.
      return () => this.#sleep((seq) => {
        const until = Math.max(Math.min(Math.floor(t), Date.now() + maxDurationMs), 0);
        return `{"t":"sleep","seq":${seq},"until_ms":${until}}`;
      });
    });
  }

  waitSignal(name, options = {}) {
    return this.#call(() => {
      const n = nameOf(name, "a signal's name");
      const { timeoutMs } = options;
      // No timeout, or one of 100 years or more, waits without a limit.
      const unlimited = timeoutMs == null || number(timeoutMs, "timeoutMs") >= maxDurationMs;
      const limit = unlimited ? "" : `,"timeout_ms":${wireMs(timeoutMs, "timeoutMs")}`;
      const head = `{"t":"wait","signal":${JSON.stringify(n)}${limit},"seq":`;
      return async () => {
        const r = await this.#hostOperation(n, "signal", (seq) => `${head}${seq}}`);
        const output = this.#outputOf(r, "timed_out");
        if (output.timed_out === true) return null;
        return this.#outputOf(r, "payload").payload;
      };
    });
  }

  startChild(agent, input = {}) {
    return this.#call(() => {
      const a = nameOf(agent, "a child's agent");
      const inputText = toJsonText(input, `the input of child agent '${a}'`);
      const head = `{"t":"child","agent":${JSON.stringify(a)},"input":${inputText},"seq":`;
      return async () => {
        const r = await this.#hostOperation(a, "child", (seq) => `${head}${seq}}`);
        if (r.status !== "ok") throw new ChildError(a, r.error.type ?? "error", r.error.message);
        const runId = this.#outputOf(r, "run_id").run_id;
        if (typeof runId !== "string")
          throw this.#s.broken(`the host's child result for seq ${r.seq} has a run_id that is not a string`);
        return { runId };
      };
    });
  }

  join(child) {
    return this.#call(() => {
      const id = nameOf(child?.runId, "a child's runId");
      const head = `{"t":"join","run_id":${JSON.stringify(id)},"seq":`;
      return async () => {
        const r = await this.#hostOperation(id, "join", (seq) => `${head}${seq}}`);
        if (r.status === "ok") return r.output;
        throw new ChildFailed(id, r.error.type ?? "error", r.error.message);
      };
    });
  }

  now() {
    return this.#call(() => async () => new Date(await this.#runStep("ctx.now", "now", Date.now, noRetry)));
  }

  random() {
    return this.#call(() => () => this.#runStep("ctx.random", "random", Math.random, noRetry));
  }

  // True in a run that reaches this point with this code (a marker is
  // journaled), false in one whose journal old code wrote past it (PROTOCOL.md §4.1).
  patched(id) {
    return this.#call(() => {
      const n = nameOf(id, "a patch id");
      return async () => {
        const s = this.#s;
        const replayed = await s.replayPatch(n);
        if (replayed !== null) return replayed;
        const seq = s.nextSeq++;
        const attempt = s.firstAttemptFor(seq);
        const head = `{"t":"step","seq":${seq},"name":${JSON.stringify(n)},"kind":"patch"`;
        s.send(`${head},"status":"ok","output":true,"attempt":${attempt}}`);
        await s.report(seq, true); // an ok step is acknowledged, never retried
        return true;
      };
    });
  }

  // A live, non-durable event for whoever watches the run; dropped while replaying.
  emit(data) {
    const text = toJsonText(data, "the data of ctx.emit");
    if (!this.#s.replaying) this.#s.send(`{"t":"emit","data":${text}}`);
  }

  // Checks a call's arguments now (`prepare` throws) and queues the
  // operation `prepare` returns behind every operation called before it.
  #call(prepare) {
    let perform;
    try {
      if (this.#inStep.getStore())
        throw new Error(
          "ctx.step, tool, sleep, sleepUntil, waitSignal, startChild, join, now, random and patched cannot " +
            "be called inside a step's function",
        );
      perform = prepare();
    } catch (e) {
      return Promise.reject(e);
    }
    const done = this.#tail.then(() => {
      this.#s.checkUsable();
      return perform();
    });
    this.#tail = done.then(noop, noop);
    return done;
  }

  // A step, now or random: the journaled record on replay, else attempts
  // until the host acknowledges one.
  async #runStep(name, kind, fn, retry) {
    const s = this.#s;
    const recorded = await s.replayNext(name, kind);
    if (recorded) {
      if (recorded.status === "ok") return recorded.output;
      throw new StepFailed(name, recorded.error.type ?? "error", recorded.error.message);
    }
    const seq = s.nextSeq++;
    const head = `{"t":"step","seq":${seq},"name":${JSON.stringify(name)},"kind":"${kind}"`;
    const begin = `{"t":"begin","seq":${seq},"name":${JSON.stringify(name)},"kind":"${kind}",`;
    for (let attempt = s.firstAttemptFor(seq); ; ) {
      s.send(`${begin}"attempt":${attempt},${retry}`);
      const started = performance.now();
      let value;
      let failure = null;
      let terminal = false;
      try {
        value = await this.#inStep.run(true, fn);
      } catch (e) {
        failure = errorOf(e);
        terminal = e instanceof TerminalError;
      }
      const tail = `,"attempt":${attempt},"duration_us":${Math.round((performance.now() - started) * 1000)}`;
      let outputText;
      if (failure === null) {
        try {
          outputText = toJsonText(value, `the output of step '${name}'`);
          s.send(`${head},"status":"ok","output":${outputText}${tail}}`);
        } catch (e) {
          if (!(e instanceof TypeError || e instanceof FrameTooLarge)) throw e;
          // No attempt can make this value journalable: the step fails for good.
          failure = errorOf(e);
          terminal = true;
        }
      }
      if (failure !== null) {
        const error = toJsonText(failure, "a step's error");
        s.send(`${head},"status":"error","error":${error},"terminal":${terminal}${tail}}`);
      }
      const reply = await s.report(seq, failure === null);
      if (reply === null) {
        if (failure === null) return asReplayed(value, outputText);
        throw new StepFailed(name, failure.type, failure.message);
      }
      attempt = reply.attempt;
      await s.pause(reply.delay_ms);
    }
  }

  // A tool, sleep, wait, child or join: the journaled record on replay, else
  // the host's result for the request `requestText(seq)`.
  async #hostOperation(name, kind, requestText) {
    const s = this.#s;
    const recorded = await s.replayNext(name, kind);
    if (recorded) return recorded;
    const seq = s.nextSeq;
    const result = s.request(requestText(seq), seq, kind); // sends at once, or throws having sent nothing
    s.nextSeq++;
    return result;
  }

  async #sleep(requestText) {
    this.#outputOf(await this.#hostOperation("sleep", "sleep", requestText), "until_ms");
  }

  // The output of a host-recorded result `r`, which must be an object with
  // `field`; else the host is broken.
  #outputOf(r, field) {
    const { output } = r;
    if (r.status === "ok" && output !== null && typeof output === "object" && Object.hasOwn(output, field))
      return output;
    throw this.#s.broken(`the host's ${r.kind} result for seq ${r.seq} has no output field '${field}'`);
  }
}

function noop() {}
