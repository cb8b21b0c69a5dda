// Runs a workflow as a cairn agent: the handshake, the workflow, then done or
// fail (PROTOCOL.md §2.1). Exit codes: 0 after done, 1 after fail, 2 when not
// started by cairn or the host refused the start, 3 when the host went away
// or broke the protocol after the start (the agent then sends nothing more).

import fs from "node:fs";
import net from "node:net";
import { ChildFailed, HostGone, NondeterminismError, StepFailed } from "./errors.js";
import { Context } from "./context.js";
import { maxErrorMessageBytes } from "./messages.js";
import { Session } from "./session.js";
import { FrameTooLarge, clip, safeString, toJsonText } from "./wire.js";

function say(message) {
  process.stderr.write(`cairn agent: ${message}\n`);
}

// The error a workflow that threw `e` fails with.
function failureOf(e) {
  if (e instanceof StepFailed || e instanceof ChildFailed) return { message: e.message, type: e.type };
  if (e instanceof NondeterminismError) return { message: e.message, type: "nondeterminism" };
  if (e instanceof Error) return { message: safeString(e.message), type: "error" };
  return { message: `the workflow threw a value that is not an Error: ${safeString(e)}`, type: "unknown" };
}

// One turn of the event loop, with its read of the channel.
const turn = () => new Promise((resolve) => setImmediate(resolve));

// Runs `workflow(ctx, input)` on `socket`, the channel to the host; resolves
// with the exit code. Never rejects.
export async function run(socket, workflow) {
  const session = new Session(socket);
  try {
    await session.open();
  } catch (e) {
    say(e.message);
    return 2;
  }
  const ctx = new Context(session);
  const outcome = (async () => {
    try {
      return { output: await workflow(ctx, session.start.input) };
    } catch (e) {
      return { failure: failureOf(e) };
    }
  })();
  await Promise.race([outcome, session.lost]);
  // A cancel the host sent after the workflow's last call still makes the run
  // cancelled: two turns of the event loop hold a read of the channel.
  await turn();
  await turn();
  if (session.gone) {
    say(session.gone.message);
    return 3;
  }

  let { output, failure } = await outcome;
  // A workflow that swallowed a non-determinism error still fails.
  if (session.nondeterminism !== null) failure = { message: session.nondeterminism, type: "nondeterminism" };
  // A cancelled run ends as cancelled however the workflow ended.
  if (session.cancelReason !== null) failure = { message: session.cancelReason, type: "cancelled" };
  try {
    if (!failure) {
      try {
        await session.finish(`{"t":"done","output":${toJsonText(output, "the workflow's output")}}`);
        return 0;
      } catch (e) {
        if (!(e instanceof TypeError || e instanceof FrameTooLarge)) throw e;
        failure = { message: e.message, type: "error" };
      }
    }
    failure.message = clip(failure.message, maxErrorMessageBytes);
    await session.finish(`{"t":"fail","error":${toJsonText(failure, "the run's error")}}`);
    say(`run failed: ${failure.message}`);
    return 1;
  } catch (e) {
    if (!(e instanceof HostGone)) throw e;
    say(e.message);
    return 3;
  }
}

// The channel's descriptor, or null when the program was not started by cairn.
function channelFd() {
  const value = process.env.CAIRN_CHANNEL_FD;
  if (value === undefined || !/^[0-9]+$/.test(value)) return null;
  const fd = Number(value);
  try {
    return fs.fstatSync(fd).isSocket() ? fd : null;
  } catch {
    return null;
  }
}

// Runs `workflow` as the agent of the run that started this process, then
// exits (without waiting for timers or sockets the workflow left open).
export function main(workflow) {
  if (typeof workflow !== "function") throw new TypeError("cairn's main needs the workflow: an async function (ctx, input)");
  const fd = channelFd();
  if (fd === null) {
    process.stderr.write("This is a cairn agent; start it with `cairn run PROGRAM --input JSON`.\n");
    process.exit(2);
  }
  run(new net.Socket({ fd, readable: true, writable: true }), workflow).then(
    (code) => process.exit(code),
    (e) => {
      say(`internal error: ${e.stack ?? e}`);
      process.exit(3);
    },
  );
}
