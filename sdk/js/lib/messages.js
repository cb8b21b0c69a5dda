// Checks host → agent messages against protocol/PROTOCOL.md §3 (the rules of
// protocol/messages.cpp's parse_host_message): a message that breaks them is a
// broken host.

import { HostGone } from "./errors.js";

export const protocolVersion = 2;
export const maxDurationMs = 3_153_600_000_000; // 100 years
export const maxNameBytes = 1024; // a name, or an error's type
// The longest error message the SDK journals (the protocol sets no bound
// below a frame's): the start of a huge message says as much.
export const maxErrorMessageBytes = 64 * 1024;
const hostKinds = new Set(["tool", "sleep", "signal", "child", "join"]);
const allKinds = new Set(["step", "now", "random", "patch", ...hostKinds]);

function bad(t, field, why) {
  throw new HostGone(`the host sent a malformed '${t}' message: field '${field}' ${why}`);
}

function required(m, t, field) {
  if (!Object.hasOwn(m, field)) bad(t, field, "is missing");
  return m[field];
}

// Integers past 2^53 cannot be told apart in a JS number; the host never
// reaches them (a seq or duration that large is years of steps).
function integer(m, t, field, min, max) {
  const v = required(m, t, field);
  if (!Number.isSafeInteger(v)) bad(t, field, "must be an integer");
  if (v < min || v > max) bad(t, field, "is out of range");
  return v;
}

function string(m, t, field) {
  const v = required(m, t, field);
  if (typeof v !== "string") bad(t, field, "must be a string");
  return v;
}

const seq = (m, t, field = "seq") => integer(m, t, field, 0, Number.MAX_SAFE_INTEGER);
const attempt = (m, t, field = "attempt") => integer(m, t, field, 1, 1_000_000);

function stepRecord(r, t) {
  if (r === null || typeof r !== "object" || Array.isArray(r)) bad(t, "steps", "must hold step objects");
  seq(r, t);
  const name = string(r, t, "name");
  if (name.length === 0 || Buffer.byteLength(name) > maxNameBytes) bad(t, "name", "must be 1 to 1024 bytes");
  if (!allKinds.has(string(r, t, "kind"))) bad(t, "kind", "is not a kind of step");
  const status = string(r, t, "status");
  if (status === "ok") {
    required(r, t, "output");
  } else if (status === "error") {
    const e = required(r, t, "error");
    if (e === null || typeof e !== "object" || Array.isArray(e)) bad(t, "error", "must be an object");
    string(e, t, "message");
    if (Object.hasOwn(e, "type")) string(e, t, "type");
  } else {
    bad(t, "status", 'must be "ok" or "error"');
  }
  attempt(r, t);
  if (Object.hasOwn(r, "duration_us")) seq(r, t, "duration_us");
  return r;
}

// The message `m` (a parsed JSON object), checked; throws HostGone.
export function checkHostMessage(m) {
  const t = m.t;
  if (typeof t !== "string") throw new HostGone("the host sent a message without a string field 't'");
  switch (t) {
    case "start":
      integer(m, t, "v", 0, 2 ** 31 - 1);
      string(m, t, "run_id");
      required(m, t, "input");
      attempt(m, t);
      seq(m, t, "history_steps");
      attempt(m, t, "next_step_attempt");
      return m;
    case "history": {
      const from = seq(m, t, "from");
      const steps = required(m, t, "steps");
      if (!Array.isArray(steps) || steps.length === 0) bad(t, "steps", "must be a non-empty array");
      steps.forEach((r, i) => {
        if (stepRecord(r, t).seq !== from + i) bad(t, "steps", "must hold the steps from 'from' on, in order");
      });
      return m;
    }
    case "retry":
      seq(m, t);
      attempt(m, t);
      integer(m, t, "delay_ms", 0, maxDurationMs);
      return m;
    case "ack":
      seq(m, t);
      return m;
    case "reject":
      string(m, t, "error");
      return m;
    case "result":
      stepRecord(m, t);
      if (!hostKinds.has(m.kind)) bad(t, "kind", "must be one of tool, sleep, signal, child, join");
      return m;
    case "cancel":
      string(m, t, "reason");
      return m;
    default:
      throw new HostGone(`the host sent a message of unknown type ${JSON.stringify(t.slice(0, 64))}`);
  }
}
