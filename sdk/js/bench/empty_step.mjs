// The cost of an empty step in the JS SDK, against a fake host that answers
// each step with its ack at once (no journal, no sandbox): what the SDK and
// Node add to a round trip on the channel. Given the path of the C++
// bench_agent (build/bench/bench_agent), measures it the same way beside.
//   node bench/empty_step.mjs [path/to/bench_agent] [steps]
import path from "node:path";
import { startAgent } from "../test/fake_host.js";

const [cppAgent, steps = "20000"] = process.argv.slice(2);
const n = Number(steps);

// Runs `program` for n steps; the agent's own per-step timings.
async function measure(program, env) {
  const { conn, exited } = await startAgent(program, env);
  let output = null;
  for (let m; (m = await conn.next()) !== null; ) {
    if (m.t === "hello") conn.send({ t: "start", v: 2, run_id: "bench", input: { steps: n }, attempt: 1, history_steps: 0, next_step_attempt: 1 });
    else if (m.t === "step") conn.send({ t: "ack", seq: m.seq });
    else if (m.t === "done") output = m.output;
  }
  await exited;
  const us = output.step_us.slice(n / 10).sort((a, b) => a - b); // the first tenth warms up
  const at = (q) => us[Math.floor(q * (us.length - 1))].toFixed(1);
  return `p50 ${at(0.5)} us, p90 ${at(0.9)} us, p99 ${at(0.99)} us`;
}

console.log(`JS SDK  (Node ${process.version}), ${n} empty steps: ${await measure(path.join(import.meta.dirname, "bench_agent.mjs"))}`);
// Node's end of the channel is non-blocking, which the C++ SDK's blocking
// reads do not expect (the real host gives a blocking socket): a shell
// clears O_NONBLOCK on fd 3 before it becomes the agent.
const blocking = path.join(import.meta.dirname, "blocking_fd3.py");
if (cppAgent) console.log(`C++ SDK, ${n} empty steps: ${await measure(blocking, { BENCH_AGENT: path.resolve(cppAgent) })}`);
