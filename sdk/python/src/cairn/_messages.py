"""Host -> agent messages of protocol v2 as typed values, parsed as strictly as
the C++ SDK parses them (protocol/messages.cpp): every field's presence, type
and range is checked, and the first wrong one is named. Fields not known are
ignored, so later minor additions stay compatible."""

from typing import Any, NoReturn

from ._record import Record
from ._wire import MAX_DURATION_MS, MAX_NAME_BYTES, HostGone

VERSION = 2
MAX_SEQ = 2**63 - 1
MAX_ATTEMPT = 1_000_000
KINDS = frozenset({"step", "now", "random", "patch", "tool", "sleep", "signal", "child", "join"})
HOST_RECORDED = frozenset({"tool", "sleep", "signal", "child", "join"})


class StepRecord(Record):
    """A journaled outcome: a history entry, or the result of a request."""

    __slots__ = ("seq", "name", "kind", "ok", "output", "error_message", "error_type", "attempt")

    def __init__(self, seq: int, name: str, kind: str, ok: bool, output: Any, error_message: str, error_type: str,
                 attempt: int) -> None:
        self.seq = seq
        self.name = name
        self.kind = kind
        self.ok = ok
        self.output = output  # when ok
        self.error_message = error_message  # when not ok
        self.error_type = error_type
        self.attempt = attempt


class Start(Record):
    __slots__ = ("version", "run_id", "input", "attempt", "history_steps", "next_step_attempt")

    def __init__(self, version: int, run_id: str, input: Any, attempt: int, history_steps: int,
                 next_step_attempt: int) -> None:
        self.version = version
        self.run_id = run_id
        self.input = input
        self.attempt = attempt
        self.history_steps = history_steps
        self.next_step_attempt = next_step_attempt


class History(Record):
    __slots__ = ("start", "steps")

    def __init__(self, start: int, steps: list[StepRecord]) -> None:
        self.start = start  # the chunk's `from`
        self.steps = steps


class Ack(Record):
    __slots__ = ("seq", "alone")

    def __init__(self, seq: int, alone: bool = False) -> None:
        self.seq = seq
        self.alone = alone  # the host executes no other attempt (PROTOCOL.md §3.3)


class RetryAnswer(Record):
    __slots__ = ("seq", "attempt", "delay_ms")

    def __init__(self, seq: int, attempt: int, delay_ms: int) -> None:
        self.seq = seq
        self.attempt = attempt
        self.delay_ms = delay_ms


class Result(Record):
    __slots__ = ("record",)

    def __init__(self, record: StepRecord) -> None:
        self.record = record


class Cancel(Record):
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Reject(Record):
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


HostMessage = Start | History | Ack | RetryAnswer | Result | Cancel | Reject


def _bad(t: str, field: str, why: str) -> NoReturn:
    raise HostGone(f"the host sent a malformed frame: '{t}' message: field '{field}' {why}")


def _require(m: dict[str, Any], t: str, field: str) -> Any:
    if field not in m:
        _bad(t, field, "is missing")
    return m[field]


def _string(m: dict[str, Any], t: str, field: str, max_bytes: int | None = None) -> str:
    v = _require(m, t, field)
    if not isinstance(v, str):
        _bad(t, field, "must be a string")
    if max_bytes is not None and len(v) * 4 > max_bytes and len(v.encode("utf-8")) > max_bytes:
        _bad(t, field, f"is longer than {max_bytes} bytes")
    return v


def _int(m: dict[str, Any], t: str, field: str, low: int, high: int) -> int:
    v = _require(m, t, field)
    if not isinstance(v, int) or isinstance(v, bool):
        _bad(t, field, "must be an integer")
    if not low <= v <= high:
        _bad(t, field, "is out of range")
    return v


def _optional_bool(m: dict[str, Any], t: str, field: str) -> bool:
    v = m.get(field, False)
    if not isinstance(v, bool):
        _bad(t, field, "must be true or false")
    return v


def _name(m: dict[str, Any], t: str, field: str = "name") -> str:
    name = _string(m, t, field, MAX_NAME_BYTES)
    if not name:
        _bad(t, field, "must not be empty")
    return name


def step_record(m: dict[str, Any], t: str) -> StepRecord:
    seq = _int(m, t, "seq", 0, MAX_SEQ)
    name = _name(m, t)
    kind = _string(m, t, "kind")
    if kind not in KINDS:
        _bad(t, "kind", f"must be one of step, now, random, patch, tool, sleep, signal, child, join (got {kind[:64]!r})")
    status = _string(m, t, "status")
    output: Any = None
    message, error_type = "", "error"
    if status == "ok":
        output = _require(m, t, "output")
    elif status == "error":
        error = _require(m, t, "error")
        if not isinstance(error, dict):
            _bad(t, "error", "must be an object with 'message' and 'type'")
        message = _string(error, t, "message")
        if "type" in error:
            error_type = _string(error, t, "type", MAX_NAME_BYTES)
    else:
        _bad(t, "status", f'must be "ok" or "error" (got {status[:64]!r})')
    attempt = _int(m, t, "attempt", 1, MAX_ATTEMPT)
    if "duration_us" in m:
        _int(m, t, "duration_us", 0, MAX_SEQ)
    return StepRecord(seq, name, kind, status == "ok", output, message, error_type, attempt)


def parse_host_message(m: dict[str, Any]) -> HostMessage:
    t = m.get("t")
    if not isinstance(t, str):
        raise HostGone("the host sent a malformed frame: message has no string field 't' (its type)")
    if t == "ack":
        return Ack(_int(m, t, "seq", 0, MAX_SEQ), _optional_bool(m, t, "alone"))
    if t == "retry":
        return RetryAnswer(
            _int(m, t, "seq", 0, MAX_SEQ), _int(m, t, "attempt", 1, MAX_ATTEMPT), _int(m, t, "delay_ms", 0, MAX_DURATION_MS)
        )
    if t == "result":
        record = step_record(m, t)
        if record.kind not in HOST_RECORDED:
            _bad(t, "kind", "must be one of tool, sleep, signal, child, join")
        return Result(record)
    if t == "history":
        start = _int(m, t, "from", 0, MAX_SEQ)
        entries = _require(m, t, "steps")
        if not isinstance(entries, list) or not entries:
            _bad(t, "steps", "must be a non-empty array")
        steps = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                _bad(t, "steps", "must hold step records (objects)")
            record = step_record(entry, t)
            if record.seq != start + i:
                _bad(t, "steps", "must hold the steps from 'from' on, in order")
            steps.append(record)
        return History(start, steps)
    if t == "start":
        return Start(
            _int(m, t, "v", 0, 2**31 - 1),
            _string(m, t, "run_id"),
            _require(m, t, "input"),
            _int(m, t, "attempt", 1, MAX_ATTEMPT),
            _int(m, t, "history_steps", 0, MAX_SEQ),
            _int(m, t, "next_step_attempt", 1, MAX_ATTEMPT),
        )
    if t == "cancel":
        return Cancel(_string(m, t, "reason"))
    if t == "reject":
        return Reject(_string(m, t, "error"))
    raise HostGone(f"the host sent a malformed frame: unknown message type {t[:64]!r}")
