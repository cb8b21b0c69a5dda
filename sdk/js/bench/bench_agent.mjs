#!/usr/bin/env node
// The JS twin of bench/bench_agent.cpp: N empty steps, each timed from the
// call to ctx.step until the host's ack returns (the step is then durable).
// input: {"steps": N}; output: {"step_us": [...]}
import { main } from "cairn";

main(async (ctx, input) => {
  const n = input?.steps ?? 1000;
  const us = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await ctx.step(`s${i}`, () => null);
    us.push((performance.now() - t0) * 1000);
  }
  return { step_us: us };
});
