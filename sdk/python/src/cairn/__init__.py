"""cairn: durable workflows for AI agents. An agent is a program that hands
its workflow to cairn.main; every ctx.step result is journaled by the host
before the step returns, and on replay (after any crash) the recorded result
is returned without running the step again. Timers, signals and child runs
are journaled the same way, so a run can wait for days and survive restarts.

    import cairn

    def workflow(ctx: cairn.Context, input):
        plan = ctx.step("plan", lambda: make_plan(input))
        approval = ctx.wait_signal("approved", timeout=24 * 3600)
        if approval is None:
            return "not approved in time"
        return ctx.step("report", lambda: write_report(plan, approval))

    cairn.main(workflow)

The wire protocol is specified in protocol/PROTOCOL.md; docs/python.md is the guide."""

from ._version import __version__
from .context import ChildHandle, Context, Json
from .errors import (
    CancelledError,
    ChildError,
    ChildFailed,
    NondeterminismError,
    StepFailed,
    TerminalError,
    ToolError,
)
from .retry import Duration, Retry
from .runner import Workflow, main, run

__all__ = [
    "CancelledError",
    "ChildError",
    "ChildFailed",
    "ChildHandle",
    "Context",
    "Duration",
    "Json",
    "NondeterminismError",
    "Retry",
    "StepFailed",
    "TerminalError",
    "ToolError",
    "Workflow",
    "__version__",
    "main",
    "run",
]
