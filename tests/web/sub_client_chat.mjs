// Drives Axon's POST /api/chat with the `ai` package's AbstractChat (what useChat wraps)
// through a sub-agent's client-side tool passed up (as_tool(pass_approvals=True)):
// onToolCall answers the sub call the stream shows (addToolOutput, not awaited, as the
// AI SDK asks), then the page sends the continuation itself (sendMessage() with no
// message): the agent tool's own part has no output yet, so
// lastAssistantMessageIsCompleteWithToolCalls does not send it.
//
//   node sub_client_chat.mjs '{"url": "http://127.0.0.1:PORT", "chatId": "s",
//                              "tool": "locate", "output": {...}}'
//
// Prints one JSON object: the tool calls onToolCall got, the request bodies sent, the
// chat's final messages, its status and error (if any).

const config = JSON.parse(process.argv[2]);
const { AbstractChat, DefaultChatTransport } = await import(config.ai ?? "ai");
const { chatClass } = await import("./chat_state.mjs");
const Chat = chatClass(AbstractChat);

const bodies = [];
const calls = [];
const transport = new DefaultChatTransport({
  api: `${config.url}/api/chat`,
  fetch: async (url, init) => {
    bodies.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
const chat = new Chat({
  id: config.chatId,
  transport,
  onToolCall: ({ toolCall }) => {
    calls.push(toolCall);
    if (toolCall.toolName === config.tool) {
      chat.addToolOutput({
        tool: toolCall.toolName,
        toolCallId: toolCall.toolCallId,
        output: config.output,
      });
    }
  },
});

const settle = async (requests) => {
  for (let i = 0; i < 500; i++) {
    if (bodies.length >= requests && chat.status === "ready") return;
    if (chat.status === "error") return;
    await new Promise((r) => setTimeout(r, 20));
  }
};

await chat.sendMessage({ text: "go" });
await settle(1);
await chat.sendMessage();
await settle(2);
console.log(
  JSON.stringify({
    calls,
    bodies,
    messages: chat.messages,
    status: chat.status,
    error: chat.error ? String(chat.error.message) : null,
  }),
);
