#!/usr/bin/env python3
"""Writes cairn's man pages from the built cairn's --help, with Debian's
help2man: cairn(1) from `cairn --help`, and cairn-SUB(1) from `cairn SUB
--help` for each subcommand `cairn --help` lists. Each page is gzipped as
Debian installs them (cairn.1.gz).

    man_pages.py HELP2MAN CAIRN OUT_DIR
"""
import gzip
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

import cli_help

help2man, cairn, out = sys.argv[1], os.path.abspath(sys.argv[2]), pathlib.Path(sys.argv[3])
# "cairn 0.1.0", the first line of `cairn --version`; the lines after it (protocol
# and schemas) would land at the end of each page, under the subcommands.
version = subprocess.run([cairn, "--version"], check=True, capture_output=True,
                         text=True).stdout.splitlines()[0].split()[1]
top = cli_help.parse(cli_help.help_text(cairn))
subcommands = [(entry.names[0], entry.summary) for entry in top.subcommands]


def page(program: str, name: str, summary: str, help_option: str, see_also: list[str]) -> bytes:
    with tempfile.NamedTemporaryFile("w", suffix=".h2m") as include:
        include.write("[SEE ALSO]\n" + ",\n".join(f".BR {other} (1)" for other in see_also) + "\n")
        include.flush()
        # --no-info: there is no Texinfo manual to point to. --version-string
        # names the page (CAIRN-SERVE), and help2man then asks only for --help.
        return subprocess.run([help2man, "--no-info", "--section=1", f"--name={summary}", f"--source=cairn {version}",
                               f"--version-string={name} {version}", f"--help-option={help_option}",
                               f"--include={include.name}", program], check=True, capture_output=True).stdout


with tempfile.TemporaryDirectory() as work:
    # help2man reads the help through cli_help.py, which spaces it as help2man expects.
    program = pathlib.Path(work, "cairn")
    reader = shlex.join([sys.executable, os.path.abspath(cli_help.__file__), cairn])
    program.write_text(f'#!/bin/sh\nexec {reader} "$@"\n')
    program.chmod(0o755)
    pages = {"cairn": page(str(program), "cairn", top.description.removeprefix("cairn: "), "--help",
                           [f"cairn-{sub}" for sub, _ in subcommands])}
    for sub, summary in subcommands:
        pages[f"cairn-{sub}"] = page(str(program), f"cairn-{sub}", summary, f"{sub} --help", ["cairn"])

out.mkdir(parents=True, exist_ok=True)
# A subcommand that is gone must not leave its page behind.
for old in out.glob("*.1.gz"):
    old.unlink()
for name, text in pages.items():
    # mtime 0 and no file name inside, as gzip -n: the same page, the same bytes.
    (out / f"{name}.1.gz").write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
