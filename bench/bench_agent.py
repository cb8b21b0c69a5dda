#!/usr/bin/env python3
# Benchmark agent of the Python SDK, as bench_agent.cpp: N empty steps, each
# timed from the call to ctx.step until the host's ack returns.
# input: {"steps": N}   output: {"step_us": [...]}
import time

import cairn


def workflow(ctx: cairn.Context, input: dict) -> dict:
    us = []
    for i in range(input.get("steps", 1000)):
        t0 = time.perf_counter()
        ctx.step(f"s{i}", lambda: None)
        us.append((time.perf_counter() - t0) * 1e6)
    return {"step_us": us}


cairn.main(workflow)
