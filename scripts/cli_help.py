"""What `cairn --help` and `cairn SUB --help` say, parsed: the subcommands and
the options of each. The man pages (man_pages.py) and the shell completions
(completions.py) are made from it, so that neither can say other than --help.

CLI11 prints a help like this (a name column 30 wide, indent included; a
name too wide for it puts the description on the next line):

    the daemon: run submitted runs, ...
    Usage: cairn serve [OPTIONS]

    Positionals:
      agent FILE REQUIRED         the agent program (built with the cairn SDK)

    Options:
      -h,--help                   Print this help message and exit
      --log-format TEXT:{text,json}
                                  text (default) or json: ...
      --prestart Needs: --warm    with --warm: ...

    Subcommands:
      run                         start a run of AGENT and follow it to the end

An option's value is named by the word after its names (TEXT, INT, FILE,
DIR, TEXT:{a,b}, :FILE); a flag has none. An option group adds a heading
"[Option Group: NAME]" and its own indented "Options:".
"""
import dataclasses
import re
import subprocess
import sys

SECTIONS = ("Positionals", "Options", "Subcommands")
# CLI11's name column (30) less the indent: where a description begins.
NAME_WIDTH = 28
# A word naming a value: upper-case letters, then a check's suffix (":FILE",
# ":{a,b}", ":INT in [1 - 8]" begins so); "Needs:" and "(Env:X)" are not one.
VALUE_NAME = re.compile(r"[A-Z]*(?::\S*)?")


@dataclasses.dataclass
class Entry:
    names: list[str]  # "-h", "--help"; a positional's or subcommand's one name
    value: str  # the value's name as --help gives it; "" for a flag or a subcommand
    required: bool
    summary: str

    def kind(self) -> str:
        """flag, file, dir, choice or text: what a shell can complete for its value."""
        if not self.value:
            return "flag"
        if "{" in self.value:
            return "choice"
        words = set(self.value.split(":"))
        return "file" if "FILE" in words else "dir" if "DIR" in words else "text"

    def choices(self) -> list[str]:
        found = re.search(r"\{([^}]*)\}", self.value)
        return found.group(1).split(",") if found else []


@dataclasses.dataclass
class Help:
    description: str
    positionals: list[Entry]
    options: list[Entry]
    subcommands: list[Entry]


def help_text(cairn: str, *subcommand: str) -> str:
    """Runs `cairn [SUB] --help`, with argv[0] "cairn": CLI11 puts argv[0] in
    its usage line, which must name the command, not the build's path."""
    return subprocess.run(["cairn", *subcommand, "--help"], executable=cairn, check=True, capture_output=True,
                          text=True).stdout


def _split(head: str, more: list[str]) -> tuple[str, str]:
    """An entry's names and value, and its description."""
    # A description begins on the head's line, after the name column, unless
    # the names and value fill the column: then it is on the lines below.
    if more and len(head) >= NAME_WIDTH:
        return head, " ".join(more)
    return head[:NAME_WIDTH], " ".join([head[NAME_WIDTH:].strip(), *more]).strip()


def _entries(lines: list[str]) -> list[tuple[str, int, str, list[str]]]:
    """Each entry of a help as (its section, the index of its first line,
    that line stripped, the lines that continue it stripped)."""
    entries: list[tuple[str, int, str, list[str]]] = []
    section = None
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped.endswith(":") and stripped[:-1] in SECTIONS:
            section = stripped[:-1]
        elif stripped.startswith("[Option Group:"):
            section = None  # its description and rule, until its own "Options:"
        elif section and stripped:
            if len(line) - len(stripped) >= NAME_WIDTH and entries and entries[-1][0] == section:
                entries[-1][3].append(stripped)
            else:
                entries.append((section, index, stripped, []))
    return entries


def parse(text: str) -> Help:
    lines = text.splitlines()
    usage = next(i for i, line in enumerate(lines) if line.startswith("Usage:"))
    result = Help(" ".join(lines[:usage]).strip(), [], [], [])
    lists = {"Positionals": result.positionals, "Options": result.options, "Subcommands": result.subcommands}
    for section, _, head, more in _entries(lines):
        left, summary = _split(head, more)
        words = left.split()
        value = words[1] if len(words) > 1 and VALUE_NAME.fullmatch(words[1]) else ""
        if section == "Subcommands":
            lists[section].append(Entry([words[0]], "", False, summary))
        elif section == "Positionals":
            lists[section].append(Entry([words[0]], value, "REQUIRED" in words, summary))
        else:
            lists[section].append(Entry(words[0].split(","), value, False, summary))
    return result


def spaced(text: str) -> str:
    """The help with two spaces at least before each description: CLI11 leaves
    one after a name one short of its column, and help2man (like a reader)
    then takes the description for part of the name."""
    lines = text.splitlines()
    for _, index, head, more in _entries(lines):
        left, summary = _split(head, more)
        if summary and not more and not left.endswith("  "):
            lines[index] = lines[index].replace(head, left + " " + head[len(left):], 1)
    return "\n".join(lines) + "\n"


# For help2man (man_pages.py), which runs a program with --help:
# `cli_help.py CAIRN [SUB] --help` prints `cairn [SUB] --help`, spaced.
if __name__ == "__main__":
    cairn, *subcommand, option = sys.argv[1:]
    assert option == "--help", "help2man is given the version (--version-string) and asks only for --help"
    sys.stdout.write(spaced(help_text(cairn, *subcommand)))
