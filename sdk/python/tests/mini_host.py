"""A small in-memory host that runs an agent program as a real process, for
the tests of tests/conformance/agents/conformance_agent.py outside a sandbox:
it journals steps, decides retries (no jitter), answers tools (with
`tools`, else refused),
sleeps, signals (given up front), children (run to their end at once) and
joins, and starts the agent again, replaying, after it crashes."""

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
SDK_SRC = ROOT / "sdk" / "python" / "src"
MAX_ATTEMPTS = 3  # sandboxes per run, as the engine's default
POLICY_STEP_ATTEMPTS = 10
CHUNK_BYTES = 1 << 20


class MiniHost:
    def __init__(self, program: Path, input: Any, effects_log: Path, signals: dict[str, Any] | None = None,
                 cancel_after_acks: int | None = None,
                 tools: Callable[[str, Any], tuple[bool, Any]] | None = None, cwd: Path | None = None) -> None:
        self.program, self.input, self.effects_log = program, input, effects_log
        self.tools, self.cwd = tools, cwd
        self.signals = signals or {}
        self.cancel_after_acks = cancel_after_acks
        self.journal: list[dict[str, Any]] = []
        self.retries: dict[int, int] = {}
        self.children: dict[str, tuple[str, Any]] = {}
        self.emitted: list[Any] = []
        self.exit_codes: list[int] = []
        self.outcome: tuple[str, Any] = ("crash", None)

    def run(self) -> tuple[str, Any]:
        """("done", output) or ("fail", error) or ("crash", None)."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            if self._attempt(attempt):
                break
        return self.outcome

    def _attempt(self, attempt: int) -> bool:
        host, agent = socket.socketpair()
        env = dict(os.environ, CAIRN_CHANNEL_FD="3", CAIRN_RUN_ID="run-mini", PYTHONPATH=str(SDK_SRC),
                   CONFORMANCE_EFFECTS_LOG=str(self.effects_log))
        # The agent's end becomes fd 3 of the child (dup2 leaves it inheritable; the
        # host's end, like every descriptor Python opens, closes at exec).
        proc = subprocess.Popen([str(self.program)], env=env, close_fds=False, cwd=self.cwd,
                                preexec_fn=lambda: os.dup2(agent.fileno(), 3))
        agent.close()
        self.reader = _Reader(host)
        try:
            ended = self._session(host, attempt)
        finally:
            host.close()
            self.exit_codes.append(proc.wait(60))
        return ended

    def _send(self, sock: socket.socket, m: dict[str, Any]) -> None:
        payload = json.dumps(m).encode()
        sock.sendall(len(payload).to_bytes(4, "big") + payload)

    def _record(self, seq: int, name: str, kind: str, ok: bool, value: Any) -> dict[str, Any]:
        r = {"seq": seq, "name": name, "kind": kind, "attempt": 1, "duration_us": 1}
        r |= {"status": "ok", "output": value} if ok else {"status": "error", "error": value}
        return r

    def _session(self, sock: socket.socket, attempt: int) -> bool:
        if self.reader.next() is None:
            return False
        n = len(self.journal)
        self._send(sock, {"t": "start", "v": 2, "run_id": "run-mini", "input": self.input, "attempt": attempt,
                          "history_steps": n, "next_step_attempt": 1 + self.retries.get(n, 0)})
        begun: dict[str, Any] = {}
        acks = 0
        while (m := self.reader.next()) is not None:
            t = m["t"]
            if t == "history":
                steps, size, i = [], 0, m["from"]
                while i < n and (not steps or size < CHUNK_BYTES):
                    steps.append(self.journal[i])
                    size += len(json.dumps(self.journal[i]))
                    i += 1
                self._send(sock, {"t": "history", "from": m["from"], "steps": steps})
            elif t == "begin":
                begun = m
            elif t == "step":
                seq = m["seq"]
                failed = 1 + self.retries.get(seq, 0)
                if (m["status"] == "error" and not m.get("terminal") and begun.get("seq") == seq
                        and failed < min(begun.get("max_attempts", 1), POLICY_STEP_ATTEMPTS)):
                    self.retries[seq] = failed
                    delay = min(begun["initial_delay_ms"] * begun["multiplier"] ** (failed - 1), begun["max_delay_ms"])
                    self._send(sock, {"t": "retry", "seq": seq, "attempt": failed + 1, "delay_ms": int(delay)})
                    continue
                ok = m["status"] == "ok"
                self.journal.append(self._record(seq, m["name"], m["kind"], ok, m["output"] if ok else m["error"]))
                self._send(sock, {"t": "ack", "seq": seq})
                acks += 1
                if acks == self.cancel_after_acks:
                    self._send(sock, {"t": "cancel", "reason": "cancelled by the test"})
            elif t in ("tool", "sleep", "wait", "child", "join"):
                self.journal.append(self._perform(m))
                self._send(sock, {"t": "result", **self.journal[-1]})
            elif t == "emit":
                self.emitted.append(m["data"])
            elif t in ("done", "fail"):
                self.outcome = (t, m.get("output", m.get("error")))
                return True
        return False

    def _perform(self, m: dict[str, Any]) -> dict[str, Any]:
        seq, t = m["seq"], m["t"]
        if t == "tool":
            ok, value = self.tools(m["name"], m["args"]) if self.tools else (False, None)
            return self._record(seq, m["name"], "tool", ok, value if ok or value else {"message": "not granted",
                                                                                     "type": "refused"})
        if t == "sleep":
            due = time.time() * 1000 + m["duration_ms"]
            time.sleep(m["duration_ms"] / 1000)
            return self._record(seq, "sleep", "sleep", True, {"until_ms": int(due), "fired_at_ms": int(time.time() * 1000)})
        if t == "wait":
            name = m["signal"]
            if name in self.signals:
                return self._record(seq, name, "signal", True, {"signal": name, "timed_out": False,
                                                               "payload": self.signals[name]})
            time.sleep(m["timeout_ms"] / 1000)
            return self._record(seq, name, "signal", True, {"signal": name, "timed_out": True})
        if t == "child":
            run_id = f"run-child-{seq}"
            child = MiniHost(self.program, m["input"], self.effects_log)
            self.children[run_id] = child.run()
            return self._record(seq, m["agent"], "child", True, {"run_id": run_id})
        status, value = self.children[m["run_id"]]
        if status == "done":
            return self._record(seq, m["run_id"], "join", True, value)
        return self._record(seq, m["run_id"], "join", False, {"message": value["message"], "type": "child_failed"})


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""
        sock.settimeout(60)

    def next(self) -> dict[str, Any] | None:
        """The agent's next frame, or None when it closed the channel."""
        while True:
            if len(self.buffer) >= 4:
                n = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) >= 4 + n:
                    payload, self.buffer = self.buffer[4 : 4 + n], self.buffer[4 + n :]
                    return json.loads(payload)  # type: ignore[no-any-return]
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return None
            self.buffer += chunk
