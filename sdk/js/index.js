// cairn's JavaScript/TypeScript SDK: what an agent program imports. Every
// ctx.step result is journaled by the host before the step returns, and on
// replay (after any crash) the recorded result is returned without running
// the step again. The wire protocol is protocol/PROTOCOL.md; the API,
// index.d.ts and docs/typescript.md.
export { main } from "./lib/run.js";
export {
  CancelledError,
  ChildError,
  ChildFailed,
  NondeterminismError,
  StepFailed,
  TerminalError,
  ToolError,
} from "./lib/errors.js";
