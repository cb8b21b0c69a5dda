#!/usr/bin/env node
// The TypeScript/JavaScript SDK's conformance agent: every scenario of
// tests/conformance/SCENARIOS.md, chosen by the input's "scenario".
import fs from "node:fs";
import { main, ChildFailed, StepFailed, TerminalError } from "cairn";

const effectsLog = "/workspace/effects.log";

function log(line) {
  fs.appendFileSync(effectsLog, `${line}\n`);
}

function logged(line) {
  if (!fs.existsSync(effectsLog)) return 0;
  return fs.readFileSync(effectsLog, "utf8").split("\n").filter((l) => l === line).length;
}

function crash() {
  process.kill(process.pid, "SIGKILL");
}

// Its j-th letter is chr(97 + (j * 7 + i) % 26): a cycle of 26, repeated.
function blob(i, n) {
  let cycle = "";
  for (let j = 0; j < 26; j++) cycle += String.fromCharCode(97 + ((j * 7 + i) % 26));
  return cycle.repeat(Math.ceil(n / 26)).slice(0, n);
}

const scenarios = {
  async steps(ctx, { n, crash_at }) {
    let sum = 0;
    for (let i = 0; i < n; i++) {
      sum += await ctx.step(`s${i}`, () => {
        log(`s${i}`);
        if (i === crash_at && ctx.attempt === 1) crash();
        return i * i;
      });
    }
    return { sum, attempt: ctx.attempt };
  },

  async nondeterminism(ctx) {
    await ctx.step("a", () => (log("a"), 1));
    if (ctx.attempt === 1) {
      await ctx.step("b", () => (log("b"), 2));
      crash();
    }
    try {
      await ctx.step("c", () => (log("c"), 3));
    } catch {
      // swallowed on purpose: the run must fail all the same
    }
    return { caught: true };
  },

  // Attempt 1 is the code before the patches; later attempts, the code after.
  async patched(ctx) {
    await ctx.step("a", () => (log("a"), 1));
    if (ctx.attempt === 1) {
      await ctx.step("old", () => (log("old"), 2));
      crash();
    }
    const first = await ctx.patched("fix-1");
    const branch = first ? "new" : "old";
    await ctx.step(branch, () => (log(branch), 2));
    const second = await ctx.patched("fix-2");
    if (ctx.attempt === 2) crash();
    return { first, second, attempt: ctx.attempt };
  },

  async retry(ctx) {
    const value = await ctx.step("flaky", () => {
      log("flaky");
      if (logged("flaky") < 3) throw new Error("transient");
      return "ok";
    }, { retry: { maxAttempts: 3, initialDelayMs: 50, multiplier: 2, maxDelayMs: 1000, jitter: 0 } });
    return { value };
  },

  async exhausted(ctx) {
    try {
      await ctx.step("always", () => {
        log("always");
        throw new Error("always broken");
      }, { retry: { maxAttempts: 2, initialDelayMs: 10, jitter: 0 } });
      return { step: null, message: "the step did not fail" };
    } catch (e) {
      if (!(e instanceof StepFailed)) throw e;
      return { step: e.step, message: e.cause };
    }
  },

  async terminal(ctx) {
    await ctx.step("fatal", () => {
      log("fatal");
      throw new TerminalError("bad input");
    }, { retry: { maxAttempts: 5 } });
    return { unreachable: true };
  },

  async signals(ctx) {
    const approval = await ctx.waitSignal("approval");
    const absent = await ctx.waitSignal("absent", { timeoutMs: 200 });
    return { approval, absent };
  },

  async timers(ctx, { crash: crashAfter }) {
    const t0 = await ctx.now();
    await ctx.sleep(300);
    const t1 = await ctx.now();
    const r = await ctx.random();
    if (crashAfter && ctx.attempt === 1) crash();
    return { slept_ms: t1.getTime() - t0.getTime(), now0: t0.getTime(), random: r, attempt: ctx.attempt };
  },

  async children(ctx, { agent }) {
    const h = await ctx.startChild(agent, { scenario: "steps", n: 3 });
    const out = await ctx.join(h);
    const g = await ctx.startChild(agent, { scenario: "terminal" });
    let failedType = null;
    try {
      await ctx.join(g);
    } catch (e) {
      if (!(e instanceof ChildFailed)) throw e;
      failedType = e.type;
    }
    return { child: out, failed_type: failedType, child_run: h.runId };
  },

  async cancel(ctx) {
    await ctx.step("started", () => log("started"));
    for (let i = 0; !ctx.cancelled; i++) {
      await ctx.step(`tick${i}`, async () => {
        await new Promise((resolve) => setTimeout(resolve, 20));
        return i;
      });
    }
    return { stopped: true };
  },

  async large_output(ctx, { bytes }) {
    const big = await ctx.step("big", () => blob(0, bytes));
    return { length: big.length, head: big.slice(0, 16) };
  },

  async big_history(ctx, { blobs, blob_bytes }) {
    let verified = 0;
    for (let i = 0; i < blobs; i++) {
      const value = await ctx.step(`blob${i}`, () => blob(i, blob_bytes));
      if (ctx.attempt > 1 && value === blob(i, blob_bytes)) verified++;
    }
    if (ctx.attempt === 1) crash();
    return { verified, attempt: ctx.attempt };
  },

  async emit(ctx) {
    ctx.emit({ progress: 1 });
    await ctx.step("s", () => 1);
    return { ok: true };
  },
};

main(async (ctx, input) => {
  const scenario = scenarios[input?.scenario];
  if (!scenario) throw new Error(`unknown scenario ${JSON.stringify(input?.scenario)}`);
  return scenario(ctx, input);
});
