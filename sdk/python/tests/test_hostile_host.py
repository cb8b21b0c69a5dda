"""A host that breaks the protocol: the agent sends nothing more and exits
with 2 (before it accepted a start) or 3 (after), never hangs."""

import os
import socket
import subprocess
import sys
import unittest
from typing import Any

import cairn
from tests.fake_host import DEADLINE_S, FakeHost

START = {"t": "start", "v": 2, "run_id": "run-test", "input": None, "attempt": 1, "history_steps": 0,
         "next_step_attempt": 1}


def two_steps(ctx: cairn.Context, input: Any) -> Any:
    return [ctx.step("s0", lambda: 0), ctx.step("s1", lambda: 1)]


def answered_with(raw: bytes) -> tuple[int, bytes]:
    """Exit code and what the agent sent after hello, when hello is answered with `raw`."""
    host = FakeHost(two_steps)
    host.read()
    host.sock.sendall(raw)
    if not raw:
        host.sock.shutdown(socket.SHUT_WR)
    rest = host.rest()
    return host.finish(), rest


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


class BadFrameInsteadOfStart(unittest.TestCase):
    def test_each_is_refused_with_exit_2_and_nothing_sent(self) -> None:
        cases = {
            "zero length": b"\0\0\0\0",
            "length above 16 MiB": ((16 << 20) + 1).to_bytes(4, "big") + b"{",
            "invalid JSON": frame(b'{"t":'),
            "a JSON array": frame(b"[1]"),
            "trailing garbage": frame(b'{"t":"cancel","reason":"x"} x'),
            "invalid UTF-8": frame(b'{"t":"reject","error":"\xff"}'),
            "a lone surrogate escape": frame(b'{"t":"reject","error":"\\ud800"}'),
            "NaN": frame(b'{"t":"start","v":NaN}'),
            "a number beyond a double": frame(b'{"t":"start","v":1e400}'),
            "nesting deeper than 128": frame(b'{"t":"start","input":' + b"[" * 200 + b"]" * 200 + b"}"),
            "nesting deep enough to overflow a recursive parser": frame(b'{"x":' + b"[" * 100000 + b"]" * 100000 + b"}"),
            "a start of version 3": frame(b'{"t":"start","v":3,"run_id":"r","input":null,"attempt":1,'
                                          b'"history_steps":0,"next_step_attempt":1}'),
            "a start with a string seq": frame(b'{"t":"start","v":2,"run_id":"r","input":null,"attempt":1,'
                                               b'"history_steps":"0","next_step_attempt":1}'),
            "a start with attempt 1.0": frame(b'{"t":"start","v":2,"run_id":"r","input":null,"attempt":1.0,'
                                              b'"history_steps":0,"next_step_attempt":1}'),
            "an ack": frame(b'{"t":"ack","seq":0}'),
            "an unknown type": frame(b'{"t":"hello","v":2,"sdk":""}'),
            "a reject": frame(b'{"t":"reject","error":"v1 only"}'),
            "the channel closing": b"",
        }
        for case, raw in cases.items():
            with self.subTest(case):
                self.assertEqual(answered_with(raw), (2, b""))


class BadAnswerAfterStart(unittest.TestCase):
    def answered(self, answer: dict[str, Any], history_steps: int = 0) -> tuple[int, bytes]:
        host = FakeHost(two_steps)
        host.start(history_steps=history_steps)
        first = host.read()
        if first["t"] == "begin":
            host.read()  # the step
        host.send(answer)
        rest = host.rest()
        return host.finish(), rest

    def test_each_is_refused_with_exit_3_and_nothing_sent(self) -> None:
        step = {"seq": 0, "name": "s0", "kind": "step", "status": "ok", "output": 0, "attempt": 1}
        cases: dict[str, tuple[dict[str, Any], int]] = {
            "an ack for the wrong seq": ({"t": "ack", "seq": 1}, 0),
            "an ack whose alone is not a boolean": ({"t": "ack", "seq": 0, "alone": 1}, 0),
            "a retry of a step that succeeded": ({"t": "retry", "seq": 0, "attempt": 2, "delay_ms": 1}, 0),
            "a result instead of an ack": ({"t": "result", **step, "kind": "tool"}, 0),
            "a second start": (START, 0),
            "a history from the wrong seq": ({"t": "history", "from": 1, "steps": [step | {"seq": 1}]}, 2),
            "a history past history_steps": ({"t": "history", "from": 0, "steps": [step, step | {"seq": 1}]}, 1),
            "a history out of order": ({"t": "history", "from": 0, "steps": [step, step]}, 2),
            "a history step with status maybe": ({"t": "history", "from": 0, "steps": [step | {"status": "maybe"}]}, 1),
            "a history step with an empty name": ({"t": "history", "from": 0, "steps": [step | {"name": ""}]}, 1),
            "a history step with a null error type": ({"t": "history", "from": 0, "steps": [
                step | {"status": "error", "error": {"message": "m", "type": None}}]}, 1),
            "an empty history": ({"t": "history", "from": 0, "steps": []}, 1),
        }
        for case, (answer, history_steps) in cases.items():
            with self.subTest(case):
                self.assertEqual(self.answered(answer, history_steps), (3, b""))

    def test_a_result_of_another_kind_is_refused(self) -> None:
        host = FakeHost(lambda ctx, input: ctx.tool("http.fetch", {}))
        host.start()
        tool = host.read()
        host.result(tool, "sleep", "sleep", {"until_ms": 1})
        self.assertEqual((host.rest(), host.finish()), (b"", 3))

    def test_a_frame_nobody_asked_for_is_refused(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            ctx.step("s0", lambda: 0)
            # Both frames arrive with the ack; the second is seen at the next read of the channel.
            return ctx.cancelled

        host = FakeHost(workflow)
        host.start()
        host.read()
        host.read()
        host.sock.sendall(frame(b'{"t":"ack","seq":0}') + frame(b'{"t":"ack","seq":0}'))
        self.assertEqual((host.rest(), host.finish()), (b"", 3))

    def test_a_workflow_that_swallows_the_broken_host_still_stops(self) -> None:
        def workflow(ctx: cairn.Context, input: Any) -> Any:
            try:
                ctx.step("s0", lambda: 0)
            except BaseException:
                pass
            return "done anyway"

        host = FakeHost(workflow)
        host.start()
        host.read()
        host.read()
        host.send({"t": "ack", "seq": 7})
        self.assertEqual((host.rest(), host.finish()), (b"", 3))


class NoChannel(unittest.TestCase):
    def test_started_without_cairn_it_prints_a_hint_and_exits_2(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        env.pop("CAIRN_CHANNEL_FD", None)
        code = "import cairn; cairn.main(lambda ctx, input: None)"
        for channel in (None, "0", "x"):
            with self.subTest(channel=channel):
                if channel is not None:
                    env["CAIRN_CHANNEL_FD"] = channel
                p = subprocess.run([sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL,
                                   capture_output=True, text=True, timeout=DEADLINE_S)
                self.assertEqual(p.returncode, 2)
                self.assertIn("start it with `cairn run PROGRAM", p.stderr)


if __name__ == "__main__":
    unittest.main()
