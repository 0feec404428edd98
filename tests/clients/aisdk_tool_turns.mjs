// The Vercel AI SDK (`ai` + `@ai-sdk/openai`, its Responses provider) on a two-step tool
// conversation, as an agent built on it runs one:
//   step 1: the user's question with a tool offered; the model answers;
//   step 2: the history after a tool call (step 1's answer with the call, the tool's result).
// The tiny test model calls no tool on its own (and llama-server enforces no tool_choice
// "required" on the Qwen3.5 template), so step 2 adds the call to step 1's real answer, exactly
// where the SDK puts a call the model made. Step 2 is what breaks on llama-server: the SDK sends
// the assistant's text as an input item with a role and no "type".
//
//   node aisdk_tool_turns.mjs BASE_URL API_KEY     (prints one JSON line; exit 1 on any error)
// Imports resolve from a node_modules next to this file (the test links .clients/node's).
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, tool } from "ai";

const [baseURL, apiKey] = process.argv.slice(2);
const model = createOpenAI({ baseURL, apiKey }).responses("agent-model");
const tools = {
  get_time: tool({
    description: "Get the current time in a city",
    inputSchema: jsonSchema({
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
    }),
    execute: async ({ city }) => ({ city, time: "12:00" }),
  }),
};
const question = { role: "user", content: "What time is it in Paris?" };
// store: false, as opencode sets it: the default (true) sends earlier output as item_reference
// ids that only OpenAI's own store can resolve.
const providerOptions = { openai: { store: false } };
const settings = { model, tools, providerOptions, maxOutputTokens: 48 };

const first = await generateText({ ...settings, messages: [question] });
const [answer] = first.response.messages;
const call = { type: "tool-call", toolCallId: "call_1", toolName: "get_time", input: { city: "Paris" } };
const result = {
  type: "tool-result",
  toolCallId: "call_1",
  toolName: "get_time",
  output: { type: "json", value: await tools.get_time.execute({ city: "Paris" }, {}) },
};
const history = [
  question,
  { role: "assistant", content: [...answer.content, call] },
  { role: "tool", content: [result] },
];
const second = await generateText({ ...settings, messages: history });

const summary = (step) => ({
  finish: step.finishReason,
  text: step.text,
  reasoning: step.reasoningText ?? "",
  parts: step.response.messages.flatMap((m) => m.content.map((c) => c.type)),
});
console.log(JSON.stringify({ first: summary(first), second: summary(second) }));
