"""examples/python/research_agent.py makes the C++ research agent's steps and
tool calls, in the same order, and writes the same report."""

import tempfile
import unittest
from pathlib import Path
from typing import Any

from tests.mini_host import ROOT, MiniHost

AGENT = ROOT / "examples" / "python" / "research_agent.py"
PAGE = "http://127.0.0.1:1/pages/wal.html"
REFUSED = "https://example.com/"


def tools(name: str, args: Any) -> tuple[bool, Any]:
    if name == "llm.chat":
        prompt = args["messages"][1]["content"]
        return True, {"content": f"reply to {prompt.split(':')[0]}"}
    if name == "http.fetch" and args["url"] == PAGE:
        return True, {"status": 200, "body": "<html><script>x()</script><p>Write-Ahead   Log</p></html>"}
    if name == "send_email":
        return True, {"message_id": "m-1"}
    return False, {"message": "host not in the policy", "type": "refused"}


class ResearchExample(unittest.TestCase):
    def test_the_steps_and_tool_calls_of_the_cpp_agent(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            input = {"topic": "SQLite WAL", "sources": [PAGE, REFUSED], "notify": "team@example.com"}
            host = MiniHost(AGENT, input, work / "effects.log", tools=tools, cwd=work)
            outcome = host.run()
            self.assertEqual(outcome, ("done", {"report": "/workspace/report.md", "sources_read": 1,
                                                "sources_skipped": 1, "mailed": "m-1"}))
            self.assertEqual([(r["kind"], r["name"]) for r in host.journal], [
                ("tool", "llm.chat"), ("tool", "http.fetch"), ("step", f"read {PAGE}"), ("tool", "llm.chat"),
                ("tool", "http.fetch"), ("now", "ctx.now"), ("tool", "llm.chat"), ("step", "write report"),
                ("tool", "send_email")])
            self.assertEqual(host.journal[2]["output"], {"chars": 17, "excerpt": " Write-Ahead Log "})
            self.assertEqual((work / "sources" / "http-127-0-0-1-1-pages-wal-html.txt").read_text(), " Write-Ahead Log ")
            report = (work / "report.md").read_text()
            self.assertIn(f"- {PAGE}: reply to Summarize this source for a note on SQLite WAL in two sentences\n", report)
            self.assertIn(f"- {REFUSED}: (refused: host not in the policy)\n", report)
            self.assertTrue(report.startswith("# SQLite WAL\n\n_20"))
            self.assertTrue(report.endswith("## Conclusion\n\nreply to Write the conclusion of a research note on "
                                            "SQLite WAL from these notes\n"))


if __name__ == "__main__":
    unittest.main()
