// Retries: the agent asks in begin, reports every failed attempt, and the
// host decides (retry or ack); a crash does not reset the attempt count.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Journal, effectsLog, runAttempt } from "./fake_host.js";

const retry = { maxAttempts: 3, initialDelayMs: 50, multiplier: 2, maxDelayMs: 1000, jitter: 0, timeoutMs: 2500 };

// Runs the "retry" scenario once, recording every begin and step sent.
async function retryRun(input, journal = new Journal()) {
  const effects = effectsLog();
  const sent = [];
  const hook = (m) => {
    if (m.t === "begin" || m.t === "step") sent.push(m);
    return false;
  };
  const run = await runAttempt("scenarios.mjs", journal, { input: { scenario: "retry", ...input }, env: effects.env, hook, retryDelay: (seq, a) => 10 * a });
  assert.deepEqual(run.violations, []);
  return { run, sent, journal, effects: effects.lines() };
}

test("a failed attempt is reported, the host retries it, and the step's next attempt succeeds", async () => {
  const { run, sent, journal, effects } = await retryRun({ failures: 2, retry });
  assert.deepEqual(run.outcome, { t: "done", output: { value: "ok" } });
  assert.deepEqual(sent.map((m) => [m.t, m.attempt, m.status ?? null]), [
    ["begin", 1, null], ["step", 1, "error"], ["begin", 2, null], ["step", 2, "error"], ["begin", 3, null], ["step", 3, "ok"],
  ]);
  const begin = sent[0];
  assert.deepEqual(
    [begin.max_attempts, begin.initial_delay_ms, begin.multiplier, begin.max_delay_ms, begin.jitter, begin.timeout_ms],
    [3, 50, 2, 1000, 0, 2500],
  );
  assert.deepEqual(sent[1].error, { message: "transient 1", type: "RangeError" });
  assert.equal(sent[1].terminal, false);
  assert.equal(journal.steps.length, 1);
  assert.equal(effects.length, 3);
});

test("a step out of attempts rejects with StepFailed carrying its cause", async () => {
  const { run, journal } = await retryRun({ failures: 5, retry: { ...retry, maxAttempts: 2 } });
  assert.deepEqual(run.outcome.output, {
    error: "StepFailed", type: "RangeError", message: "step 'flaky' failed: transient 2",
  });
  assert.equal(journal.steps[0].status, "error");
  assert.equal(journal.steps[0].attempt, 2);
});

test("a TerminalError is reported terminal and never retried", async () => {
  const { run, sent } = await retryRun({ terminal: true, retry: { maxAttempts: 5 } });
  assert.equal(sent.filter((m) => m.t === "step").length, 1);
  assert.equal(sent[1].terminal, true);
  assert.equal(run.outcome.output.type, "TerminalError");
});

test("after a crash, the step goes on at the attempt after those the host journaled", async () => {
  const journal = new Journal();
  journal.retries.set(0, 2); // two failed attempts of seq 0 before a crash
  const { run, sent } = await retryRun({ failures: 0, retry }, journal);
  assert.deepEqual(sent.map((m) => [m.t, m.attempt]), [["begin", 3], ["step", 3]]);
  assert.deepEqual(run.outcome.output, { value: "ok" });
});

test("a retry's delay is waited before the next attempt", async () => {
  const effects = effectsLog();
  const times = [];
  const hook = (m) => {
    if (m.t === "begin") times.push(performance.now());
    return false;
  };
  const run = await runAttempt("scenarios.mjs", new Journal(), {
    input: { scenario: "retry", failures: 1, retry }, env: effects.env, hook, retryDelay: () => 300,
  });
  assert.equal(run.outcome.output.value, "ok");
  assert.ok(times[1] - times[0] >= 290, `attempt 2 began ${times[1] - times[0]} ms after attempt 1`);
});
