#!/usr/bin/env python3
"""The one version of cairn (the CMake project's, given as the first
argument) is the one every SDK package and the changelog say."""
import json
import pathlib
import re
import sys

version, root = sys.argv[1], pathlib.Path(sys.argv[2])
found = {
    "sdk/js/package.json": json.loads((root / "sdk/js/package.json").read_text())["version"],
    "sdk/js/lib/version.js": re.search(r'version = "([^"]+)"', (root / "sdk/js/lib/version.js").read_text()).group(1),
    "sdk/python/src/cairn/_version.py":
        re.search(r'__version__ = "([^"]+)"', (root / "sdk/python/src/cairn/_version.py").read_text()).group(1),
}
changelog = (root / "CHANGELOG.md").read_text()
found["CHANGELOG.md (its newest heading)"] = re.search(r"^## \[?([0-9][^\] ]*)", changelog, re.M).group(1)
wrong = {where: v for where, v in found.items() if v != version}
for where, v in wrong.items():
    print(f"{where} says {v}; the CMake project (CMakeLists.txt) says {version}: make them agree", file=sys.stderr)
sys.exit(1 if wrong else 0)
