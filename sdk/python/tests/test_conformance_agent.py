"""tests/conformance/agents/conformance_agent.py run as a process by a small
host (mini_host.py): each scenario of SCENARIOS.md, crashes included."""

import tempfile
import time
import unittest
from pathlib import Path
from typing import Any

from tests.mini_host import ROOT, MiniHost

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


class EmptyStepCost(unittest.TestCase):
    def test_an_empty_step_costs_well_under_a_millisecond(self) -> None:
        """Prints µs per step (agent and this Python host together)."""
        with tempfile.TemporaryDirectory() as tmp:
            n = 2000
            host = MiniHost(AGENT, {"scenario": "steps", "n": n}, Path(tmp) / "effects.log")
            began = time.perf_counter()
            self.assertEqual(host.run()[0], "done")
            per_step_us = (time.perf_counter() - began) / n * 1e6
        print(f"\nempty step (with its effects-log append), Python SDK against a Python host: {per_step_us:.0f} us")
        self.assertLess(per_step_us, 5000)


if __name__ == "__main__":
    unittest.main()
