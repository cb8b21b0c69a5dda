#!/usr/bin/env python3
"""The tables the docs show are the ones cairn prints.

Runs this build's `cairn ls` and `cairn doctor` in scratch homes and checks
every transcript in README.md and docs/*.md against them: each `cairn ls`
header line (a column added or renamed shows), and each `cairn doctor` block's
checks, by name and in order (as root, the block must list exactly what
doctor prints here; as another user, whose checks differ, names it does not
print fail).

usage: check_doc_tables.py SOURCE_DIR BUILD_DIR
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

CHECK = re.compile(r"^(?:ok  |FAIL) (.{22}) ")


def cairn(build, home, *args):
    env = dict(os.environ, CAIRN_HOME=home)
    for name in ("CAIRN_DB", "CAIRN_CRASH_POINT", "CAIRN_LLM_BASE_URL"):
        env.pop(name, None)
    result = subprocess.run([os.path.join(build, "cli/cairn"), *args], env=env, capture_output=True, text=True,
                            timeout=300)
    return result.stdout


def main():
    source, build = sys.argv[1], sys.argv[2]
    scratch = tempfile.mkdtemp(prefix="cairn-doc-tables-")
    try:
        home = os.path.join(scratch, "home")
        cairn(build, home, "submit", os.path.join(build, "tests/agents/step_agent"), "--id", "r1", "--sandbox", "none")
        header = cairn(build, home, "ls").splitlines()[0].rstrip()
        doctor = [m.group(1).rstrip() for m in map(CHECK.match, cairn(build, os.path.join(scratch, "fresh"),
                                                                      "doctor").splitlines()) if m]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not header.startswith("ID ") or not doctor:
        print(f"check_doc_tables: cairn printed no table here (ls: {header!r}, doctor: {doctor})", file=sys.stderr)
        return 1

    problems, tables, blocks = [], 0, 0
    for path in [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "*.md"))):
        lines = open(path, encoding="utf-8").read().splitlines()
        where = os.path.relpath(path, source)
        for i, line in enumerate(lines):
            if line.startswith("ID ") and " STATUS " in line:
                tables += 1
                if line.rstrip() != header:
                    problems.append(f"{where}:{i + 1}: `cairn ls` header\n  shown:   {line.rstrip()}\n  printed: {header}")
            if line.strip() in ("$ cairn doctor", "$ ./build/cli/cairn doctor"):
                shown = []
                for after in lines[i + 1:]:
                    m = CHECK.match(after)
                    if m:
                        shown.append(m.group(1).rstrip())
                    elif not after.startswith("     "):  # a fix's line belongs to its check
                        break
                blocks += 1
                if os.geteuid() == 0 and shown != doctor or any(name not in doctor for name in shown):
                    problems.append(f"{where}:{i + 1}: `cairn doctor` checks\n  shown:   {shown}\n  printed: {doctor}")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"docs: {tables} `cairn ls` tables and {blocks} `cairn doctor` transcripts as cairn prints them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
