"""How a failing step asks to be retried inside the same run."""

from datetime import timedelta

from ._record import FrozenRecord

# A duration: seconds (int or float) or a timedelta, everywhere in the SDK.
Duration = float | timedelta


def seconds_of(d: Duration) -> float:
    """`d` in seconds."""
    return d.total_seconds() if isinstance(d, timedelta) else float(d)


class Retry(FrozenRecord):
    """The host decides from this and the run's policy: after attempt n fails
    it waits min(initial_delay * multiplier**(n-1), max_delay), scaled by a
    random factor in [1 - jitter, 1] so that runs failing together do not
    retry in lockstep, then makes attempt n+1. A TerminalError is never
    retried. max_attempts is at most the run policy's retry.step_attempts
    (default 10): more are not made. `timeout` bounds one attempt (None: the
    run policy's default); the host kills the sandbox of an attempt that
    overruns it and counts a failed attempt. Durations are seconds or
    timedeltas; longer than 100 years counts as 100 years."""

    __slots__ = ("max_attempts", "initial_delay", "multiplier", "max_delay", "timeout", "jitter")
    __match_args__ = ("max_attempts", "initial_delay", "multiplier", "max_delay", "timeout", "jitter")
    max_attempts: int
    initial_delay: Duration
    multiplier: float
    max_delay: Duration
    timeout: Duration | None
    jitter: float

    def __init__(self, max_attempts: int = 3, initial_delay: Duration = 0.1, multiplier: float = 2.0,
                 max_delay: Duration = 10.0, timeout: Duration | None = None, jitter: float = 0.2) -> None:
        self._set("max_attempts", max_attempts)
        self._set("initial_delay", initial_delay)
        self._set("multiplier", multiplier)
        self._set("max_delay", max_delay)
        self._set("timeout", timeout)
        self._set("jitter", jitter)
        self._check()

    def _check(self) -> None:
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool):
            raise TypeError(f"Retry.max_attempts must be an int (got {self.max_attempts!r})")
        if self.max_attempts < 1:
            raise ValueError(f"Retry.max_attempts must be at least 1 (got {self.max_attempts})")
        for field in ("initial_delay", "max_delay"):
            value = seconds_of(getattr(self, field))
            if not value >= 0:
                raise ValueError(f"Retry.{field} must be 0 or more seconds (got {value})")
        if not self.multiplier >= 0:
            raise ValueError(f"Retry.multiplier must be 0 or more (got {self.multiplier})")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"Retry.jitter must be within [0, 1] (got {self.jitter})")
        if self.timeout is not None and not seconds_of(self.timeout) > 0:
            raise ValueError(f"Retry.timeout must be None or more than 0 seconds (got {self.timeout})")

    @staticmethod
    def no_retry() -> "Retry":
        """One attempt only."""
        return Retry(max_attempts=1)
