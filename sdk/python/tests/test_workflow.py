"""The SDK against a fake host: steps, replay, retries, cancel, host operations."""

import time
import unittest
from datetime import timedelta
from typing import Any

import cairn
from tests.fake_host import FakeHost, record


class LiveSteps(unittest.TestCase):
    def test_a_step_is_sent_with_begin_and_its_acked_value_returned(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            return {"got": ctx.step("plan", lambda: (1, 2)), "input": input}

        host = FakeHost(workflow)
        host.start(input={"topic": "tides"})
        begin = host.read()
        self.assertEqual(begin, {"t": "begin", "seq": 0, "name": "plan", "kind": "step", "attempt": 1,
                                 "timeout_ms": 0, "max_attempts": 3, "initial_delay_ms": 100, "multiplier": 2.0,
                                 "max_delay_ms": 10000, "jitter": 0.2})
        step = host.read()
        self.assertEqual((step["t"], step["seq"], step["status"], step["output"], step["attempt"]),
                         ("step", 0, "ok", [1, 2], 1))
        host.send({"t": "ack", "seq": 0})
        # Live, the step returns the journal's value (a list), as replay would.
        self.assertEqual(host.read(), {"t": "done", "output": {"got": [1, 2], "input": {"topic": "tides"}}})
        self.assertEqual(host.rest(), b"")
        self.assertEqual(host.finish(), 0)

    def test_the_decorator_makes_each_call_a_step_named_after_the_function(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            @ctx.durable
            def square(x: int) -> int:
                return x * x

            @ctx.durable(name="cube", retry=cairn.Retry(max_attempts=5, timeout=timedelta(seconds=2)))
            def third(x: int) -> int:
                return x * x * x

            return [square(3), third(2)]

        host = FakeHost(workflow)
        host.start()
        self.assertEqual(host.ack_step()["name"], "square")
        begin = host.read()
        self.assertEqual((begin["name"], begin["max_attempts"], begin["timeout_ms"]), ("cube", 5, 2000))
        self.assertEqual(host.read()["output"], 8)
        host.send({"t": "ack", "seq": 1, "alone": True})  # a host with no other attempt says so
        self.assertEqual(host.read(), {"t": "done", "output": [9, 8]})
        self.assertEqual(host.finish(), 0)

    def test_a_value_that_is_not_json_fails_that_step_not_the_sdk(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            try:
                ctx.step("bad", lambda: {"x": float("nan")}, cairn.Retry.no_retry())
            except cairn.StepFailed as e:
                return {"type": e.type, "cause": e.cause}
            return None

        host = FakeHost(workflow)
        host.start()
        step = host.ack_step()
        self.assertEqual((step["status"], step["error"]["type"], step["terminal"]), ("error", "ValueError", False))
        self.assertIn("the output of step 'bad' is not JSON", step["error"]["message"])
        done = host.read()
        self.assertEqual(done["output"]["type"], "ValueError")
        self.assertEqual(host.finish(), 0)

    def test_now_random_and_emit(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            ctx.emit({"progress": 1})
            return [ctx.now().timestamp(), ctx.random()]

        host = FakeHost(workflow)
        host.start()
        self.assertEqual(host.read(), {"t": "emit", "data": {"progress": 1}})
        now = host.ack_step()
        self.assertEqual((now["name"], now["kind"]), ("ctx.now", "now"))
        self.assertIsInstance(now["output"], int)
        rnd = host.ack_step()
        self.assertEqual((rnd["name"], rnd["kind"]), ("ctx.random", "random"))
        self.assertTrue(0 <= rnd["output"] < 1)
        self.assertEqual(host.read()["output"], [now["output"] / 1000, rnd["output"]])
        self.assertEqual(host.finish(), 0)


class Replay(unittest.TestCase):
    def test_replay_pulls_the_history_in_chunks_and_runs_no_journaled_step(self) -> None:
        ran: list[str] = []

        def step(name: str) -> Any:
            ran.append(name)
            return name.upper()

        def workflow(ctx: cairn.Context, input: Any) -> Any:
            outs = [ctx.step(f"s{i}", lambda i=i: step(f"s{i}")) for i in range(4)]
            outs.append(ctx.emit("during replay") or ctx.replaying)
            try:
                ctx.step("s4", lambda: step("s4"))
            except cairn.StepFailed as e:
                outs.append(e.cause)
            outs.append(ctx.replaying)
            outs.append(ctx.step("live", lambda: step("live")))
            return outs

        host = FakeHost(workflow)
        host.start(history_steps=5, attempt=2, next_step_attempt=3)
        self.assertEqual(host.read(), {"t": "history", "from": 0})
        host.send({"t": "history", "from": 0, "steps": [record(0, "s0", "a"), record(1, "s1", "b")]})
        self.assertEqual(host.read(), {"t": "history", "from": 2})
        host.send({"t": "history", "from": 2, "steps": [record(2, "s2", "c"), record(3, "s3", "d"),
                                                        record(4, "s4", error={"message": "boom", "type": "X"})]})
        begin = host.read()  # the emit made while replaying was dropped
        self.assertEqual((begin["t"], begin["seq"], begin["name"], begin["attempt"]), ("begin", 5, "live", 3))
        self.assertEqual(host.read()["attempt"], 3)
        host.send({"t": "ack", "seq": 5})
        self.assertEqual(host.read(), {"t": "done", "output": ["a", "b", "c", "d", True, "boom", False, "LIVE"]})
        self.assertEqual(ran, ["live"])
        self.assertEqual(host.finish(), 0)

    def test_a_step_that_no_longer_matches_fails_the_run_even_if_caught(self) -> None:
        ran: list[str] = []

        def workflow(ctx: cairn.Context, input: Any) -> Any:
            try:
                ctx.step("search", lambda: ran.append("search"))
            except BaseException:
                pass
            return {"caught": True}

        host = FakeHost(workflow)
        host.start(history_steps=1)
        self.assertEqual(host.read(), {"t": "history", "from": 0})
        host.send({"t": "history", "from": 0, "steps": [record(0, "plan", 1)]})
        fail = host.read()
        self.assertEqual(fail["t"], "fail")
        self.assertEqual(fail["error"]["type"], "nondeterminism")
        self.assertIn("non-determinism at step 0: the journal has step 'plan' but the code now asks for step 'search'",
                      fail["error"]["message"])
        self.assertEqual(ran, [])
        self.assertEqual(host.finish(), 1)


class Retries(unittest.TestCase):
    def test_a_failed_attempt_is_reported_and_retried_when_the_host_says_so(self) -> None:
        attempts: list[int] = []

        def flaky() -> str:
            attempts.append(1)
            if len(attempts) < 2:
                raise RuntimeError("HTTP 503")
            return "ok"

        def workflow(ctx: cairn.Context, input: Any) -> Any:
            return ctx.step("search", flaky, cairn.Retry(max_attempts=3, initial_delay=0.05, jitter=0))

        host = FakeHost(workflow)
        host.start()
        begin = host.read()
        self.assertEqual((begin["max_attempts"], begin["initial_delay_ms"], begin["jitter"]), (3, 50, 0.0))
        step = host.read()
        self.assertEqual((step["status"], step["error"], step["terminal"]),
                         ("error", {"message": "HTTP 503", "type": "RuntimeError"}, False))
        host.send({"t": "retry", "seq": 0, "attempt": 2, "delay_ms": 20})
        self.assertEqual(host.read()["attempt"], 2)  # begin of attempt 2
        step = host.read()
        self.assertEqual((step["status"], step["output"], step["attempt"]), ("ok", "ok", 2))
        host.send({"t": "ack", "seq": 0})
        self.assertEqual(host.read(), {"t": "done", "output": "ok"})
        self.assertEqual(host.finish(), 0)

    def test_a_terminal_error_is_reported_as_terminal_and_fails_the_run_with_its_type(self) -> None:
        def fatal() -> None:
            raise cairn.TerminalError("bad input")

        host = FakeHost(lambda ctx, input: ctx.step("fatal", fatal, cairn.Retry(max_attempts=5)))
        host.start()
        step = host.ack_step()
        self.assertEqual((step["error"]["type"], step["terminal"]), ("TerminalError", True))
        fail = host.read()
        self.assertEqual(fail, {"t": "fail", "error": {"message": "step 'fatal' failed: bad input",
                                                       "type": "TerminalError"}})
        self.assertEqual(host.finish(), 1)


class Cancel(unittest.TestCase):
    def test_a_cancel_stops_a_pending_wait_and_the_run_ends_cancelled(self) -> None:
        host = FakeHost(lambda ctx, input: ctx.wait_signal("approved", timeout=86400))
        host.start()
        wait = host.read()
        self.assertEqual(wait, {"t": "wait", "seq": 0, "signal": "approved", "timeout_ms": 86400000})
        host.send({"t": "cancel", "reason": "cancelled by the operator"})
        self.assertEqual(host.read(), {"t": "fail", "error": {"message": "cancelled by the operator",
                                                              "type": "cancelled"}})
        self.assertEqual(host.rest(), b"")
        self.assertEqual(host.finish(), 1)

    def test_a_cancel_stops_a_retry_delay_at_once(self) -> None:
        caught: list[str] = []

        def workflow(ctx: cairn.Context, input: Any) -> Any:
            try:
                ctx.step("slow", lambda: 1 / 0)
            except BaseException as e:
                caught.append(type(e).__name__)  # the run ends cancelled all the same
            return None

        host = FakeHost(workflow)
        host.start()
        host.read()
        self.assertEqual(host.read()["error"]["type"], "ZeroDivisionError")
        host.send({"t": "retry", "seq": 0, "attempt": 2, "delay_ms": 100 * 365 * 24 * 3600 * 1000})
        time.sleep(0.2)  # lets the agent begin its wait (it must end at the cancel whenever that comes)
        began = time.monotonic()
        host.send({"t": "cancel", "reason": "run timeout"})
        self.assertEqual(host.read(), {"t": "fail", "error": {"message": "run timeout", "type": "cancelled"}})
        self.assertLess(time.monotonic() - began, 20)
        self.assertEqual((host.finish(), caught), (1, ["CancelledError"]))

    def test_cancelled_polls_the_channel(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            ctx.step("started", lambda: None)
            deadline = time.monotonic() + 30
            while not ctx.cancelled and time.monotonic() < deadline:
                time.sleep(0.005)
            return ctx.cancelled

        host = FakeHost(workflow)
        host.start()
        host.ack_step()
        host.send({"t": "cancel", "reason": "stop"})
        self.assertEqual(host.read(), {"t": "fail", "error": {"message": "stop", "type": "cancelled"}})
        self.assertEqual(host.finish(), 1)


    def test_a_cancel_before_start_ends_the_run_cancelled_without_running_a_step(self) -> None:
        ran: list[int] = []
        host = FakeHost(lambda ctx, input: ctx.step("s", lambda: ran.append(1)))
        host.read()
        host.send({"t": "cancel", "reason": "early"})
        host.send({"t": "start", "v": 2, "run_id": "r", "input": None, "attempt": 1, "history_steps": 0,
                   "next_step_attempt": 1})
        self.assertEqual(host.read(), {"t": "fail", "error": {"message": "early", "type": "cancelled"}})
        self.assertEqual((ran, host.finish()), ([], 1))

    def test_a_pending_tool_call_is_answered_after_a_cancel(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            ctx.tool("echo", {"i": 1})
            return "not cancelled?"

        host = FakeHost(workflow)
        host.start()
        tool = host.read()
        host.send({"t": "cancel", "reason": "stop"})
        host.result(tool, "tool", "echo", {"i": 1})  # the host still answers a tool call it had
        self.assertEqual(host.read(), {"t": "fail", "error": {"message": "stop", "type": "cancelled"}})
        self.assertEqual(host.finish(), 1)


class Misuse(unittest.TestCase):
    def test_a_journaled_call_inside_a_step_fails_that_step(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            try:
                ctx.step("outer", lambda: ctx.step("inner", lambda: 1), cairn.Retry.no_retry())
            except cairn.StepFailed as e:
                return e.cause
            return None

        host = FakeHost(workflow)
        host.start()
        self.assertEqual(host.ack_step()["error"]["type"], "RuntimeError")
        self.assertIn("cannot be called inside a step", host.read()["output"])
        self.assertEqual(host.finish(), 0)

    def test_an_exception_quoting_20_mb_is_reported_clipped_and_the_run_goes_on(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            def huge() -> None:
                raise RuntimeError("x" * 20_000_000)

            try:
                ctx.step("huge", huge, cairn.Retry.no_retry())
            except cairn.StepFailed as e:
                return [len(e.cause), ctx.step("next", lambda: 2)]
            return None

        host = FakeHost(workflow)
        host.start()
        message = host.ack_step()["error"]["message"]
        self.assertTrue(message.endswith("... (19934464 more characters)"))
        self.assertEqual(host.ack_step()["seq"], 1)
        self.assertEqual(host.read(), {"t": "done", "output": [len(message), 2]})
        self.assertEqual(host.finish(), 0)

    def test_sleep_until_refuses_a_naive_datetime(self) -> None:
        from datetime import datetime

        def workflow(ctx: cairn.Context, input: Any) -> Any:
            try:
                ctx.sleep_until(datetime(2030, 1, 1))
            except ValueError as e:
                return str(e)
            return None

        host = FakeHost(workflow)
        host.start()
        self.assertIn("timezone-aware", host.read()["output"])
        self.assertEqual(host.finish(), 0)


class HostOperations(unittest.TestCase):
    def test_a_tool_error_is_raised_with_its_type(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            try:
                ctx.tool("http.fetch", {"url": "https://example.com/"})
            except cairn.ToolError as e:
                return [e.tool, e.type, str(e)]
            return None

        host = FakeHost(workflow)
        host.start()
        tool = host.read()
        self.assertEqual(tool, {"t": "tool", "seq": 0, "name": "http.fetch", "args": {"url": "https://example.com/"}})
        host.result(tool, "tool", "http.fetch", error={"message": "not granted", "type": "refused"})
        self.assertEqual(host.read(), {"t": "done", "output": ["http.fetch", "refused", "not granted"]})
        self.assertEqual(host.finish(), 0)

    def test_a_failed_child_raises_child_failed(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            child = ctx.start_child("worker", {"n": 1})
            try:
                ctx.join(child)
            except cairn.ChildFailed as e:
                return [e.run_id, e.type, e.cause]
            return None

        host = FakeHost(workflow)
        host.start()
        child = host.read()
        self.assertEqual(child, {"t": "child", "seq": 0, "agent": "worker", "input": {"n": 1}})
        host.result(child, "child", "worker", {"run_id": "run-child"})
        join = host.read()
        self.assertEqual(join, {"t": "join", "seq": 1, "run_id": "run-child"})
        host.result(join, "join", "run-child", error={"message": "step 'x' failed: no", "type": "child_failed"})
        self.assertEqual(host.read(), {"t": "done", "output": ["run-child", "child_failed", "step 'x' failed: no"]})
        self.assertEqual(host.finish(), 0)

    def test_sleep_and_a_signal_that_timed_out(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            ctx.sleep(timedelta(minutes=1))
            return ctx.wait_signal("absent", timeout=0.2)

        host = FakeHost(workflow)
        host.start()
        sleep = host.read()
        self.assertEqual(sleep, {"t": "sleep", "seq": 0, "duration_ms": 60000})
        host.result(sleep, "sleep", "sleep", {"until_ms": 1, "fired_at_ms": 2})
        wait = host.read()
        self.assertEqual(wait, {"t": "wait", "seq": 1, "signal": "absent", "timeout_ms": 200})
        host.result(wait, "signal", "absent", {"signal": "absent", "timed_out": True})
        self.assertEqual(host.read(), {"t": "done", "output": None})
        self.assertEqual(host.finish(), 0)

    def test_a_near_limit_output_travels_in_one_frame(self) -> None:
        size = (16 << 20) - 200
        host = FakeHost(lambda ctx, input: len(ctx.step("big", lambda: "x" * size)))
        host.start()
        self.assertEqual(len(host.ack_step()["output"]), size)
        self.assertEqual(host.read(), {"t": "done", "output": size})
        self.assertEqual(host.finish(), 0)

    def test_an_output_above_the_frame_limit_fails_the_step(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            try:
                ctx.step("huge", lambda: "x" * (16 << 20), cairn.Retry.no_retry())
            except cairn.StepFailed as e:
                return e.cause
            return None

        host = FakeHost(workflow)
        host.start()
        self.assertEqual(host.ack_step()["status"], "error")
        self.assertIn("is too large", host.read()["output"])
        self.assertEqual(host.finish(), 0)


if __name__ == "__main__":
    unittest.main()
