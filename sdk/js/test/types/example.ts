// Checked by `tsc -p test/types` (ctest sdk_js_types): a TypeScript agent
// written against index.d.ts must compile, and misuses must not.
import { main, CancelledError, ChildFailed, StepFailed, TerminalError, ToolError, type Context, type Json } from "cairn";

interface Input {
  topic: string;
}

main<Input>(async (ctx: Context, input) => {
  const plan: string[] = await ctx.step("plan", async () => [input.topic, "sources"], {
    retry: { maxAttempts: 3, initialDelayMs: 100, multiplier: 2, maxDelayMs: 10_000, timeoutMs: 0, jitter: 0.2 },
  });
  const count: number = await ctx.step("count", () => plan.length);
  const replies = await Promise.all(plan.map((p) => ctx.tool<{ text: string }>("llm.chat", { messages: [{ role: "user", content: p }] })));
  await ctx.sleep(1000);
  await ctx.sleepUntil(new Date(Date.now() + 1000));
  const approval = await ctx.waitSignal<{ ok: boolean }>("approval", { timeoutMs: 60_000 });
  const child = await ctx.startChild("summarize", { text: replies[0].text });
  const summary: Json = await ctx.join(child);
  const when: Date = await ctx.now();
  const r: number = await ctx.random();
  ctx.emit({ progress: count });
  if (ctx.cancelled || ctx.replaying) return null;
  try {
    await ctx.step("fatal", () => {
      throw new TerminalError("bad input");
    });
  } catch (e) {
    if (e instanceof StepFailed) return { step: e.step, type: e.type, cause: e.cause };
    if (e instanceof ToolError) return { tool: e.tool, type: e.type };
    if (e instanceof ChildFailed) return { run: e.runId, type: e.type };
    if (e instanceof CancelledError) return { reason: e.reason };
    throw e;
  }
  return { approved: approval?.ok ?? false, summary, at: when.toISOString(), r, run: ctx.runId, attempt: ctx.attempt };
});

async function misuses(ctx: Context) {
  // @ts-expect-error a step needs a name
  await ctx.step(async () => 1);
  // @ts-expect-error retry options are numbers
  await ctx.step("s", () => 1, { retry: { maxAttempts: "3" } });
  // @ts-expect-error ctx.cancelled is a property, not a method
  ctx.cancelled();
  // @ts-expect-error join takes the handle startChild returned
  await ctx.join(42);
}
void misuses;
