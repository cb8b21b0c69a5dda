// The errors a workflow sees, mirroring the C++ SDK's (sdk/include/cairn/cairn.hpp).

class CairnError extends Error {
  get name() {
    return this.constructor.name;
  }
}

// Throw from a step to fail it at once, without further attempts.
export class TerminalError extends CairnError {}

// A step failed for good (its last attempt threw); also thrown again on replay
// of a step whose failure was journaled. Catch it to continue the workflow.
export class StepFailed extends CairnError {
  constructor(step, type, cause) {
    super(`step '${step}' failed: ${cause}`);
    this.step = step; // the step's name
    this.type = type; // the class name of what the step threw, e.g. "TypeError"
    this.cause = cause; // its message
  }
}

// A tool call did not succeed: the host refused it (not granted by the run's
// policy, or arguments outside the grant), or the tool failed. Journaled like
// a result: replay throws it again.
export class ToolError extends CairnError {
  constructor(tool, type, message) {
    super(message);
    this.tool = tool;
    // "refused", "timeout", "too_large", "bad_output", "unavailable", "failed" or "settled"
    this.type = type;
  }
}

// The host cancelled the run (`cairn cancel`, or its run timeout passed).
// Thrown by every journaled call from then on; the run ends as cancelled
// whatever the workflow does, even if it catches this and returns.
export class CancelledError extends CairnError {
  constructor(reason) {
    super(`the run was cancelled: ${reason}`);
    this.reason = reason; // as the host gave it
  }
}

// The host did not start a child run ("no_such_agent" or "refused"). Journaled.
export class ChildError extends CairnError {
  constructor(agent, type, message) {
    super(message);
    this.agent = agent;
    this.type = type;
  }
}

// A joined child run failed or was cancelled. Journaled like its output.
export class ChildFailed extends CairnError {
  constructor(runId, type, cause) {
    super(`child run '${runId}' ${type === "child_cancelled" ? "was cancelled" : "failed"}: ${cause}`);
    this.runId = runId;
    this.type = type; // "child_failed", "child_cancelled" or "refused"
    this.cause = cause; // the child's error message
  }
}

// The code asked for another operation than the journal holds at this
// position. The run fails with type "nondeterminism" even if the workflow
// catches this.
export class NondeterminismError extends CairnError {}

// The host went away or broke the protocol: the agent sends nothing more and
// exits (code 2 before it accepted a start, else 3). Not exported.
export class HostGone extends CairnError {}
