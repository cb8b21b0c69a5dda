"""The agent's side of one run: the channel, the position in the history,
and the chunk of it being replayed (pulled from the host as replay reaches
its end, so memory stays bounded whatever the history's size)."""

import os
import select
import socket
import time

from ._messages import (
    VERSION,
    Ack,
    Cancel,
    History,
    HostMessage,
    Reject,
    Result,
    RetryAnswer,
    Start,
    StepRecord,
    parse_host_message,
)
from ._version import __version__
from ._wire import FrameDecoder, HostGone, encode_frame
from .errors import CancelledError, NondeterminismError

SDK_NAME = f"cairn-py/{__version__}"
_FULL_SPIN_NS = 1_000_000  # how long _receive() polls before it blocks, at most
# Whether this process may run on more than one CPU: on one, polling only
# delays the answer it waits for.
_MAY_POLL = not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) > 1
_FIRST_PROBE, _LAST_PROBE = 64, 4096  # receives between tries of the full length


class Session:
    """Owns `sock`. The constructor blocks for the handshake and raises
    HostGone if the host rejects the agent or the channel breaks. Once
    HostGone was raised, every further use raises it again: a workflow that
    caught it cannot talk to a broken host."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        sock.setblocking(True)
        self._poller = select.poll()
        self._poller.register(sock.fileno(), select.POLLIN)
        self._buffer = bytearray(1 << 20)
        self._decoder = FrameDecoder()
        self._gone: HostGone | None = None
        self._chunk: History | None = None
        self.next_seq = 0
        self.cancel_reason: str | None = None
        self.nondeterminism: str | None = None
        self.in_step = False
        self._spin_ns = _FULL_SPIN_NS
        self._probe_every = _FIRST_PROBE
        self._until_probe = _FIRST_PROBE
        # Whether the host's last ack said it executes no other attempt.
        self._host_alone = False
        self.send(encode_frame({"t": "hello", "v": VERSION, "sdk": SDK_NAME}))
        reply = self._receive(stop_on_cancel=False)
        if isinstance(reply, Reject):
            raise self.fail(f"the host rejected this agent: {reply.error}")
        if not isinstance(reply, Start):
            raise self.fail("the host did not answer hello with start")
        if reply.version != VERSION:
            raise self.fail(f"the host speaks protocol v{reply.version}; this SDK ({SDK_NAME}) speaks v{VERSION}")
        self.start = reply

    @property
    def replaying(self) -> bool:
        return self.next_seq < self.start.history_steps

    def first_attempt_for(self, seq: int) -> int:
        return self.start.next_step_attempt if seq == self.start.history_steps else 1

    def fail(self, why: str) -> HostGone:
        """Marks the host gone (`why`); returns the HostGone to raise."""
        self._gone = HostGone(why)
        return self._gone

    def check(self) -> None:
        """Raises the HostGone seen earlier, if any."""
        if self._gone is not None:
            raise self._gone

    def send(self, frame: bytes) -> None:
        self.check()
        try:
            self._sock.sendall(frame)
        except OSError as e:
            raise self.fail(f"lost the channel to the host: {e.strerror or e}") from None

    def close(self) -> None:
        """After done/fail: tells the host at once that nothing more will come."""
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            raise self.fail(f"lost the channel to the host: {e.strerror or e}") from None

    def _read(self, wait_s: float | None) -> bool:
        """One read into the decoder, waiting at most `wait_s` (None: no
        limit). False when nothing arrived."""
        self.check()
        try:
            if wait_s is None:
                n = self._sock.recv_into(self._buffer)
            else:
                # poll(2) takes at most 2^31-1 ms; a longer wait (a retry
                # delay may be 100 years) is resumed by the caller's loop.
                if wait_s > 0 and not self._poller.poll(min(max(1, round(wait_s * 1000)), 2**31 - 1)):
                    return False
                n = self._sock.recv_into(self._buffer, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as e:
            raise self.fail(f"lost the channel to the host: {e.strerror or e}") from None
        if n == 0:
            raise self.fail("the host closed the channel")
        try:
            self._decoder.feed(memoryview(self._buffer)[:n])
        except HostGone as e:
            raise self.fail(str(e)) from None
        return True

    def _next_buffered(self) -> HostMessage | None:
        """Decodes buffered frames up to the first one that is not cancel."""
        try:
            while (frame := self._decoder.next()) is not None:
                m = parse_host_message(frame)
                if not isinstance(m, Cancel):
                    return m
                if self.cancel_reason is None:
                    self.cancel_reason = m.reason
        except HostGone as e:
            raise self.fail(str(e)) from None
        return None

    def _receive(self, stop_on_cancel: bool) -> HostMessage:
        """The next host message other than cancel. With `stop_on_cancel`,
        raises CancelledError instead of blocking once the host cancelled."""
        # As the C++ SDK does (sdk/session.cpp): the host's ack follows its
        # commit within about a millisecond, and polling that long before
        # blocking saves a scheduler wake-up, hundreds of us on a VM. Where
        # answers come later (a busy machine), each poll that ends
        # empty-handed halves the next one, down to none; after 64 receives
        # one tries the full length again, and after twice as many each time
        # that try fails (up to 4,096). A host whose last ack said it
        # executes no other attempt (ack.alone): every receive polls the full
        # length.
        probing = False
        if not self._host_alone:
            self._until_probe -= 1
            probing = self._until_probe <= 0
        if probing:
            self._until_probe = self._probe_every
        if probing or self._host_alone:
            self._spin_ns = _FULL_SPIN_NS
        if not _MAY_POLL:
            self._spin_ns = 0  # on one CPU polling only delays the answer
        started = time.monotonic_ns()
        waited = False
        while True:
            m = self._next_buffered()
            if m is not None:
                if waited:
                    self._spin_ns //= 2
                    if probing:
                        self._probe_every = min(self._probe_every * 2, _LAST_PROBE)
                        self._until_probe = self._probe_every
                elif self._spin_ns > 0:
                    self._spin_ns = _FULL_SPIN_NS
                    self._probe_every = _FIRST_PROBE
                return m
            if stop_on_cancel and self.cancel_reason is not None:
                raise CancelledError(self.cancel_reason)
            spinning = not waited and time.monotonic_ns() - started < self._spin_ns
            waited = not spinning
            # Polling past 100 us, it gives way to whatever else waits for its
            # core (the host, the journal's server), as the C++ SDK does.
            if not self._read(0 if spinning else None) and spinning and time.monotonic_ns() - started > 100_000:
                os.sched_yield()

    def poll(self) -> None:
        """Reads what has arrived, without blocking, so that a cancel sent
        while the workflow computed is seen."""
        self._read(0)
        if self._next_buffered() is not None:
            raise self.fail("the host sent a message the agent did not ask for")

    def pause(self, seconds: float) -> None:
        """Sleeps for `seconds`, or until the host cancels the run."""
        deadline = time.monotonic() + seconds
        while True:
            if self._next_buffered() is not None:
                raise self.fail("the host sent a message the agent did not ask for")
            left = deadline - time.monotonic()
            if self.cancel_reason is not None or left <= 0:
                return
            self._read(left)

    def report(self, frame: bytes, seq: int, ok: bool) -> RetryAnswer | None:
        """Sends an attempt's outcome and blocks for the host's answer: None
        when it acknowledged the step (it is then durable), else the retry
        the host decided on."""
        self.send(frame)
        reply = self._receive(stop_on_cancel=False)
        if isinstance(reply, Ack) and reply.seq == seq:
            self._host_alone = reply.alone
            return None
        if isinstance(reply, RetryAnswer) and reply.seq == seq and not ok:
            return reply
        raise self.fail(f"expected the host's ack or retry for step {seq}")

    def request(self, frame: bytes, seq: int, kind: str, name: str) -> StepRecord:
        """Sends a tool, sleep, wait, child or join request and blocks for
        the host's journaled result. After cancelling, the host still answers
        a tool call but none of the others: waiting for one of those raises
        CancelledError when the cancel arrives."""
        self.send(frame)
        reply = self._receive(stop_on_cancel=kind != "tool")
        if not isinstance(reply, Result) or reply.record.seq != seq:
            raise self.fail(f"expected the host's result for {kind} {seq}")
        r = reply.record
        if r.kind != kind or r.name != name:
            raise self.fail(f"the host's result for seq {seq} is {r.kind} {r.name!r}, not {kind} {name!r}")
        return r

    def _pull_history(self) -> History:
        self.send(encode_frame({"t": "history", "from": self.next_seq}))
        reply = self._receive(stop_on_cancel=False)
        if (
            not isinstance(reply, History)
            or reply.start != self.next_seq
            or len(reply.steps) > self.start.history_steps - self.next_seq
        ):
            raise self.fail(f"expected the host's history from step {self.next_seq}")
        return reply

    def _next_recorded(self) -> StepRecord:
        """The history's record at the next position, pulled when the chunk
        ends before it; only while replaying."""
        chunk = self._chunk
        if chunk is None or self.next_seq - chunk.start >= len(chunk.steps):
            self._chunk = chunk = None  # hold one chunk at a time
            chunk = self._chunk = self._pull_history()
        return chunk.steps[self.next_seq - chunk.start]

    def _consume(self) -> None:
        self.next_seq += 1
        if not self.replaying:
            self._chunk = None  # replay is over: hold no history while the run goes on

    def replay_patch(self, patch_id: str) -> bool | None:
        """While replaying: whether the next position holds patch marker
        `patch_id`, which is then consumed (PROTOCOL.md §4.1); any other
        record stays for the next operation. None when past the history."""
        if self.nondeterminism is not None:
            raise NondeterminismError(self.nondeterminism)
        if not self.replaying:
            return None
        r = self._next_recorded()
        if r.kind != "patch" or r.name != patch_id:
            return False
        self._consume()
        return True

    def replay_next(self, name: str, kind: str) -> StepRecord | None:
        """The journaled outcome at the next position, or None when past the
        history. A different name or kind raises NondeterminismError (and is
        remembered, so a workflow that catches it still fails)."""
        if self.nondeterminism is not None:
            raise NondeterminismError(self.nondeterminism)
        if not self.replaying:
            return None
        r = self._next_recorded()
        if r.name != name or r.kind != kind:
            self.nondeterminism = (
                f"non-determinism at step {self.next_seq}: the journal has {r.kind} '{r.name}' but the code now "
                f"asks for {kind} '{name}'; the agent's code changed or branches on something not journaled"
            )
            raise NondeterminismError(self.nondeterminism)
        self._consume()
        return r

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def emit(self, data_text: str) -> None:
        if not self.replaying:
            self.send(encode_frame({"t": "emit"}, "data", data_text))
