#!/usr/bin/env python3
"""Checks that every relative link (and #anchor) in README.md and docs/*.md
resolves, so the front page and the pages behind it stay connected.
Usage: check_links.py ROOT"""
import os
import re
import sys


def slug(heading):
    heading = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def prose(path):
    """The lines of a Markdown file outside code fences, numbered."""
    fence = False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield n, line


def anchors(path):
    seen, out = {}, set()
    for _, line in prose(path):
        m = re.match(r"^#+ (.*)", line)
        if m:
            s = slug(m.group(1))
            k = seen.get(s, 0)
            seen[s] = k + 1
            out.add(s if k == 0 else f"{s}-{k}")
    return out


def main(root):
    docs = os.path.join(root, "docs")
    files = [os.path.join(root, "README.md")] + sorted(
        os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    bad = checked = 0
    for f in files:
        for n, line in prose(f):
            line = re.sub(r"`[^`]*`", "", line)
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"^(https?|mailto):", target):
                    continue
                checked += 1
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                if not os.path.exists(dest):
                    print(f"{f}:{n}: {target}: no such file")
                    bad += 1
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    print(f"{f}:{n}: {target}: no heading with that anchor")
                    bad += 1
    print(f"{checked} links checked, {bad} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
