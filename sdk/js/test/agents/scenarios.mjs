// The agent the SDK's tests run against the fake host; the input's
// "scenario" chooses what it does. A step body that "logs X" appends X to the
// file named by CAIRN_TEST_EFFECTS, so a test counts how often bodies ran.
import fs from "node:fs";
import { main, CancelledError, ChildError, StepFailed, TerminalError, ToolError } from "cairn";

const delay = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const log = (line) => fs.appendFileSync(process.env.CAIRN_TEST_EFFECTS, `${line}\n`);
const crash = () => process.kill(process.pid, "SIGKILL");

// What a promise settles to, as JSON: { value } or { error: its class, type, message }.
async function settle(promise) {
  try {
    return { value: await promise };
  } catch (e) {
    return { error: e.constructor.name, type: e.type, message: e.message };
  }
}

function blob(i, n) {
  return String.fromCharCode(97 + (i % 26)).repeat(n);
}

const scenarios = {
  // n steps; on attempt 1 the agent dies after step `crash_after`.
  async steps(ctx, { n, crash_after }) {
    const values = [];
    for (let i = 0; i < n; i++) {
      values.push(await ctx.step(`s${i}`, () => (log(`s${i}`), i * i)));
      if (i === crash_after && ctx.attempt === 1) crash();
    }
    return { values, attempt: ctx.attempt };
  },

  // `blobs` steps of `bytes` letters each, dropped as soon as compared: the
  // replay of attempt 2 must not hold the history either.
  async blobs(ctx, { blobs, bytes }) {
    let verified = 0;
    for (let i = 0; i < blobs; i++) {
      const value = await ctx.step(`blob${i}`, () => blob(i, bytes));
      if (value === blob(i, bytes)) verified++;
    }
    if (ctx.attempt === 1) crash();
    return { verified };
  },

  async nondeterminism(ctx) {
    await ctx.step("a", () => (log("a"), 1));
    if (ctx.attempt === 1) {
      await ctx.step("b", () => (log("b"), 2));
      crash();
    }
    const swallowed = await settle(ctx.step("c", () => (log("c"), 3)));
    const after = await settle(ctx.step("d", () => (log("d"), 4)));
    return { swallowed, after };
  },

  // A step that fails `failures` times with a plain error, then succeeds.
  async retry(ctx, { failures, retry, terminal }) {
    let calls = 0;
    return settle(ctx.step("flaky", () => {
      log(`flaky ${ctx.attempt}`);
      calls++;
      if (terminal) throw new TerminalError("bad input");
      if (calls <= failures) throw new RangeError(`transient ${calls}`);
      return "ok";
    }, { retry }));
  },

  // Calls made concurrently: journaled in the order of the calls, bodies
  // one at a time.
  async concurrent(ctx) {
    const body = (name, ms, value) => async () => {
      log(`start ${name}`);
      await delay(ms);
      log(`end ${name}`);
      return value;
    };
    const results = await Promise.all([
      ctx.step("slow", body("slow", 50, "slow")),
      ctx.tool("echo", { i: 1 }),
      delay(10).then(() => ctx.step("later", body("later", 0, "later"))),
      ctx.step("fast", body("fast", 0, "fast")),
      ctx.now().then((d) => d.getTime()),
    ]);
    const more = await Promise.all([1, 2, 3].map((i) => ctx.tool("echo", { i })));
    if (ctx.attempt === 1) crash();
    return { results, more };
  },

  async cancel_wait(ctx) {
    await ctx.step("before", () => 1);
    const waited = await settle(ctx.waitSignal("never"));
    const after = await settle(ctx.step("after", () => (log("after"), 2)));
    return { waited, after }; // returned normally: the run must end cancelled all the same
  },

  async cancel_retry(ctx) {
    return settle(ctx.step("failing", () => {
      log("failing");
      throw new Error("down");
    }, { retry: { maxAttempts: 5 } }));
  },

  async cancel_in_step(ctx) {
    const first = await settle(ctx.step("long", async () => {
      log("long started");
      await delay(300);
      log("long ended");
      return "done";
    }));
    const second = await settle(ctx.step("next", () => log("next")));
    log(`results ${JSON.stringify([first, second])}`);
    return { first, second };
  },

  async json(ctx) {
    const value = (name, v) => settle(ctx.step(name, () => v));
    return {
      nan: await value("nan", { x: NaN }),
      infinity: await value("infinity", [Infinity]),
      bigint: await value("bigint", { n: 10n }),
      hole: await value("hole", [1, undefined]),
      map: await value("map", new Map([[1, 2]])),
      date: await value("date", { at: new Date(0) }),
      omitted: await value("omitted", { a: undefined, b: 1 }),
      nothing: await value("nothing", undefined),
      surrogate: await value("surrogate", { ["k\ud800"]: "v\udc00" }),
      huge: await settle(ctx.step("huge", () => "x".repeat(17 * 1024 * 1024))),
      after: await value("after", "still running"),
    };
  },

  async nested(ctx) {
    return settle(ctx.step("outer", () => ctx.step("inner", () => 1)));
  },

  async dangling(ctx) {
    setInterval(() => {}, 1000);
    await ctx.step("s", () => 1);
    return "left a timer running";
  },

  async emits(ctx) {
    ctx.emit({ at: "start", attempt: ctx.attempt });
    await ctx.step("s", () => 1);
    ctx.emit({ at: "after s", attempt: ctx.attempt });
    if (ctx.attempt === 1) crash();
    return "ok";
  },

  async host_operations(ctx) {
    const out = {};
    out.tool = await settle(ctx.tool("echo", { q: 1 }));
    out.refused = await settle(ctx.tool("forbidden", {}));
    await ctx.sleep(5);
    await ctx.sleepUntil(new Date(Date.now() + 5));
    out.signal = await ctx.waitSignal("approval", { timeoutMs: 1000 });
    out.timedOut = await ctx.waitSignal("absent", { timeoutMs: 10 });
    const child = await ctx.startChild("worker", { job: 1 });
    out.child = child.runId;
    out.joined = await ctx.join(child);
    out.random = await ctx.random();
    out.now = (await ctx.now()).getTime();
    out.classes = [ToolError, ChildError, CancelledError, StepFailed].map((c) => c.name);
    if (ctx.attempt === 1) crash();
    return out;
  },
};

main(async (ctx, input) => scenarios[input.scenario](ctx, input));
