// A fake cairn host for the SDK's tests: it starts an agent program with an
// AF_UNIX stream socket at fd 3, as the real host does, and speaks
// protocol/PROTOCOL.md to it from an in-memory journal that outlives
// attempts, so a test can crash, replay and cancel runs without the engine.

import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

// Not import.meta.dirname (Node 20): the tests run on Node 18 too.
export const agentsDir = fileURLToPath(new URL("agents", import.meta.url));
// A loaded 2-core machine must pass: the longest wait for a message, and the
// longest attempt (96 MiB of steps under a 64 MiB heap takes 6 s unloaded).
const deadlineMs = 60_000;
const attemptDeadlineMs = 300_000;

// A frame holding `message`: an object, or the payload as it is (a string or bytes).
export function frame(message) {
  const payload = Buffer.isBuffer(message) ? message : Buffer.from(typeof message === "string" ? message : JSON.stringify(message));
  const header = Buffer.alloc(4);
  header.writeUInt32BE(payload.length);
  return Buffer.concat([header, payload]);
}

// The host's end of one agent process's channel.
export class Connection {
  #socket;
  #buffer = Buffer.alloc(0);
  #frames = [];
  #waiting = null;
  #closed = false;
  bytesReceived = 0;

  constructor(socket) {
    this.#socket = socket;
    socket.on("data", (b) => {
      this.bytesReceived += b.length;
      this.#buffer = Buffer.concat([this.#buffer, b]);
      while (this.#buffer.length >= 4 && this.#buffer.length >= 4 + this.#buffer.readUInt32BE(0)) {
        const n = this.#buffer.readUInt32BE(0);
        this.#frames.push(JSON.parse(this.#buffer.subarray(4, 4 + n).toString()));
        this.#buffer = this.#buffer.subarray(4 + n);
      }
      this.#wake();
    });
    socket.on("close", () => {
      this.#closed = true;
      this.#wake();
    });
    socket.on("error", () => {});
  }

  #wake() {
    const w = this.#waiting;
    this.#waiting = null;
    w?.();
  }

  // The agent's next message, or null once the channel closed without one.
  async next() {
    for (;;) {
      if (this.#frames.length > 0) return this.#frames.shift();
      if (this.#closed) return null;
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("the agent sent nothing for 60 s")), deadlineMs);
        this.#waiting = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
  }

  send(message) {
    this.sendRaw(frame(message));
  }

  sendRaw(bytes) {
    if (!this.#socket.destroyed) this.#socket.write(bytes);
  }

  close() {
    this.#socket.destroy();
  }
}

// Starts `program` (a script under test/agents, or an absolute path to a
// script or an executable) with the channel
// at fd 3 and CAIRN_CHANNEL_FD=3; returns its connection and a promise of its
// exit { code, signal, stderr }.
export async function startAgent(program, env = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cairn-js-channel-"));
  const socketPath = path.join(dir, "channel");
  const server = net.createServer();
  await new Promise((resolve) => server.listen(socketPath, resolve));
  const accepted = new Promise((resolve) => server.once("connection", resolve));
  const agentEnd = net.connect(socketPath);
  await new Promise((resolve) => agentEnd.once("connect", resolve));
  const hostEnd = await accepted;
  server.close();
  fs.rmSync(dir, { recursive: true, force: true });

  const file = path.isAbsolute(program) ? program : path.join(agentsDir, program);
  const [command, args] = /\.m?js$/.test(file) ? [process.execPath, [file]] : [file, []]; // else an executable
  const child = spawn(command, args, {
    stdio: ["ignore", "pipe", "pipe", agentEnd],
    env: { ...process.env, CAIRN_CHANNEL_FD: "3", CAIRN_RUN_ID: "run-test", ...env },
  });
  agentEnd.destroy(); // the agent holds its own copy
  let stderr = "";
  child.stderr.on("data", (b) => (stderr += b));
  child.stdout.on("data", () => {});
  const timer = setTimeout(() => child.kill("SIGKILL"), attemptDeadlineMs);
  const exited = new Promise((resolve) =>
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stderr });
    }),
  );
  return { conn: new Connection(hostEnd), child, exited };
}

// A run's durable state on the fake host: its journal of step records and
// the failed attempts journaled for the next seq (step_retry events).
export class Journal {
  steps = [];
  retries = new Map(); // seq -> failed attempts the host retried
  attempts = 0; // sandboxes started so far
}

function jsonSize(v) {
  return Buffer.byteLength(JSON.stringify(v));
}

// Plays the host for one attempt of `program` on `journal`, as the engine
// would: answers hello, history, begin/step (retrying as the begin asked,
// with `retryDelay(seq, attempt)` ms), tool, sleep, wait, child and join.
// Options: input, tools { name: (args) => output | throws {type, message} },
// signals { name: payload }, missingAgents and failingAgents (names of
// agents the host knows not, and whose child runs fail), hook(message, host)
// returning true when it handled the message itself, historyBytes (about how
// much a chunk holds).
// Resolves { outcome: the done/fail message or null, exit, emits,
// violations (protocol breaches seen), historyRequests, maxChunkSteps }.
export async function runAttempt(program, journal, options = {}) {
  const { input = null, tools = {}, signals = {}, hook, historyBytes = 1 << 20, env = {} } = options;
  const { missingAgents = [], failingAgents = [] } = options;
  const retryDelay = options.retryDelay ?? (() => 1);
  const { conn, exited, child } = await startAgent(program, env);
  journal.attempts++;
  const historySteps = journal.steps.length;
  const host = { conn, child, journal, emits: [], violations: [], historyRequests: 0, maxChunkSteps: 0, outcome: null };
  let begun = null; // the begin for the next seq
  let nextToSend = 0;
  const violation = (why) => host.violations.push(why);
  const commit = (record) => {
    const r = { ...record, seq: journal.steps.length, attempt: record.attempt ?? 1, duration_us: record.duration_us ?? 0 };
    journal.steps.push(r);
    return r;
  };
  const expectSeq = (m) => m.seq === journal.steps.length || violation(`${m.t} for seq ${m.seq}, next is ${journal.steps.length}`);

  for (;;) {
    const m = await conn.next();
    if (m === null) break;
    if (hook?.(m, host)) continue;
    switch (m.t) {
      case "hello":
        conn.send({
          t: "start", v: 2, run_id: "run-test", input, attempt: journal.attempts,
          history_steps: historySteps, next_step_attempt: 1 + (journal.retries.get(historySteps) ?? 0),
        });
        break;
      case "history": {
        host.historyRequests++;
        if (m.from !== nextToSend || m.from >= historySteps) violation(`history from ${m.from}`);
        const steps = [];
        let bytes = 0;
        for (let i = m.from; i < historySteps && (steps.length === 0 || bytes < historyBytes); i++) {
          steps.push(journal.steps[i]);
          bytes += jsonSize(journal.steps[i]);
        }
        nextToSend = m.from + steps.length;
        host.maxChunkSteps = Math.max(host.maxChunkSteps, steps.length);
        conn.send({ t: "history", from: m.from, steps });
        break;
      }
      case "begin":
        expectSeq(m);
        begun = m;
        break;
      case "step": {
        expectSeq(m);
        const failed = 1 + (journal.retries.get(m.seq) ?? 0);
        const asked = begun?.seq === m.seq ? begun.max_attempts : 1;
        if (m.status === "error" && !m.terminal && failed < asked) {
          journal.retries.set(m.seq, failed);
          conn.send({ t: "retry", seq: m.seq, attempt: failed + 1, delay_ms: retryDelay(m.seq, failed + 1) });
          break;
        }
        const { t, terminal, ...record } = m;
        commit(record);
        begun = null;
        conn.send({ t: "ack", seq: m.seq });
        break;
      }
      case "tool": {
        expectSeq(m);
        let r;
        try {
          const tool = tools[m.name];
          if (!tool) throw { type: "refused", message: `tool '${m.name}' is not granted` };
          r = commit({ name: m.name, kind: "tool", status: "ok", output: tool(m.args) });
        } catch (e) {
          r = commit({ name: m.name, kind: "tool", status: "error", error: { type: e.type, message: e.message } });
        }
        conn.send({ t: "result", ...r });
        break;
      }
      case "sleep": {
        expectSeq(m);
        const until = m.until_ms ?? Date.now() + m.duration_ms;
        const r = commit({ name: "sleep", kind: "sleep", status: "ok", output: { until_ms: until, fired_at_ms: Date.now() } });
        conn.send({ t: "result", ...r });
        break;
      }
      case "wait": {
        expectSeq(m);
        const output = Object.hasOwn(signals, m.signal)
          ? { signal: m.signal, timed_out: false, payload: signals[m.signal] }
          : { signal: m.signal, timed_out: true };
        conn.send({ t: "result", ...commit({ name: m.signal, kind: "signal", status: "ok", output }) });
        break;
      }
      case "child": {
        expectSeq(m);
        const outcome = missingAgents.includes(m.agent)
          ? { status: "error", error: { type: "no_such_agent", message: `no agent '${m.agent}'` } }
          : { status: "ok", output: { run_id: `child-${m.seq}` } };
        conn.send({ t: "result", ...commit({ name: m.agent, kind: "child", ...outcome }) });
        break;
      }
      case "join": {
        expectSeq(m);
        const started = journal.steps.find((s) => s.kind === "child" && s.output?.run_id === m.run_id);
        const outcome = failingAgents.includes(started?.name)
          ? { status: "error", error: { type: "child_failed", message: "it broke" } }
          : { status: "ok", output: { joined: m.run_id } };
        conn.send({ t: "result", ...commit({ name: m.run_id, kind: "join", ...outcome }) });
        break;
      }
      case "emit":
        host.emits.push(m.data);
        break;
      case "done":
      case "fail":
        if (host.outcome) violation(`a second ${m.t}`);
        host.outcome = m;
        break;
      default:
        violation(`unknown message ${m.t}`);
    }
  }
  const exit = await exited;
  return { ...host, exit };
}

// A new scratch folder, removed when the test process exits.
export function scratchDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "cairn-js-test-"));
  process.on("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

// A scratch file for an agent's effects log (CAIRN_TEST_EFFECTS) and a
// reader of its lines.
export function effectsLog() {
  const file = path.join(scratchDir(), "effects.log");
  fs.writeFileSync(file, "");
  return { env: { CAIRN_TEST_EFFECTS: file }, lines: () => fs.readFileSync(file, "utf8").split("\n").filter(Boolean) };
}
