// Cancel: accepted wherever the agent waits, and the run always ends with
// fail type "cancelled", whatever the workflow does with the error.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Journal, effectsLog, runAttempt } from "./fake_host.js";

const cancel = { t: "cancel", reason: "cancelled by the operator" };
const cancelled = { t: "fail", error: { message: "cancelled by the operator", type: "cancelled" } };

test("a cancel while waiting for a signal ends the run cancelled, though the workflow returns", async () => {
  const effects = effectsLog();
  const run = await runAttempt("scenarios.mjs", new Journal(), {
    input: { scenario: "cancel_wait" },
    env: effects.env,
    hook: (m, host) => {
      if (m.t !== "wait") return false;
      host.conn.send(cancel); // the host answers no wait after a cancel
      return true;
    },
  });
  assert.deepEqual(run.violations, []);
  assert.deepEqual(run.outcome, cancelled);
  assert.equal(run.exit.code, 1);
  assert.deepEqual(effects.lines(), []); // the step after the wait did not run
});

test("a cancel during a retry's delay ends the wait at once", async () => {
  const effects = effectsLog();
  let retriedAt = 0;
  const run = await runAttempt("scenarios.mjs", new Journal(), {
    input: { scenario: "cancel_retry" },
    env: effects.env,
    retryDelay: () => 600_000,
    hook: (m, host) => {
      if (m.t === "step") {
        setTimeout(() => {
          retriedAt = performance.now();
          host.conn.send(cancel);
        }, 100);
      }
      return false;
    },
  });
  const waited = performance.now() - retriedAt;
  assert.deepEqual(run.outcome, cancelled);
  assert.equal(run.exit.code, 1);
  assert.ok(waited < 30_000, `the agent took ${waited} ms to stop`);
  assert.deepEqual(effects.lines(), ["failing"]); // no further attempt
});

test("a cancel during a step lets it finish and be journaled, then stops the next call", async () => {
  const effects = effectsLog();
  const journal = new Journal();
  const run = await runAttempt("scenarios.mjs", journal, {
    input: { scenario: "cancel_in_step" },
    env: effects.env,
    hook: (m, host) => {
      if (m.t === "begin" && m.name === "long") setTimeout(() => host.conn.send(cancel), 50);
      return false;
    },
  });
  assert.deepEqual(run.outcome, cancelled);
  assert.deepEqual(journal.steps.map((s) => [s.name, s.output]), [["long", "done"]]);
  const lines = effects.lines();
  assert.deepEqual(lines.slice(0, 2), ["long started", "long ended"]);
  assert.match(lines[2], /"error":"CancelledError"/);
});

test("a cancel before the start is honoured at the first call", async () => {
  const journal = new Journal();
  const run = await runAttempt("scenarios.mjs", journal, {
    input: { scenario: "steps", n: 3 },
    env: effectsLog().env,
    hook: (m, host) => {
      if (m.t === "hello") host.conn.send(cancel);
      return false;
    },
  });
  assert.deepEqual(run.outcome, cancelled);
  assert.equal(journal.steps.length, 0);
});
