// Steps, a tool call and the journaled clock, as the tests' input chooses.
import { main } from "cairn";

main(async (ctx, input) => {
  const a = await ctx.step("a", async () => ({ x: 1 }));
  const b = await ctx.step("b", () => 2);
  const r = await ctx.tool("echo", { v: 3 });
  const t = await ctx.now();
  ctx.emit({ progress: 1 });
  return { a, b, r, t: t.getTime(), replaying: ctx.replaying, input };
});
