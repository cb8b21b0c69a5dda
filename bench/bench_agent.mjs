#!/usr/bin/env node
// Benchmark agent of the JavaScript SDK, as bench_agent.cpp: N empty steps,
// each timed from the call to ctx.step until the host's ack returns.
// input: {"steps": N}   output: {"step_us": [...]}
import { main } from "cairn";

main(async (ctx, input) => {
  const us = [];
  for (let i = 0; i < (input.steps ?? 1000); i++) {
    const t0 = process.hrtime.bigint();
    await ctx.step(`s${i}`, async () => null);
    us.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  return { step_us: us };
});
