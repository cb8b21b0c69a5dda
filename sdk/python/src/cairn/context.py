"""The workflow's view of its run."""

import functools
import json
import random as _random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any, ParamSpec, TypeVar, overload

from ._messages import StepRecord
from ._record import FrozenRecord
from ._session import Session
from ._wire import (
    MAX_DURATION_MS,
    MAX_NAME_BYTES,
    MAX_OUTPUT_DEPTH,
    MAX_VALUE_DEPTH,
    check_name,
    encode_frame,
    json_text,
    wire_ms,
)
from .errors import CancelledError, ChildError, ChildFailed, StepFailed, TerminalError, ToolError
from .retry import Duration, Retry

P = ParamSpec("P")
T = TypeVar("T")
# Any JSON value: None, bool, int, float, str, list, dict with str keys.
Json = Any

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class ChildHandle(FrozenRecord):
    """A started child run, as returned by ctx.start_child."""

    __slots__ = ("run_id",)
    __match_args__ = ("run_id",)
    run_id: str

    def __init__(self, run_id: str) -> None:
        self._set("run_id", run_id)


# Longest error message sent, in characters: an exception may quote a whole
# response, and the step that reports it must still fit in a frame.
MAX_MESSAGE_CHARS = 64 * 1024


def clean_message(text: str) -> str:
    """`text` as an error message for the wire: valid Unicode (lone
    surrogates replaced), at most MAX_MESSAGE_CHARS characters."""
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + f"... ({len(text) - MAX_MESSAGE_CHARS} more characters)"
    return text.encode("utf-8", "replace").decode("utf-8")


def _error_type(e: BaseException) -> str:
    return clean_message(type(e).__name__)[: MAX_NAME_BYTES // 4]


class Context:
    """Every journaled call (step, tool, sleep, sleep_until, wait_signal,
    start_child, join, now, random, patched) raises CancelledError once the run is
    cancelled, also while it waits for a timer, signal or child. A cancel does
    not interrupt a running step or tool call: its outcome is journaled, the
    step makes no further attempt, and the next call raises. Not thread-safe:
    call it from the workflow's thread only."""

    def __init__(self, session: Session) -> None:
        self._s = session

    @contextmanager
    def _journaled(self) -> Iterator[None]:
        """Starts every journaled call: refuses one inside a step, raises
        CancelledError once the run is cancelled."""
        s = self._s
        if s.in_step:
            raise RuntimeError(
                "ctx.step, tool, sleep, sleep_until, wait_signal, start_child, join, now, random and patched "
                "cannot be called inside a step"
            )
        # A replayed call returns at once: it sees a cancel read with the
        # history but does not spend a read of the channel on each step.
        if not s.replaying:
            s.poll()
        if s.cancel_reason is not None:
            raise CancelledError(s.cancel_reason)
        s.in_step = True
        try:
            yield
        finally:
            s.in_step = False

    def _run(self, name: str, kind: str, fn: Callable[[], Any], retry: Retry) -> Any:
        check_name(name, "a step name")
        s = self._s
        with self._journaled():
            recorded = s.replay_next(name, kind)
            if recorded is not None:
                if recorded.ok:
                    return recorded.output
                raise StepFailed(recorded.name, recorded.error_type, recorded.error_message)
            seq = s.take_seq()
            attempt = s.first_attempt_for(seq)
            begin = {
                "t": "begin",
                "seq": seq,
                "name": name,
                "kind": kind,
                "attempt": attempt,
                "timeout_ms": 0 if retry.timeout is None else max(1, wire_ms(retry.timeout)),
                "max_attempts": min(retry.max_attempts, 1_000_000),
                "initial_delay_ms": wire_ms(retry.initial_delay),
                "multiplier": min(float(retry.multiplier), 1000.0),
                "max_delay_ms": wire_ms(retry.max_delay),
                "jitter": float(retry.jitter),
            }
            while True:
                s.send(encode_frame(begin))
                started = time.monotonic_ns()
                terminal = False
                error: Exception | None = None
                try:
                    output_text = json_text(fn(), f"the output of step '{name}'", MAX_OUTPUT_DEPTH)
                except TerminalError as e:
                    error, terminal = e, True
                except Exception as e:
                    error = e
                step = {
                    "t": "step",
                    "seq": seq,
                    "name": name,
                    "kind": kind,
                    "attempt": attempt,
                    "duration_us": (time.monotonic_ns() - started) // 1000,
                }
                if error is None:
                    step["status"] = "ok"
                    try:
                        frame = encode_frame(step, "output", output_text)
                    except ValueError as e:  # above the frame limit
                        error = ValueError(f"the output of step '{name}' is too large: {e}")
                if error is not None:
                    message, error_type = clean_message(str(error) or type(error).__name__), _error_type(error)
                    step |= {"status": "error", "error": {"message": message, "type": error_type}, "terminal": terminal}
                    frame = encode_frame(step)
                answer = s.report(frame, seq, error is None)
                if answer is None:
                    if error is not None:
                        raise StepFailed(name, error_type, message)
                    return json.loads(output_text)  # what replay returns: the journal's value
                attempt = begin["attempt"] = answer.attempt
                s.pause(answer.delay_ms / 1000)
                if s.cancel_reason is not None:
                    raise CancelledError(s.cancel_reason)

    def _host(self, name: str, kind: str, request: Callable[[int], bytes]) -> StepRecord:
        """An operation the host performs and journals (tool, sleep, wait,
        child, join): the journaled record on replay, else the host's answer."""
        s = self._s
        with self._journaled():
            recorded = s.replay_next(name, kind)
            if recorded is not None:
                return recorded
            seq = s.next_seq
            frame = request(seq)  # a value that is not JSON fails here, before the seq is taken
            s.take_seq()
            return s.request(frame, seq, kind, name)

    def step(self, name: str, fn: Callable[[], T], retry: Retry = Retry()) -> T:
        """Runs `fn` and journals what it returns (a JSON value); on replay
        returns the journaled value without calling `fn`. Live and on replay
        alike it returns the value as the journal holds it (after a JSON round
        trip: a tuple comes back as a list, dict keys as strings). Retries a
        raising `fn` as `retry` asks (a TerminalError is not retried), then
        raises StepFailed. A value that is not JSON fails the attempt like an
        exception would. No journaled ctx call may be made inside `fn`.
        `name` must be the same on every execution of the workflow: it is how
        replay checks that the code still matches the journal."""
        result: T = self._run(name, "step", fn, retry)
        return result

    @overload
    def durable(self, fn: Callable[P, T], /) -> Callable[P, T]: ...

    @overload
    def durable(
        self, *, name: str | None = None, retry: Retry = Retry()
    ) -> Callable[[Callable[P, T]], Callable[P, T]]: ...

    def durable(
        self, fn: Callable[..., Any] | None = None, *, name: str | None = None, retry: Retry = Retry()
    ) -> Any:
        """A function whose every call is a step, named after the function
        (or `name`):

            @ctx.durable
            def fetch(url): ...

            @ctx.durable(name="summarize", retry=cairn.Retry(max_attempts=5))
            def summary(text): ..."""

        def wrap(f: Callable[P, T]) -> Callable[P, T]:
            step_name = name or f.__name__

            @functools.wraps(f)
            def call(*args: P.args, **kwargs: P.kwargs) -> T:
                return self.step(step_name, lambda: f(*args, **kwargs), retry)

            return call

        return wrap if fn is None else wrap(fn)

    def tool(self, name: str, args: Json = None) -> Json:
        """Asks the host to call tool `name` (granted by the run's policy)
        with `args` (a JSON object; {} when None). The host checks the policy,
        runs the tool outside the sandbox and journals the result before
        returning it; on replay the journaled result is returned and the tool
        is not called again. Raises ToolError.

            page = ctx.tool("http.fetch", {"url": "https://example.com/"})"""
        check_name(name, "a tool name")
        args_text = json_text({} if args is None else args, f"the arguments of tool '{name}'", MAX_VALUE_DEPTH)
        r = self._host(name, "tool", lambda seq: encode_frame({"t": "tool", "seq": seq, "name": name}, "args", args_text))
        if r.ok:
            return r.output
        raise ToolError(r.name, r.error_type, r.error_message)

    def sleep(self, duration: Duration) -> None:
        """A durable timer: the host journals the sleep and wakes the run when
        it is due, even after a restart (it may suspend the run meanwhile). On
        replay a journaled sleep returns at once. Seconds or a timedelta; more
        than 100 years sleeps 100 years."""
        ms = wire_ms(duration)
        self._output_field(self._host("sleep", "sleep", lambda seq: encode_frame({"t": "sleep", "seq": seq, "duration_ms": ms})), "until_ms")

    def sleep_until(self, when: datetime) -> None:
        """Like sleep(), until `when` (a timezone-aware datetime; a past time
        is due at once, one more than 100 years ahead is 100 years ahead)."""
        if when.tzinfo is None:
            raise ValueError("ctx.sleep_until needs a timezone-aware datetime (e.g. datetime.now(timezone.utc) + ...)")
        ms = (when - _EPOCH) // timedelta(milliseconds=1)
        latest = time.time_ns() // 1_000_000 + MAX_DURATION_MS
        until = max(0, min(ms, latest))
        self._output_field(self._host("sleep", "sleep", lambda seq: encode_frame({"t": "sleep", "seq": seq, "until_ms": until})), "until_ms")

    def wait_signal(self, name: str, timeout: Duration | None = None) -> Json:
        """Waits until the signal `name` is sent to the run and returns its
        payload, or None when `timeout` (seconds or a timedelta) passed first;
        a signal sent without a payload also gives None. None or 100 years
        and more: no timeout. Journaled: on replay the same outcome is
        returned at once."""
        check_name(name, "a signal name")
        wait: dict[str, Any] = {"t": "wait", "seq": 0, "signal": name}
        if timeout is not None and wire_ms(timeout) < MAX_DURATION_MS:
            wait["timeout_ms"] = wire_ms(timeout)
        r = self._host(name, "signal", lambda seq: encode_frame(wait | {"seq": seq}))
        if self._output_field(r, "timed_out") is True:
            return None
        return self._output_field(r, "payload")

    def start_child(self, agent: str, input: Json = None) -> ChildHandle:
        """Starts a run of agent `agent` with `input` ({} when None) as a
        child of this run and returns without waiting for it. Raises
        ChildError when the host refuses. Journaled: on replay the same child
        is returned, not started again."""
        check_name(agent, "an agent name")
        input_text = json_text({} if input is None else input, f"the input of child agent '{agent}'", MAX_VALUE_DEPTH)
        r = self._host(agent, "child", lambda seq: encode_frame({"t": "child", "seq": seq, "agent": agent}, "input", input_text))
        if not r.ok:
            raise ChildError(agent, r.error_type, r.error_message)
        run_id = self._output_field(r, "run_id")
        if not isinstance(run_id, str):
            raise self._s.fail(f"the host's child result for seq {r.seq} has a run_id that is not a string")
        return ChildHandle(run_id)

    def join(self, child: ChildHandle) -> Json:
        """Waits for the child run to end and returns its output; raises
        ChildFailed when it failed or was cancelled. Journaled: on replay the
        recorded output or error is returned at once."""
        r = self._host(child.run_id, "join", lambda seq: encode_frame({"t": "join", "seq": seq, "run_id": child.run_id}))
        if r.ok:
            return r.output
        raise ChildFailed(child.run_id, r.error_type, r.error_message)

    @property
    def cancelled(self) -> bool:
        """True once the host has cancelled the run. Checks the channel
        without blocking, so a long computation can poll it and stop early."""
        self._s.poll()
        return self._s.cancel_reason is not None

    def now(self) -> datetime:
        """The wall clock (UTC), journaled: replay sees the time of the first
        execution. Journaled as "ctx.now", an integer of ms since the epoch."""
        ms = self._run("ctx.now", "now", lambda: time.time_ns() // 1_000_000, Retry.no_retry())
        if not isinstance(ms, int) or isinstance(ms, bool):
            raise ValueError(f"the journal's ctx.now is {ms!r}, not an integer of milliseconds")
        return _EPOCH + timedelta(milliseconds=ms)

    def random(self) -> float:
        """A uniform number in [0, 1), journaled as "ctx.random"."""
        x = self._run("ctx.random", "random", _random.random, Retry.no_retry())
        if not isinstance(x, int | float) or isinstance(x, bool):
            raise ValueError(f"the journal's ctx.random is {x!r}, not a number")
        return float(x)

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the branch of patch `patch_id` (Temporal's
        `patched`):

            if ctx.patched("fix-rounding"):
                ...  # new code
            else:
                ...  # old code

        True in a run that reaches this point with this code (a marker is
        journaled, so its replays take the same branch), False in a run whose
        journal was written by code that passed this point without it. Remove
        the call only when no run that recorded it can replay again."""
        check_name(patch_id, "a patch id")
        s = self._s
        with self._journaled():
            replayed = s.replay_patch(patch_id)
            if replayed is not None:
                return replayed
            seq = s.take_seq()
            step = {"t": "step", "seq": seq, "name": patch_id, "kind": "patch", "status": "ok", "output": True,
                    "attempt": s.first_attempt_for(seq)}
            s.report(encode_frame(step), seq, True)  # an ok step is acknowledged, never retried
            return True

    def emit(self, data: Json) -> None:
        """A live, non-durable event for whoever watches the run (progress,
        tokens); dropped while replaying."""
        self._s.emit(json_text(data, "the data of ctx.emit", MAX_VALUE_DEPTH))

    @property
    def run_id(self) -> str:
        return self._s.start.run_id

    @property
    def attempt(self) -> int:
        """The run's attempt, 1-based: each start of its sandbox counts, so 2
        and up after the sandbox crashed, a step timed out, or the run woke
        from a suspension and was resumed from its journal."""
        return self._s.start.attempt

    @property
    def replaying(self) -> bool:
        """True while the workflow is fast-forwarded through journaled steps."""
        return self._s.replaying

    def _output_field(self, r: StepRecord, field: str) -> Json:
        """A field of a host-recorded output the SDK interprets; its absence means a broken host."""
        if r.ok and isinstance(r.output, dict) and field in r.output:
            return r.output[field]
        raise self._s.fail(f"the host's {r.kind} result for seq {r.seq} has no output field '{field}'")
