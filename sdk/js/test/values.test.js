// What a step returns must be JSON the host accepts, and the workflow must
// see live what replay will give it; the agent exits when the run is over.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Journal, runAttempt } from "./fake_host.js";

test("values JSON cannot hold fail their step for good; what it can is returned as replay returns it", async () => {
  const journal = new Journal();
  const run = await runAttempt("scenarios.mjs", journal, { input: { scenario: "json" } });
  assert.deepEqual(run.violations, []);
  assert.equal(run.outcome.t, "done", JSON.stringify(run.outcome));
  const out = run.outcome.output;
  const refused = {
    nan: /holds NaN at key "x"/,
    infinity: /holds Infinity at index 0/,
    bigint: /holds a BigInt at key "n"/,
    hole: /holds undefined at index 1/,
    map: /holds a Map/,
    huge: /over the protocol's frame limit/,
  };
  for (const [name, why] of Object.entries(refused)) {
    assert.equal(out[name].error, "StepFailed", name);
    assert.equal(out[name].type, name === "huge" ? "FrameTooLarge" : "TypeError");
    assert.match(out[name].message, why);
    const record = journal.steps.find((s) => s.name === name);
    assert.equal(record.status, "error");
    assert.equal(record.attempt, 1, `${name} was not retried`);
  }
  assert.deepEqual(out.date, { value: { at: "1970-01-01T00:00:00.000Z" } });
  assert.deepEqual(out.omitted, { value: { b: 1 } });
  assert.deepEqual(out.nothing, { value: null });
  assert.deepEqual(out.surrogate, { value: { "k\ufffd": "v\ufffd" } });
  assert.deepEqual(out.after, { value: "still running" });
});

test("the agent exits once the run is over, though the workflow left a timer running", async () => {
  const started = performance.now();
  const run = await runAttempt("scenarios.mjs", new Journal(), { input: { scenario: "dangling" } });
  assert.equal(run.exit.code, 0);
  assert.deepEqual(run.outcome, { t: "done", output: "left a timer running" });
  assert.ok(performance.now() - started < 30_000);
});
