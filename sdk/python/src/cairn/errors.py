"""The exceptions a workflow sees, mirroring the C++ SDK's (cairn/cairn.hpp)."""


class TerminalError(Exception):
    """Raise from a step to fail it at once, without further attempts."""


class StepFailed(Exception):
    """A step failed for good (every attempt raised); raised again on replay of
    a step whose failure was journaled. Catch it to continue the workflow."""

    def __init__(self, step: str, type: str, cause: str) -> None:
        super().__init__(f"step '{step}' failed: {cause}")
        self.step = step
        self.type = type  # the class name of the exception the step raised
        self.cause = cause  # that exception's message


class ToolError(Exception):
    """A tool call did not succeed: the host refused it (not granted by the
    run's policy, or arguments outside the grant), or the tool failed.
    Journaled like a result: on replay the same error is raised again.
    `type` is "refused", "timeout", "too_large", "bad_output", "unavailable",
    "failed" or "settled" (recorded by `cairn settle --error`)."""

    def __init__(self, tool: str, type: str, message: str) -> None:
        super().__init__(message)
        self.tool = tool
        self.type = type


class CancelledError(Exception):
    """The host cancelled the run (`cairn cancel`, or its run timeout passed).
    Raised by every journaled ctx call from then on. The run ends as cancelled
    whatever the workflow does, even if it catches this and returns."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the run was cancelled: {reason}")
        self.reason = reason  # as the host gave it


class ChildError(Exception):
    """The host did not start a child run: `type` is "no_such_agent" or
    "refused". Journaled: on replay the same error is raised again."""

    def __init__(self, agent: str, type: str, message: str) -> None:
        super().__init__(message)
        self.agent = agent
        self.type = type


class ChildFailed(Exception):
    """A joined child run failed or was cancelled: `type` is "child_failed",
    "child_cancelled" or "refused". Journaled like its output."""

    def __init__(self, run_id: str, type: str, cause: str) -> None:
        how = "was cancelled" if type == "child_cancelled" else "failed"
        super().__init__(f"child run '{run_id}' {how}: {cause}")
        self.run_id = run_id
        self.type = type
        self.cause = cause  # the child's error message


class NondeterminismError(BaseException):
    """The code asked for a different operation than the journal holds at this
    position. A BaseException, like the C++ SDK's non-std::exception, so that
    `except Exception` does not swallow it; the run fails even if the workflow
    catches it."""
