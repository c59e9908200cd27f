// The Vercel AI SDK's default OpenAI provider (the Responses API, responses stored) in a
// two-turn conversation with a tool: the first turn calls get_weather and answers from
// its result (two steps), the second asks again after the first turn's messages, streamed.
// Prints one JSON line: what the SDK made of each step, and the input items it sent.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";

const sent = [];
const openai = createOpenAI({
  baseURL: process.env.BASE_URL,
  apiKey: "sk-local",
  fetch: async (url, options) => {
    sent.push(JSON.parse(options.body).input.map((item) => item.type ?? item.role));
    return fetch(url, options);
  },
});
const tools = {
  get_weather: tool({
    description: "Get the current weather in a city.",
    inputSchema: jsonSchema(JSON.parse(process.env.PARAMETERS)),
    execute: async ({ city }) => `Sunny in ${city}.`,
  }),
};
const question = { role: "user", content: "What is the weather in Paris?" };
const first = await generateText({
  model: openai("default"),
  tools,
  messages: [question],
  stopWhen: stepCountIs(2),
  maxOutputTokens: 40,
});
const second = streamText({
  model: openai("default"),
  tools,
  messages: [question, ...first.response.messages, { role: "user", content: "Hello!" }],
  maxOutputTokens: 40,
});
const steps = first.steps.map((step) => ({
  calls: step.toolCalls.map((call) => ({ name: call.toolName, input: call.input })),
  results: step.toolResults.map((result) => result.output),
  finish: step.finishReason,
}));
const secondFinish = await second.finishReason;
console.log(JSON.stringify({ steps, secondFinish, sent }));
