"""tests/conformance/agents/conformance_agent.py run as a process by a small
host (mini_host.py): each scenario of SCENARIOS.md, crashes included."""

import json
import os
import socket
import subprocess
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any

from tests.mini_host import ROOT, SDK_SRC, MiniHost

AGENT = ROOT / "tests" / "conformance" / "agents" / "conformance_agent.py"


class ConformanceAgent(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        self.effects = Path(self.tmp.name) / "effects.log"
        self.effects.touch()

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def run_scenario(self, input: dict[str, Any], **options: Any) -> tuple[MiniHost, tuple[str, Any]]:
        host = MiniHost(AGENT, input, self.effects, **options)
        return host, host.run()

    def effects_log(self) -> list[str]:
        return self.effects.read_text().splitlines()

    def test_steps_after_a_crash_run_each_body_once_more_at_most(self) -> None:
        host, outcome = self.run_scenario({"scenario": "steps", "n": 4, "crash_at": 2})
        self.assertEqual(outcome, ("done", {"sum": 0 + 1 + 4 + 9, "attempt": 2}))
        self.assertEqual(self.effects_log(), ["s0", "s1", "s2", "s2", "s3"])
        self.assertEqual(host.exit_codes, [-9, 0])

    def test_nondeterminism_fails_the_run_though_caught(self) -> None:
        host, outcome = self.run_scenario({"scenario": "nondeterminism"})
        self.assertEqual((outcome[0], outcome[1]["type"]), ("fail", "nondeterminism"))
        self.assertEqual(self.effects_log(), ["a", "b"])
        self.assertEqual(host.exit_codes, [-9, 1])

    def test_retry_and_exhausted_and_terminal(self) -> None:
        self.assertEqual(self.run_scenario({"scenario": "retry"})[1], ("done", {"value": "ok"}))
        self.assertEqual(self.run_scenario({"scenario": "exhausted"})[1],
                         ("done", {"step": "always", "message": "always broken"}))
        status, error = self.run_scenario({"scenario": "terminal"})[1]
        self.assertEqual(status, "fail")
        self.assertIn("bad input", error["message"])
        self.assertEqual(self.effects_log(), ["flaky"] * 3 + ["always"] * 2 + ["fatal"])

    def test_signals_timers_children_emit(self) -> None:
        self.assertEqual(self.run_scenario({"scenario": "signals"}, signals={"approval": {"by": "ann"}})[1],
                         ("done", {"approval": {"by": "ann"}, "absent": None}))
        host, (status, out) = self.run_scenario({"scenario": "timers", "crash": True})
        self.assertEqual((status, out["attempt"], host.exit_codes), ("done", 2, [-9, 0]))
        self.assertGreaterEqual(out["slept_ms"], 300)
        self.assertEqual([r["output"] for r in host.journal if r["kind"] == "now"][0], out["now0"])
        host, (status, out) = self.run_scenario({"scenario": "children", "agent": "conformance"})
        self.assertEqual((status, out["child"], out["failed_type"]), ("done", {"sum": 5, "attempt": 1}, "child_failed"))
        host, outcome = self.run_scenario({"scenario": "emit"})
        self.assertEqual((outcome, host.emitted), (("done", {"ok": True}), [{"progress": 1}]))

    def test_cancel_ends_the_run_cancelled(self) -> None:
        host, outcome = self.run_scenario({"scenario": "cancel"}, cancel_after_acks=3)
        self.assertEqual(outcome, ("fail", {"message": "cancelled by the test", "type": "cancelled"}))

    def test_outputs_near_the_frame_limit_and_a_history_larger_than_it(self) -> None:
        size = 16_000_000
        self.assertEqual(self.run_scenario({"scenario": "large_output", "bytes": size})[1],
                         ("done", {"length": size, "head": "ahovcjqxelszgnub"}))
        host, outcome = self.run_scenario({"scenario": "big_history", "blobs": 40, "blob_bytes": 1_000_000})
        self.assertEqual((outcome, host.exit_codes), (("done", {"verified": 40, "attempt": 2}), [-9, 0]))


class HostileHost(unittest.TestCase):
    """The agent process exits 2 or 3 and sends nothing when the host breaks the protocol."""

    def answered(self, *frames: bytes) -> tuple[int, bytes]:
        host, agent = socket.socketpair()
        env = dict(os.environ, CAIRN_CHANNEL_FD="3", CAIRN_RUN_ID="run-hostile", PYTHONPATH=str(SDK_SRC))
        proc = subprocess.Popen([str(AGENT)], env=env, close_fds=False, stderr=subprocess.DEVNULL,
                                preexec_fn=lambda: os.dup2(agent.fileno(), 3))
        agent.close()
        host.settimeout(60)
        hello = host.recv(4096)
        self.assertIn(b'"t":"hello"', hello)
        sent = b""
        for f in frames:
            host.sendall(f)
            # json.dumps writes '"t": "start"': the message is read, not its spacing.
            if len(f) > 4 and json.loads(f[4:]).get("t") == "start":
                sent += host.recv(4096)  # the begin and step of s0
                while sent.count(b'"t":') < 2:
                    sent += host.recv(4096)
        rest = b""
        while chunk := host.recv(65536):
            rest += chunk
        host.close()
        return proc.wait(60), rest

    def test_exit_codes(self) -> None:
        start = _frame({"t": "start", "v": 2, "run_id": "r", "input": {"scenario": "steps", "n": 2}, "attempt": 1,
                        "history_steps": 0, "next_step_attempt": 1})
        self.assertEqual(self.answered(b"\0\0\0\0"), (2, b""))
        self.assertEqual(self.answered(_frame({"t": "reject", "error": "no"})), (2, b""))
        self.assertEqual(self.answered(start, _frame({"t": "ack", "seq": 5})), (3, b""))


def _frame(m: dict[str, Any]) -> bytes:
    payload = json.dumps(m).encode()
    return len(payload).to_bytes(4, "big") + payload


class ManyEmptySteps(unittest.TestCase):
    def test_two_thousand_empty_steps_run_to_done(self) -> None:
        """Prints µs per step (agent and this Python host together); bench/step_latency
        measures the SDK's step against a raw commit, which a test does not time."""
        with tempfile.TemporaryDirectory() as tmp:
            n = 2000
            host = MiniHost(AGENT, {"scenario": "steps", "n": n}, Path(tmp) / "effects.log")
            began = time.perf_counter()
            self.assertEqual(host.run()[0], "done")
            self.assertEqual(len(host.journal), n)
            per_step_us = (time.perf_counter() - began) / n * 1e6
        print(f"\nempty step (with its effects-log append), Python SDK against a Python host: {per_step_us:.0f} us")


if __name__ == "__main__":
    unittest.main()
