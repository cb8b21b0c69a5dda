"""Retry and ChildHandle behave as values, and importing cairn stays cheap."""

import os
import subprocess
import sys
import unittest
from datetime import timedelta
from pathlib import Path

import cairn

SOURCE = Path(__file__).resolve().parents[1] / "src"


class Values(unittest.TestCase):
    def test_retry_is_an_immutable_value_with_defaults_and_checks(self) -> None:
        r = cairn.Retry(max_attempts=5, timeout=timedelta(seconds=2))
        self.assertEqual(r, cairn.Retry(5, 0.1, 2.0, 10.0, timedelta(seconds=2), 0.2))
        self.assertNotEqual(r, cairn.Retry(max_attempts=4, timeout=timedelta(seconds=2)))
        self.assertEqual(len({r, cairn.Retry(max_attempts=5, timeout=timedelta(seconds=2))}), 1)
        self.assertEqual(repr(cairn.Retry.no_retry()),
                         "Retry(max_attempts=1, initial_delay=0.1, multiplier=2.0, max_delay=10.0, timeout=None, "
                         "jitter=0.2)")
        with self.assertRaises(AttributeError):
            r.max_attempts = 1
        with self.assertRaises(AttributeError):
            r.other = 1
        with self.assertRaises(ValueError):
            cairn.Retry(max_attempts=0)
        with self.assertRaises(TypeError):
            cairn.Retry(max_attempts=True)
        match r:
            case cairn.Retry(attempts, initial):
                self.assertEqual((attempts, initial), (5, 0.1))

    def test_child_handle_is_an_immutable_value(self) -> None:
        h = cairn.ChildHandle("child-1")
        self.assertEqual(h, cairn.ChildHandle("child-1"))
        self.assertNotEqual(h, cairn.ChildHandle("child-2"))
        self.assertEqual(repr(h), "ChildHandle(run_id='child-1')")
        self.assertIn(cairn.ChildHandle("child-1"), {h})
        with self.assertRaises(AttributeError):
            h.run_id = "child-2"


class ImportCost(unittest.TestCase):
    def test_importing_cairn_leaves_out_the_heavy_modules(self) -> None:
        # A Python agent imports cairn at every start of every attempt:
        # dataclasses (with inspect, ast, dis, tokenize) and traceback cost
        # ~13 ms of it on a small machine and are not needed to run.
        heavy = ["dataclasses", "inspect", "traceback", "ast"]
        env = dict(os.environ, PYTHONPATH=str(SOURCE))
        loaded = subprocess.run(
            [sys.executable, "-S", "-c", f"import sys, cairn; print([m for m in {heavy!r} if m in sys.modules])"],
            env=env, check=True, capture_output=True, text=True).stdout.strip()
        self.assertEqual(loaded, "[]")


if __name__ == "__main__":
    unittest.main()
