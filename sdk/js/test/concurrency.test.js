// Framework code calls the context concurrently (Promise.all over tool
// calls): the journal must hold the calls in the order they were made, one
// at a time, so that a replay in the same order matches it.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Journal, effectsLog, runAttempt } from "./fake_host.js";

test("concurrent calls are journaled in call order, one at a time, and replay to the same results", async () => {
  const effects = effectsLog();
  const journal = new Journal();
  const options = { input: { scenario: "concurrent" }, env: effects.env, tools: { echo: (a) => a } };
  const first = await runAttempt("scenarios.mjs", journal, options);
  assert.deepEqual(first.violations, []); // each request came with the next seq, after the previous answer
  assert.deepEqual(journal.steps.map((s) => s.name), ["slow", "echo", "fast", "ctx.now", "later", "echo", "echo", "echo"]);
  assert.deepEqual(journal.steps.slice(5).map((s) => s.output.i), [1, 2, 3]);
  // No body started before the one before it had ended.
  assert.deepEqual(effects.lines(), ["start slow", "end slow", "start fast", "end fast", "start later", "end later"]);

  const second = await runAttempt("scenarios.mjs", journal, { ...options, tools: {} });
  assert.deepEqual(second.violations, []);
  assert.equal(second.outcome.t, "done", JSON.stringify(second.outcome));
  const { results, more } = second.outcome.output;
  assert.deepEqual(results, ["slow", { i: 1 }, "later", "fast", journal.steps[3].output]);
  assert.deepEqual(more, [{ i: 1 }, { i: 2 }, { i: 3 }]);
  assert.equal(effects.lines().length, 6); // nothing ran again
});

test("a journaled call inside a step's function is refused, not deadlocked", async () => {
  const run = await runAttempt("scenarios.mjs", new Journal(), { input: { scenario: "nested" } });
  assert.equal(run.outcome.t, "done");
  assert.equal(run.outcome.output.error, "StepFailed");
  assert.match(run.outcome.output.message, /cannot be called inside a step's function/);
});
