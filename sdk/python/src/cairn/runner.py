"""Runs a workflow as a cairn agent and ends it as protocol/PROTOCOL.md §2.1
says: `done` or `fail`, then close. Exit codes: 0 after done, 1 after fail,
2 when not started by cairn or the host refused the session before `start`,
3 when the host broke the protocol or went away after it."""

import os
import socket
import stat
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from ._session import Session
from ._wire import MAX_OUTPUT_DEPTH, HostGone, encode_frame, json_text
from .context import Context, clean_message
from .errors import CancelledError, ChildFailed, NondeterminismError, StepFailed

Workflow = Callable[[Context, Any], Any]


def _fail_frame(message: str, type: str) -> bytes:
    return encode_frame({"t": "fail", "error": {"message": clean_message(message), "type": type}})


def _outcome(s: Session, workflow: Workflow) -> tuple[bytes, str | None]:
    """Runs the workflow: the frame that ends the run, and the failure's
    message if it failed."""
    failed: tuple[str, str] | None = None
    output: Any = None
    try:
        output = workflow(Context(s), s.start.input)
    except NondeterminismError as e:
        failed = (str(e), "nondeterminism")
    except (StepFailed, ChildFailed) as e:
        failed = (str(e), e.type)
    except HostGone:
        raise
    except BaseException as e:
        if not isinstance(e, CancelledError):
            import traceback  # here, not at the top: a start of every agent would pay for it

            traceback.print_exc()
        failed = (f"{type(e).__name__}: {e}", "error")
    s.check()  # a workflow that swallowed HostGone still stops
    # A workflow that swallowed a non-determinism error still fails.
    if failed is None and s.nondeterminism is not None:
        failed = (s.nondeterminism, "nondeterminism")
    # A cancelled run ends as cancelled however the workflow ended, even if a
    # cancel arrived only after its last ctx call.
    s.poll()
    if s.cancel_reason is not None:
        failed = (s.cancel_reason, "cancelled")
    if failed is None:
        try:
            return encode_frame({"t": "done"}, "output", json_text(output, "the workflow's output", MAX_OUTPUT_DEPTH)), None
        except (TypeError, ValueError) as e:
            failed = (str(e), "error")
    return _fail_frame(*failed), failed[0]


def run(channel: socket.socket, workflow: Workflow) -> int:
    """Runs `workflow` as a cairn agent on `channel` (taking ownership of it)
    and returns the process exit code."""
    with channel:
        try:
            s = Session(channel)
        except HostGone as e:
            print(f"cairn agent: {e}", file=sys.stderr)
            return 2
        try:
            frame, failure = _outcome(s, workflow)
            s.send(frame)
            s.close()
        except HostGone as e:
            # The run's fate is the host's to decide from its journal: just stop.
            print(f"cairn agent: {e}", file=sys.stderr)
            return 3
    if failure is not None:
        print(f"cairn agent: run failed: {failure}", file=sys.stderr)
        return 1
    return 0


def main(workflow: Workflow) -> NoReturn:
    """Runs `workflow(ctx, input)` as a cairn agent on the channel the host
    gave it (CAIRN_CHANNEL_FD) and exits with run()'s exit code."""
    env = os.environ.get("CAIRN_CHANNEL_FD")
    try:
        fd = int(env) if env is not None else -1
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError
    except (ValueError, OSError):
        print("This is a cairn agent; start it with `cairn run PROGRAM --input JSON`.", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(socket.socket(fileno=fd), workflow))
