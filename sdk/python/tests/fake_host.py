"""A fake cairn host for the SDK's tests: the real package runs a workflow
on one end of a socketpair in a thread, the test plays the host on the
other end, frame by frame."""

import json
import socket
import threading
from collections.abc import Callable
from typing import Any

import cairn

DEADLINE_S = 30.0  # generous: a loaded machine must pass


class FakeHost:
    def __init__(self, workflow: Callable[[cairn.Context, Any], Any]) -> None:
        self.sock, agent_end = socket.socketpair()
        self.sock.settimeout(DEADLINE_S)
        self.exit_code: int | None = None
        self._thread = threading.Thread(target=self._run, args=(agent_end, workflow), daemon=True)
        self._thread.start()

    def _run(self, agent_end: socket.socket, workflow: Callable[[cairn.Context, Any], Any]) -> None:
        self.exit_code = cairn.run(agent_end, workflow)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError(f"the agent closed the channel ({len(data)} of {n} bytes read)")
            data += chunk
        return data

    def read(self) -> dict[str, Any]:
        """The agent's next frame."""
        n = int.from_bytes(self._exactly(4), "big")
        return json.loads(self._exactly(n).decode("utf-8"))

    def send(self, message: dict[str, Any]) -> None:
        self.send_raw(json.dumps(message).encode("utf-8"))

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(len(payload).to_bytes(4, "big") + payload)

    def start(self, input: Any = None, history_steps: int = 0, attempt: int = 1, next_step_attempt: int = 1) -> None:
        hello = self.read()
        assert hello == {"t": "hello", "v": 2, "sdk": "cairn-py/0.1.0"}, hello
        self.send({"t": "start", "v": 2, "run_id": "run-test", "input": input, "attempt": attempt,
                   "history_steps": history_steps, "next_step_attempt": next_step_attempt})

    def ack_step(self) -> dict[str, Any]:
        """Reads a step attempt (begin, step) and acknowledges it."""
        begin = self.read()
        assert begin["t"] == "begin", begin
        step = self.read()
        assert step["t"] == "step" and step["seq"] == begin["seq"], step
        self.send({"t": "ack", "seq": step["seq"]})
        return step

    def result(self, request: dict[str, Any], kind: str, name: str, output: Any = None,
               error: dict[str, str] | None = None) -> None:
        record: dict[str, Any] = {"t": "result", "seq": request["seq"], "name": name, "kind": kind, "attempt": 1,
                                  "duration_us": 1}
        record |= {"status": "error", "error": error} if error else {"status": "ok", "output": output}
        self.send(record)

    def finish(self) -> int:
        """Waits for the agent to exit; its exit code."""
        self._thread.join(DEADLINE_S)
        assert not self._thread.is_alive(), "the agent did not exit in time"
        assert self.exit_code is not None
        self.sock.close()
        return self.exit_code

    def rest(self) -> bytes:
        """Everything the agent sends until it closes the channel."""
        data = b""
        while chunk := self.sock.recv(65536):
            data += chunk
        return data


def record(seq: int, name: str, output: Any = None, kind: str = "step", error: dict[str, str] | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"seq": seq, "name": name, "kind": kind, "attempt": 1, "duration_us": 5}
    r |= {"status": "error", "error": error} if error else {"status": "ok", "output": output}
    return r
