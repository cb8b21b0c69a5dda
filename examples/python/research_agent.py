#!/usr/bin/env python3
"""A research agent: examples/research_agent.cpp written with the Python SDK,
the same steps and the same tool calls, under the same policy
(examples/research_agent.policy.json). Everything that leaves its sandbox goes
through the host:
  - it fetches its sources with the http.fetch tool (the sandbox itself has no
    network; the policy lists the hosts it may reach),
  - it thinks with the llm.chat tool (the host holds the API key and talks to
    the model; tokens stream to `cairn run` live),
  - it mails the report with send_email, a user tool (a host program the
    policy declares at-most-once: after a crash it is never sent twice),
and it does its own work (cleaning pages, taking notes, writing the report)
inside the sandbox, in /workspace. Every step and every tool call is
journaled: after a crash the run resumes here, and no page is fetched and no
model call is made twice.

input: {"topic": "SQLite WAL", "sources": ["https://...", ...], "notify": "you@example.com", "pace_ms": 0}"""

import json
import os
import re
import time
from typing import Any

import cairn

RESEARCHER = "You are a careful research assistant. Be brief and concrete."

SCRIPTS = re.compile(r"<(script|style)[^>]*>[\s\S]*?</\1>", re.IGNORECASE)
TAGS = re.compile(r"<[^>]+>")
SPACE = re.compile(r"\s+")


def ask(ctx: cairn.Context, system: str, prompt: str, max_tokens: int = 400) -> str:
    """One chat turn through the host's llm.chat tool; the reply text."""
    reply = ctx.tool("llm.chat", {"messages": [{"role": "system", "content": system},
                                               {"role": "user", "content": prompt}],
                                  "max_tokens": max_tokens})
    return str(reply.get("content", ""))


def text_of(html: str) -> str:
    """The readable text of an HTML page: tags and scripts out, whitespace folded."""
    return SPACE.sub(" ", TAGS.sub(" ", SCRIPTS.sub(" ", html)))


def slug(s: str) -> str:
    out = ""
    for c in s:
        if c.isascii() and c.isalnum():
            out += c.lower()
        elif out and out[-1] != "-":
            out += "-"
    return out[:40]


def pace(input: Any) -> None:
    ms = input.get("pace_ms", 0)
    if ms > 0:
        time.sleep(ms / 1000)


def research(ctx: cairn.Context, input: Any) -> Any:
    topic = input.get("topic", "SQLite WAL")
    sources = input.get("sources", [])

    plan = ask(ctx, RESEARCHER, f"Plan a short research note on: {topic}. List the three questions it must answer.")

    notes: list[dict[str, Any]] = []
    for url in sources:
        try:
            page = ctx.tool("http.fetch", {"url": url})
        except cairn.ToolError as e:
            # Refused by the policy, or unreachable: the note says so and the run goes on.
            notes.append({"source": url, "skipped": f"{e.type}: {e}"})
            continue

        def read() -> dict[str, Any]:
            pace(input)
            text = text_of(page.get("body", ""))
            os.makedirs("sources", exist_ok=True)
            with open(f"sources/{slug(url)}.txt", "w", encoding="utf-8") as f:
                f.write(text)
            return {"chars": len(text), "excerpt": text[:1500]}

        cleaned = ctx.step(f"read {url}", read)
        summary = ask(ctx, RESEARCHER, f"Summarize this source for a note on {topic} in two sentences:\n\n"
                                       f"{cleaned['excerpt']}")
        notes.append({"source": url, "status": page.get("status"), "summary": summary})

    date = ctx.now().strftime("%Y-%m-%d %H:%M UTC")

    # The notes as the C++ agent words them (nlohmann's dump: sorted keys, compact).
    notes_text = json.dumps(notes, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    conclusion = ask(ctx, RESEARCHER, f"Write the conclusion of a research note on {topic} from these notes:\n"
                                      f"{notes_text}")

    def write_report() -> dict[str, Any]:
        pace(input)
        lines = [f"# {topic}\n\n_{date}_\n\n## Plan\n\n{plan}\n\n## Sources\n\n"]
        for n in notes:
            lines.append(f"- {n['source']}: {n['summary'] if 'summary' in n else '(' + n['skipped'] + ')'}\n")
        lines.append(f"\n## Conclusion\n\n{conclusion}\n")
        text = "".join(lines)
        with open("report.md", "w", encoding="utf-8") as f:
            f.write(text)
        read = sum(1 for n in notes if "summary" in n)
        return {"report": "/workspace/report.md", "sources_read": read, "sources_skipped": len(notes) - read,
                "text": text}

    report = ctx.step("write report", write_report)

    result = {"report": report["report"], "sources_read": report["sources_read"],
              "sources_skipped": report["sources_skipped"]}
    if "notify" in input:
        sent = ctx.tool("send_email", {"to": input["notify"], "subject": f"Research note: {topic}",
                                       "body": report["text"]})
        result["mailed"] = sent.get("message_id")
    return result


if __name__ == "__main__":
    cairn.main(research)
