#!/usr/bin/env python3
"""The README's first agent, run as the README says, offline.

Takes the Python agent and the commands of "Running an agent" from README.md,
runs them in a scratch folder (a CAIRN_HOME of its own, the mock on a free
port rather than 8089, `cairn` and `./build/` this build's), and compares what
the README shows: the steps' names, kinds and outcomes, and the result.

usage: check_readme_agent.py SOURCE_DIR BUILD_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time


def block_after(text, marker, lang=""):
    """The first fenced block (```lang) after `marker`, and where it ends."""
    at = text.index(marker)
    start = text.index("```" + lang + "\n", at) + len("```" + lang + "\n")
    end = text.index("\n```", start)
    return text[start:end], end


def fail(message):
    print("check_readme_agent: " + message, file=sys.stderr)
    sys.exit(1)


def main():
    source, build = sys.argv[1], sys.argv[2]
    readme = open(os.path.join(source, "README.md"), encoding="utf-8").read()
    agent, _ = block_after(readme, "Python, `agent.py`", "python")
    commands, end = block_after(readme, "Offline, with the page served")
    shown, _ = block_after(readme[end + 4:], "")
    lines = [line for line in commands.splitlines() if line.strip()]
    if len(lines) != 4 or not lines[0].startswith("./build/examples/mock_llm/cairn-mock-llm --port 8089"):
        fail("README's offline commands changed shape; update this check:\n" + commands)

    scratch = tempfile.mkdtemp(prefix="cairn-readme-")
    os.chmod(scratch, 0o755)  # the sandbox uid reads the script agent's folder
    mock = None
    try:
        with open(os.path.join(scratch, "agent.py"), "w", encoding="utf-8") as f:
            f.write(agent + "\n")
        port_file = os.path.join(scratch, "port")
        mock_args = lines[0].rstrip(" &").split()
        mock_args[0] = os.path.join(build, "examples/mock_llm/cairn-mock-llm")
        mock_args[mock_args.index("--port") + 1] = "0"
        mock_args[mock_args.index("--pages") + 1] = os.path.join(source, "examples/mock_llm/pages")
        mock = subprocess.Popen(mock_args + ["--port-file", port_file], cwd=scratch)
        for _ in range(600):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            if mock.poll() is not None:
                fail("the mock exited with " + str(mock.returncode))
            time.sleep(0.05)
        port = open(port_file).read().strip()
        env = dict(os.environ, CAIRN_HOME=os.path.join(scratch, ".cairn"))
        for name in ("CAIRN_DB", "CAIRN_CRASH_POINT", "CAIRN_LLM_BASE_URL"):
            env.pop(name, None)
        cairn = os.path.join(build, "cli/cairn")
        out = ""
        for line in lines[1:]:
            line = line.replace("8089", port)
            if line.startswith("cairn "):
                line = cairn + line[len("cairn"):]
            result = subprocess.run(line, shell=True, cwd=scratch, env=env, capture_output=True, text=True,
                                    timeout=600)
            if result.returncode != 0:
                fail(f"`{line}` exited {result.returncode}:\n{result.stdout}{result.stderr}")
            out = result.stdout
        # The steps as the README shows them: seq, kind, name, outcome, attempt.
        step = re.compile(r"^\s*(\d+)\s+(\w+)\s+(\S+)\s+(ok|failed)\s+attempt (\d+)", re.M)
        want, got = step.findall(shown.replace("8089", port)), step.findall(out)
        if not want or want != got:
            fail(f"steps differ: the README shows {want}, the run printed {got}:\n{out}")
        # The result: the JSON after the last line that names the run's end.
        want_json = json.loads(shown[shown.index("\n{") + 1:].replace("8089", port))
        got_json = json.loads(out[out.index("\n{") + 1:])
        if want_json != got_json:
            fail(f"result differs: the README shows {want_json}, the run returned {got_json}")
        if not re.search(r"^run \S+ completed in [0-9.]+ s$", out, re.M):
            fail("no `run ... completed` line:\n" + out)
        print(f"README's first agent: {len(got)} steps and its result as shown")
    finally:
        if mock:
            mock.kill()
            mock.wait()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
