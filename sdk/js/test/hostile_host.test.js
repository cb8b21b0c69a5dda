// A malformed or unexpected frame from the host is a broken host: the agent
// sends nothing more (no done, no fail) and exits, 2 before it accepted a
// start, 3 after; it never hangs.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { agentsDir, effectsLog, frame, startAgent } from "./fake_host.js";

const start = { t: "start", v: 2, run_id: "run-test", input: { scenario: "steps", n: 2 }, attempt: 1, history_steps: 0, next_step_attempt: 1 };
const header = (n) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};

// Starts the agent, lets `play` answer it, then collects what it sent after.
async function against(play) {
  const { conn, exited } = await startAgent("scenarios.mjs", effectsLog().env);
  const hello = await conn.next();
  assert.equal(hello.t, "hello");
  assert.equal(hello.v, 2);
  await play(conn);
  const after = [];
  for (let m; (m = await conn.next()) !== null; ) after.push(m.t);
  const exit = await exited;
  return { after, exit };
}

const beforeStart = {
  "a length of 0": (c) => c.sendRaw(header(0)),
  "a length above 16 MiB": (c) => c.sendRaw(header(16 * 1024 * 1024 + 1)),
  "invalid JSON": (c) => c.sendRaw(frame("{\"t\":\"start\",")),
  "a JSON array": (c) => c.sendRaw(frame("[1,2]")),
  "invalid UTF-8": (c) => c.sendRaw(frame(Buffer.from('{"t":"\xff"}', "latin1"))),
  "a byte-order mark": (c) => c.sendRaw(frame(`\ufeff${JSON.stringify(start)}`)),
  "a start of version 3": (c) => c.send({ ...start, v: 3 }),
  "an overlong UTF-8 encoding": (c) => c.sendRaw(frame(Buffer.from([0x7b, 0x22, 0x74, 0x22, 0x3a, 0x22, 0xc0, 0xaf, 0x22, 0x7d]))),
  "a start without history_steps": (c) => c.send({ ...start, history_steps: undefined }),
  "a start whose seq is a string": (c) => c.send({ ...start, history_steps: "0" }),
  "a reject": (c) => c.send({ t: "reject", error: "the host speaks v3" }),
  "an unknown message type": (c) => c.send({ t: "welcome" }),
  "an ack in place of start": (c) => c.send({ t: "ack", seq: 0 }),
  "the channel closing": (c) => c.close(),
  "half a frame, then the channel closing": (c) => {
    c.sendRaw(frame(start).subarray(0, 20));
    setTimeout(() => c.close(), 50);
  },
};

for (const [what, play] of Object.entries(beforeStart)) {
  test(`before the start: ${what} makes the agent exit 2 without a word`, async () => {
    const { after, exit } = await against(play);
    assert.deepEqual(after, []);
    assert.equal(exit.code, 2, exit.stderr);
  });
}

// After a good start the agent sends begin and step for seq 0.
const afterStart = {
  "an ack for the wrong seq": (c) => c.send({ t: "ack", seq: 1 }),
  "a retry for a step that succeeded": (c) => c.send({ t: "retry", seq: 0, attempt: 2, delay_ms: 0 }),
  "a result in place of an ack": (c) => c.send({ t: "result", seq: 0, name: "s0", kind: "tool", status: "ok", output: 1, attempt: 1 }),
  "a second start": (c) => c.send(start),
  "a frame of 0 bytes": (c) => c.sendRaw(header(0)),
  "an ack with a fractional seq": (c) => c.send({ t: "ack", seq: 0.5 }),
  "the channel closing": (c) => c.close(),
};

for (const [what, play] of Object.entries(afterStart)) {
  test(`after the start: ${what} makes the agent exit 3 without a word`, async () => {
    const { after, exit } = await against(async (c) => {
      c.send(start);
      assert.equal((await c.next()).t, "begin");
      assert.equal((await c.next()).t, "step");
      play(c);
    });
    assert.deepEqual(after, []);
    assert.equal(exit.code, 3, exit.stderr);
  });
}

test("a history chunk from the wrong step makes the agent exit 3 without a word", async () => {
  const record = (seq) => ({ seq, name: `s${seq}`, kind: "step", status: "ok", output: seq * seq, attempt: 1, duration_us: 1 });
  const { after, exit } = await against(async (c) => {
    c.send({ ...start, history_steps: 2 });
    assert.deepEqual(await c.next(), { t: "history", from: 0 });
    c.send({ t: "history", from: 1, steps: [record(1)] });
  });
  assert.deepEqual(after, []);
  assert.equal(exit.code, 3);
});

test("a history chunk past the journal's end makes the agent exit 3", async () => {
  const record = (seq) => ({ seq, name: `s${seq}`, kind: "step", status: "ok", output: 0, attempt: 1 });
  const { after, exit } = await against(async (c) => {
    c.send({ ...start, history_steps: 1 });
    await c.next();
    c.send({ t: "history", from: 0, steps: [record(0), record(1)] });
  });
  assert.deepEqual(after, []);
  assert.equal(exit.code, 3);
});

test("frames split byte by byte are read as one", async () => {
  const { after, exit } = await against(async (c) => {
    for (const byte of frame(start)) c.sendRaw(Buffer.from([byte]));
    for (let seq = 0; seq < 2; seq++) {
      assert.equal((await c.next()).t, "begin");
      assert.equal((await c.next()).t, "step");
      const ack = frame({ t: "ack", seq });
      c.sendRaw(Buffer.concat([ack.subarray(0, 3)]));
      c.sendRaw(ack.subarray(3));
    }
  });
  assert.deepEqual(after, ["done"]);
  assert.equal(exit.code, 0);
});

test("started without a channel, the agent says how to run it and exits 2", async () => {
  const file = path.join(agentsDir, "scenarios.mjs");
  const run = (env, stdio) =>
    new Promise((resolve) => {
      const child = spawn(process.execPath, [file], { env: { ...process.env, CAIRN_CHANNEL_FD: undefined, ...env }, stdio });
      let stderr = "";
      child.stderr.on("data", (b) => (stderr += b));
      child.on("close", (code) => resolve({ code, stderr }));
    });
  const noChannel = await run({}, ["ignore", "ignore", "pipe"]);
  assert.equal(noChannel.code, 2);
  assert.match(noChannel.stderr, /This is a cairn agent; start it with `cairn run PROGRAM --input JSON`/);
  const notSocket = fs.openSync(fs.mkdtempSync(path.join(os.tmpdir(), "cairn-js-")) + "/file", "w");
  const fileChannel = await run({ CAIRN_CHANNEL_FD: "3" }, ["ignore", "ignore", "pipe", notSocket]);
  fs.closeSync(notSocket);
  assert.equal(fileChannel.code, 2);
  assert.match(fileChannel.stderr, /This is a cairn agent/);
});
