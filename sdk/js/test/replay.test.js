// Replay: journaled steps are returned without running again, the history
// comes in chunks held one at a time, and code that no longer matches its
// journal fails the run.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Journal, effectsLog, runAttempt } from "./fake_host.js";

test("a crashed run replays its journaled steps without running them again", async () => {
  const effects = effectsLog();
  const journal = new Journal();
  const input = { scenario: "steps", n: 4, crash_after: 1 };
  const first = await runAttempt("scenarios.mjs", journal, { input, env: effects.env });
  assert.equal(first.exit.signal, "SIGKILL");
  assert.equal(first.outcome, null);
  const second = await runAttempt("scenarios.mjs", journal, { input, env: effects.env });
  assert.deepEqual(second.violations, []);
  assert.deepEqual(second.outcome, { t: "done", output: { values: [0, 1, 4, 9], attempt: 2 } });
  assert.equal(second.exit.code, 0);
  assert.deepEqual(effects.lines(), ["s0", "s1", "s2", "s3"]);
  assert.deepEqual(journal.steps.map((s) => s.name), ["s0", "s1", "s2", "s3"]);
});

test("a history far larger than the agent's heap replays in chunks of about 1 MiB", async () => {
  // 96 MiB of history through an agent whose heap may not exceed 64 MiB:
  // holding the history, or even a few chunks too many, kills it.
  const journal = new Journal();
  const input = { scenario: "blobs", blobs: 96, bytes: 1 << 20 };
  const env = { NODE_OPTIONS: "--max-old-space-size=64" };
  await runAttempt("scenarios.mjs", journal, { input, env });
  assert.equal(journal.steps.length, 96);
  const replay = await runAttempt("scenarios.mjs", journal, { input, env, historyBytes: 1 << 20 });
  assert.deepEqual(replay.violations, []);
  assert.equal(replay.exit.code, 0, replay.exit.stderr);
  assert.deepEqual(replay.outcome, { t: "done", output: { verified: 96 } });
  assert.equal(replay.historyRequests, 96); // each 1 MiB step came in a chunk of its own
});

test("small steps come many to a chunk, each chunk asked for once", async () => {
  const journal = new Journal();
  const input = { scenario: "steps", n: 500, crash_after: 499 };
  const effects = effectsLog();
  await runAttempt("scenarios.mjs", journal, { input, env: effects.env });
  const replay = await runAttempt("scenarios.mjs", journal, { input, env: effects.env, historyBytes: 4096 });
  assert.deepEqual(replay.violations, []);
  assert.equal(replay.outcome.t, "done");
  assert.ok(replay.historyRequests > 10 && replay.historyRequests < 100, `${replay.historyRequests} history requests`);
  assert.equal(effects.lines().length, 500);
});

test("code that no longer matches its journal fails the run, even when it catches the error", async () => {
  const effects = effectsLog();
  const journal = new Journal();
  const input = { scenario: "nondeterminism" };
  await runAttempt("scenarios.mjs", journal, { input, env: effects.env });
  const second = await runAttempt("scenarios.mjs", journal, { input, env: effects.env });
  assert.deepEqual(second.violations, []);
  assert.equal(second.outcome.t, "fail");
  assert.equal(second.outcome.error.type, "nondeterminism");
  assert.match(second.outcome.error.message, /^non-determinism at step 1: the journal has step 'b' but the code now asks for step 'c'/);
  assert.equal(second.exit.code, 1);
  assert.deepEqual(effects.lines(), ["a", "b"]); // neither c nor d ran
  assert.equal(journal.steps.length, 2); // nothing journaled after the mismatch
});

test("tool, timer, signal and child results replay without asking the host again", async () => {
  const journal = new Journal();
  const options = { input: { scenario: "host_operations" }, tools: { echo: (a) => a }, signals: { approval: { yes: true } } };
  const first = await runAttempt("scenarios.mjs", journal, options);
  assert.deepEqual(first.violations, []);
  const kinds = journal.steps.map((s) => s.kind);
  assert.deepEqual(kinds, ["tool", "tool", "sleep", "sleep", "signal", "signal", "child", "join", "random", "now"]);
  const second = await runAttempt("scenarios.mjs", journal, { ...options, tools: {}, signals: {} });
  assert.deepEqual(second.violations, []);
  assert.equal(journal.steps.length, kinds.length);
  const out = second.outcome.output;
  assert.deepEqual(out.tool, { value: { q: 1 } });
  assert.deepEqual(out.refused, { error: "ToolError", type: "refused", message: "tool 'forbidden' is not granted" });
  assert.deepEqual(out.signal, { yes: true });
  assert.equal(out.timedOut, null);
  assert.equal(out.child, "child-6");
  assert.deepEqual(out.joined, { joined: "child-6" });
  assert.equal(out.random, journal.steps[8].output);
  assert.equal(out.now, journal.steps[9].output);
  assert.ok(Number.isInteger(out.now));
});

test("events are not emitted again while replaying", async () => {
  const journal = new Journal();
  const first = await runAttempt("scenarios.mjs", journal, { input: { scenario: "emits" } });
  assert.deepEqual(first.emits, [{ at: "start", attempt: 1 }, { at: "after s", attempt: 1 }]);
  const second = await runAttempt("scenarios.mjs", journal, { input: { scenario: "emits" } });
  assert.deepEqual(second.emits, [{ at: "after s", attempt: 2 }]);
  assert.equal(second.outcome.t, "done");
});
