#!/usr/bin/env node
// A trip planner built with the OpenAI Agents SDK, unmodified but for two
// seams, and made durable by cairn: the model client's fetch is cairn's bridge
// (each model call is one journaled llm.chat the host makes with its key), and
// each function tool's body is a journaled step. The planner calls two tools,
// then hands off to the writer, whose answer is the run's output. Killed at
// any point and resumed, it repeats no model call and no finished tool body.
import { appendFileSync } from "node:fs";

import { Agent, OpenAIChatCompletionsModel, run, setTracingDisabled, tool } from "@openai/agents";
import { main } from "cairn";
import { durableTool, openaiFetch } from "cairn/openai";
import OpenAI from "openai";
import { z } from "zod";

const modelName = "gpt-4o-mini";  // granted in agent.policy.json

const forecasts = { lisbon: "sunny, 24 C", oslo: "rain, 9 C" };
const perEuro = { USD: 1.08, GBP: 0.85 };

// Each body leaves a line in the workspace, so a test can count executions.
function logged(name, input) {
  appendFileSync("tool_calls.log", `${name} ${JSON.stringify(input)}\n`);
}

main(async (ctx, input) => {
  setTracingDisabled(true);  // traces would go to api.openai.com; the sandbox has no network
  const client = new OpenAI({ apiKey: "unused", baseURL: "https://cairn.invalid/v1", fetch: openaiFetch(ctx) });
  const model = new OpenAIChatCompletionsModel(client, modelName);

  const getWeather = tool({
    name: "get_weather",
    description: "The weather forecast for a city",
    parameters: z.object({ city: z.string() }),
    execute: durableTool(ctx, "get_weather", async ({ city }) => {
      logged("get_weather", { city });
      return `${city}: ${forecasts[city.toLowerCase()] ?? "no forecast"}`;
    }),
  });
  const convertCurrency = tool({
    name: "convert_currency",
    description: "Converts an amount of euros to another currency",
    parameters: z.object({ amount: z.number(), to: z.string() }),
    execute: durableTool(ctx, "convert_currency", async ({ amount, to }) => {
      logged("convert_currency", { amount, to });
      const rate = perEuro[to];
      return rate ? `${amount} EUR = ${(amount * rate).toFixed(2)} ${to}` : `no rate for ${to}`;
    }),
  });

  const writer = new Agent({
    name: "Writer",
    instructions: "You are the writer. Turn the planner's facts into a short note for the traveller.",
    model,
  });
  const planner = new Agent({
    name: "Planner",
    instructions: "You are the planner. Look up the weather and convert the budget, then hand off to the writer.",
    model,
    tools: [getWeather, convertCurrency],
    handoffs: [writer],
  });

  const result = await run(planner, input?.request ?? "Plan a day in Lisbon with a budget of 100 EUR, in USD.");
  return { answer: result.finalOutput, agent: result.lastAgent?.name ?? null };
});
