#!/usr/bin/env python3
"""The Python SDK's conformance agent: every scenario of
tests/conformance/SCENARIOS.md, chosen by the input's "scenario". The effects
log is /workspace/effects.log (CONFORMANCE_EFFECTS_LOG overrides it for a run
outside a sandbox)."""

import functools
import itertools
import os
import signal
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import cairn

EFFECTS_LOG = os.environ.get("CONFORMANCE_EFFECTS_LOG", "/workspace/effects.log")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def log(line: str) -> None:
    with open(EFFECTS_LOG, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def logged(line: str) -> int:
    with open(EFFECTS_LOG, encoding="utf-8") as f:
        return sum(1 for entry in f if entry == line + "\n")


def crash() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def blob(i: int, n: int) -> str:
    # The j-th letter is chr(97 + (j * 7 + i) % 26): a pattern of period 26.
    period = "".join(chr(97 + (j * 7 + i) % 26) for j in range(26))
    return (period * (n // 26 + 1))[:n]


def ms(t: datetime) -> int:
    return (t - EPOCH) // timedelta(milliseconds=1)


def steps(ctx: cairn.Context, input: Any) -> Any:
    crash_at = input.get("crash_at")

    def body(i: int) -> int:
        log(f"s{i}")
        if i == crash_at and ctx.attempt == 1:
            crash()
        return i * i

    total = sum(ctx.step(f"s{i}", functools.partial(body, i)) for i in range(input["n"]))
    return {"sum": total, "attempt": ctx.attempt}


def logging_step(ctx: cairn.Context, name: str, value: int) -> Any:
    def body() -> int:
        log(name)
        return value

    return ctx.step(name, body)


def nondeterminism(ctx: cairn.Context, input: Any) -> Any:
    logging_step(ctx, "a", 1)
    if ctx.attempt == 1:
        logging_step(ctx, "b", 2)
        crash()
    try:
        logging_step(ctx, "c", 3)
    except BaseException:  # swallows every error: the run must fail all the same
        pass
    return {"caught": True}


def patched(ctx: cairn.Context, input: Any) -> Any:
    # Attempt 1 is the code before the patches; later attempts, the code after.
    logging_step(ctx, "a", 1)
    if ctx.attempt == 1:
        logging_step(ctx, "old", 2)
        crash()
    first = ctx.patched("fix-1")
    logging_step(ctx, "new" if first else "old", 2)
    second = ctx.patched("fix-2")
    if ctx.attempt == 2:
        crash()
    return {"first": first, "second": second, "attempt": ctx.attempt}


def retry(ctx: cairn.Context, input: Any) -> Any:
    def flaky() -> str:
        log("flaky")
        if logged("flaky") < 3:
            raise RuntimeError("transient")
        return "ok"

    policy = cairn.Retry(max_attempts=3, initial_delay=0.05, multiplier=2, max_delay=1.0, jitter=0)
    return {"value": ctx.step("flaky", flaky, policy)}


def exhausted(ctx: cairn.Context, input: Any) -> Any:
    def always() -> None:
        log("always")
        raise RuntimeError("always broken")

    try:
        ctx.step("always", always, cairn.Retry(max_attempts=2, initial_delay=0.01, jitter=0))
    except cairn.StepFailed as e:
        return {"step": e.step, "message": e.cause}
    raise AssertionError("step 'always' did not fail")


def terminal(ctx: cairn.Context, input: Any) -> Any:
    def fatal() -> None:
        log("fatal")
        raise cairn.TerminalError("bad input")

    return ctx.step("fatal", fatal, cairn.Retry(max_attempts=5))


def signals(ctx: cairn.Context, input: Any) -> Any:
    approval = ctx.wait_signal("approval")
    return {"approval": approval, "absent": ctx.wait_signal("absent", timeout=0.2)}


def timers(ctx: cairn.Context, input: Any) -> Any:
    t0 = ctx.now()
    ctx.sleep(0.3)
    t1 = ctx.now()
    r = ctx.random()
    if input.get("crash") and ctx.attempt == 1:
        crash()
    return {"slept_ms": ms(t1) - ms(t0), "now0": ms(t0), "random": r, "attempt": ctx.attempt}


def children(ctx: cairn.Context, input: Any) -> Any:
    h = ctx.start_child(input["agent"], {"scenario": "steps", "n": 3})
    out = ctx.join(h)
    g = ctx.start_child(input["agent"], {"scenario": "terminal"})
    try:
        ctx.join(g)
    except cairn.ChildFailed as e:
        return {"child": out, "failed_type": e.type, "child_run": h.run_id}
    raise AssertionError("the terminal child did not fail")


def cancel(ctx: cairn.Context, input: Any) -> Any:
    logging_step(ctx, "started", 0)

    def tick(i: int) -> int:
        time.sleep(0.02)
        return i

    for i in itertools.count():
        if ctx.cancelled:
            break
        ctx.step(f"tick{i}", functools.partial(tick, i))
    return {"stopped": True}


def large_output(ctx: cairn.Context, input: Any) -> Any:
    value = ctx.step("big", lambda: blob(0, input["bytes"]))
    return {"length": len(value), "head": value[:16]}


def big_history(ctx: cairn.Context, input: Any) -> Any:
    n, size = input["blobs"], input["blob_bytes"]
    verified = sum(1 for i in range(n) if ctx.step(f"blob{i}", functools.partial(blob, i, size)) == blob(i, size))
    if ctx.attempt == 1:
        crash()
    return {"verified": verified, "attempt": ctx.attempt}


def emit(ctx: cairn.Context, input: Any) -> Any:
    ctx.emit({"progress": 1})
    ctx.step("s", lambda: 1)
    return {"ok": True}


SCENARIOS = {f.__name__: f for f in (steps, nondeterminism, patched, retry, exhausted, terminal, signals, timers, children,
                                     cancel, large_output, big_history, emit)}


def workflow(ctx: cairn.Context, input: Any) -> Any:
    return SCENARIOS[input["scenario"]](ctx, input)


if __name__ == "__main__":
    cairn.main(workflow)
