"""The frame codec and the JSON rules of protocol/PROTOCOL.md §1: a 4-byte
big-endian payload length, then that many bytes of one UTF-8 JSON object."""

import json
import math
import sys
from typing import Any

from .retry import Duration, seconds_of

MAX_FRAME = 16 << 20  # 16 MiB, the host's and every SDK's limit
MAX_DEPTH = 128  # deepest nesting of arrays/objects in a frame
# Where the host places a step's or a run's output (three levels down in a
# history chunk) and anything else the agent sends (one level down in its
# frame): PROTOCOL.md §1.
MAX_OUTPUT_DEPTH = MAX_DEPTH - 3
MAX_VALUE_DEPTH = MAX_DEPTH - 1
MAX_DURATION_MS = 100 * 365 * 24 * 3600 * 1000  # 100 years, the longest wire duration
MAX_NAME_BYTES = 1024


class HostGone(BaseException):
    """The host went away or broke the protocol; the agent can only stop.
    A BaseException so that a workflow's `except Exception` cannot swallow it."""


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"the number {text[:32]} is outside the range of a double")
    return x


def _bounded_int(text: str) -> int:
    n = int(text)
    if abs(n) > sys.float_info.max:
        raise ValueError(f"the number {text[:32]}... is outside the range of a double")
    return n


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_decoder = json.JSONDecoder(parse_float=_finite_float, parse_int=_bounded_int, parse_constant=_no_constant)
# The encoding PROTOCOL.md §1 asks of a Python agent; built once, as json.dumps
# builds an encoder per call when given options.
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def depth_of(value: Any, limit: int) -> int:
    """How deep `value` nests, counted up to limit + 1, without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list | tuple):
            continue
        d += 1
        if d > deepest:
            deepest = d
            if deepest > limit:
                return deepest
        stack.extend((item, d) for item in v if isinstance(item, dict | list | tuple))
    return deepest


def _too_deep(text: str, value: Any, limit: int) -> bool:
    # Counting brackets is fast and bounds the depth from above; only a text
    # with more of them than the limit needs the walk.
    return text.count("[") + text.count("{") > limit and depth_of(value, limit) > limit


def decode_payload(payload: bytes) -> dict[str, Any]:
    """One frame's payload as a JSON object; HostGone when it breaks §1."""
    try:
        text = payload.decode("utf-8")
        value = _decoder.decode(text)
    except RecursionError:
        raise HostGone(f"the host sent a frame nesting deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise HostGone(f"the host sent a frame that is not valid JSON in UTF-8: {e}") from None
    if not isinstance(value, dict):
        raise HostGone("the host sent a frame that is JSON but not an object")
    if _too_deep(text, value, MAX_DEPTH):
        raise HostGone(f"the host sent a frame nesting deeper than {MAX_DEPTH} levels")
    # json accepts escaped lone surrogates (\ud800), which are not UTF-8.
    if "\\u" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise HostGone("the host sent a frame with an unpaired surrogate escape") from None
    return value


def json_text(value: Any, what: str, max_depth: int) -> str:
    """`value` as compact JSON text, or ValueError/TypeError naming `what` when
    it is not JSON the host accepts (NaN, a non-JSON type, a lone surrogate,
    nesting deeper than max_depth)."""
    try:
        text = _encode(value)
        text.encode("utf-8")
    except RecursionError:
        raise ValueError(f"{what} nests deeper than {max_depth} levels") from None
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} holds a string that is not valid Unicode ({e.reason})") from None
    except (TypeError, ValueError) as e:
        raise type(e)(f"{what} is not JSON: {e}") from None
    if _too_deep(text, value, max_depth):
        raise ValueError(f"{what} nests deeper than {max_depth} levels")
    return text


def encode_frame(message: dict[str, Any], raw_field: str | None = None, raw_text: str = "") -> bytes:
    """One frame carrying `message`, plus `raw_field` set to the JSON text
    `raw_text` (a value json_text() already checked, not encoded twice).
    ValueError when the frame would exceed MAX_FRAME."""
    text = _encode(message)
    if raw_field is not None:
        text = f'{text[:-1]},"{raw_field}":{raw_text}}}'
    payload = text.encode("utf-8")
    if len(payload) > MAX_FRAME:
        raise ValueError(f"a message of {len(payload)} bytes exceeds the frame limit of {MAX_FRAME} bytes")
    return len(payload).to_bytes(4, "big") + payload


class FrameDecoder:
    """Reassembles frames from a byte stream fed in arbitrary pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | memoryview) -> None:
        """Appends bytes; HostGone as soon as a header announces a length of
        zero or above MAX_FRAME, before its payload is buffered."""
        self._buffer += data
        self._length()

    def _length(self) -> int | None:
        if len(self._buffer) < 4:
            return None
        n = int.from_bytes(self._buffer[:4], "big")
        if n == 0:
            raise HostGone("the host sent a frame with a zero length prefix")
        if n > MAX_FRAME:
            raise HostGone(f"the host sent a frame length prefix of {n} bytes, above the limit of {MAX_FRAME}")
        return n

    def next(self) -> dict[str, Any] | None:
        """The next complete message, or None when more bytes are needed.
        A bad header after it is reported by the next call, so this message
        is not lost."""
        n = self._length()
        if n is None or len(self._buffer) < 4 + n:
            return None
        payload = bytes(self._buffer[4 : 4 + n])
        del self._buffer[: 4 + n]
        return decode_payload(payload)


def wire_ms(d: Duration) -> int:
    """A duration for the wire, in ms: never negative, at most 100 years."""
    ms = seconds_of(d) * 1000
    if not ms > 0:
        return 0
    return min(round(ms), MAX_DURATION_MS)


def check_name(name: str, what: str) -> None:
    """ValueError unless `name` is 1 to 1024 bytes of UTF-8 (§3.1)."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str (got {type(name).__name__})")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{what} {name!r} is not valid Unicode") from None
    if not 1 <= size <= MAX_NAME_BYTES:
        raise ValueError(f"{what} must be 1 to {MAX_NAME_BYTES} bytes of UTF-8 (got {size})")
