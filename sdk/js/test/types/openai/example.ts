// Checked by `tsc -p test/types/openai` (ctest sdk_js_openai_types): an agent
// that uses cairn/openai must compile against openai.d.ts, and misuses must not.
import { main } from "cairn";
import { durableTool, openaiFetch, type BridgeFetch } from "cairn/openai";

main(async (ctx, input: { city: string }) => {
  const fetch: BridgeFetch = openaiFetch(ctx);
  const response: Response = await fetch("https://cairn.invalid/v1/chat/completions", { method: "POST", body: "{}" });
  const weather = durableTool(ctx, "get_weather", async ({ city }: { city: string }) => `${city}: sunny`,
    { retry: { maxAttempts: 2 } });
  const forecast: string = await weather({ city: input.city });
  const nothing: null = await durableTool(ctx, "log", async () => {})();
  // @ts-expect-error: the body's arguments are typed
  await weather({ town: input.city });
  return { status: response.status, forecast, nothing };
});
