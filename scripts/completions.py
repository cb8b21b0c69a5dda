#!/usr/bin/env python3
"""Writes cairn's shell completions from the built cairn's --help: OUT_DIR/cairn
for bash, OUT_DIR/_cairn for zsh. They complete the subcommands, each one's
options, a FILE or DIR value as a path and a value of a few choices ({a,b}) as
one of them; run ids are in the journal, which a completion cannot read.

    completions.py CAIRN OUT_DIR
"""
import pathlib
import shlex
import sys

import cli_help

cairn, out = sys.argv[1], pathlib.Path(sys.argv[2])
top = cli_help.parse(cli_help.help_text(cairn))
subcommands = {entry.names[0]: cli_help.parse(cli_help.help_text(cairn, entry.names[0])) for entry in top.subcommands}
# cairn's options that take a value (--db, --config, ...) are global: they may
# follow the subcommand too (fallthrough). Its flags, --help and --version, act alone.
top_flags = [option for option in top.options if option.kind() == "flag"]
global_options = [option for option in top.options if option.kind() != "flag"]
def names(options: list[cli_help.Entry]) -> str:
    """The options' names as one bash word: "'-h --help --json'"."""
    return shlex.quote(" ".join(name for option in options for name in option.names))


HEADER = "# {} completion for cairn, written from `cairn --help` and `cairn SUB --help`\n" \
         "# by scripts/completions.py when cairn is built. Edit that, not this.\n"


def bash_value(entry: cli_help.Entry) -> str:
    """The bash that completes entry's value into COMPREPLY."""
    kind = entry.kind()
    if kind == "file":
        return 'compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -f -- "$cur")'
    if kind == "dir":
        return 'compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -d -- "$cur")'
    if kind == "choice":
        return f'mapfile -t COMPREPLY < <(compgen -W {shlex.quote(" ".join(entry.choices()))} -- "$cur")'
    return "COMPREPLY=()"


def bash() -> str:
    # Each value that can be completed, as a case on "SUBCOMMAND:OPTION" (the
    # subcommand empty before there is one), grouped by what completes it.
    values: dict[str, list[str]] = {}
    for option in global_options:
        values.setdefault(bash_value(option), []).extend(f"*:{name}" for name in option.names)
    for sub, sub_help in subcommands.items():
        for option in sub_help.options:
            if option.kind() != "flag":
                values.setdefault(bash_value(option), []).extend(f"{sub}:{name}" for name in option.names)
    value_cases = "".join(f"    {'|'.join(patterns)})\n      {action}\n      return ;;\n"
                          for action, patterns in values.items())
    global_names = [name for option in global_options for name in option.names]
    option_cases = "".join(f"      {sub}) words={names(sub_help.options + global_options)} ;;\n"
                           for sub, sub_help in subcommands.items())
    option_cases += f"      *) words={names(top_flags + global_options)} ;;\n"
    # A positional argument: only a path can be completed (the agent of run and submit).
    paths: dict[str, list[str]] = {}
    for sub, sub_help in subcommands.items():
        if sub_help.positionals and sub_help.positionals[0].kind() in ("file", "dir"):
            paths.setdefault(bash_value(sub_help.positionals[0]), []).append(sub)
    positional_cases = "".join(f"      {'|'.join(subs)})\n        {action} ;;\n" for action, subs in paths.items())
    return HEADER.format("bash") + f"""
_cairn() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}} sub= words i
  # bash splits --option=value at the "=" (COMP_WORDBREAKS).
  if [[ $cur == = ]]; then
    cur=
  elif [[ $prev == = && $COMP_CWORD -ge 2 ]]; then
    prev=${{COMP_WORDS[COMP_CWORD-2]}}
  fi
  # The subcommand is the first word that is neither an option nor a global option's value.
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${{COMP_WORDS[i]}} in
      {'|'.join(global_names)})
        [[ ${{COMP_WORDS[i+1]}} == = ]] && ((i++))
        ((i++)) ;;
      -*) ;;
      *)
        sub=${{COMP_WORDS[i]}}
        break ;;
    esac
  done

  case $sub:$prev in
{value_cases}  esac

  if [[ $cur == -* ]]; then
    case $sub in
{option_cases}    esac
    mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
  elif [[ -z $sub ]]; then
    mapfile -t COMPREPLY < <(compgen -W {shlex.quote(' '.join(subcommands))} -- "$cur")
  else
    case $sub in
{positional_cases}    esac
  fi
}}

complete -F _cairn cairn
"""


def zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def zsh_spec(entry: cli_help.Entry) -> str:
    """entry as an _arguments spec: an option, or a positional argument."""
    kind = entry.kind()
    action = {"file": "_files", "dir": "_files -/", "choice": "(" + " ".join(entry.choices()) + ")"}.get(kind, " ")
    if not entry.names[0].startswith("-"):
        return zsh_quote(f"{'' if entry.required else ':'}:{entry.names[0]}:{action}")
    summary = entry.summary.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")
    # "--db=[...]:db:ACTION" takes --db X and --db=X.
    spec = f"[{summary}]" if kind == "flag" else f"=[{summary}]:{entry.names[0].lstrip('-')}:{action}"
    if len(entry.names) == 1:
        return zsh_quote(entry.names[0] + spec)
    # -h,--help: either name, not both.
    return zsh_quote(f"({' '.join(entry.names)})") + "{" + ",".join(entry.names) + "}" + zsh_quote(spec)


def zsh() -> str:
    def specs(entries: list[cli_help.Entry], indent: str) -> str:
        return "".join(f"{indent}{zsh_spec(entry)} \\\n" for entry in entries)

    described = "".join(f"        {zsh_quote(entry.names[0] + ':' + entry.summary)}\n" for entry in top.subcommands)
    cases = "".join(f"        {sub})\n          _arguments $global_options \\\n"
                    f"{specs(sub_help.options + sub_help.positionals, '            ')}            && ret=0 ;;\n"
                    for sub, sub_help in subcommands.items())
    return f"""#compdef cairn
{HEADER.format("zsh")}
_cairn() {{
  local curcontext=$curcontext state line ret=1
  typeset -A opt_args
  local -a global_options
  global_options=(
{''.join(f"    {zsh_spec(option)}{chr(10)}" for option in global_options)}  )
  _arguments -C $global_options \\
{specs(top_flags, '    ')}    ': :->subcommand' \\
    '*:: :->argument' && ret=0
  case $state in
    subcommand)
      local -a subcommands
      subcommands=(
{described}      )
      _describe -t subcommands 'cairn subcommand' subcommands && ret=0 ;;
    argument)
      curcontext=${{curcontext%:*:*}}:cairn-$line[1]:
      case $line[1] in
{cases}      esac ;;
  esac
  return ret
}}

_cairn "$@"
"""


out.mkdir(parents=True, exist_ok=True)
(out / "cairn").write_text(bash())
(out / "_cairn").write_text(zsh())
