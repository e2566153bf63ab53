// Drives Axon's POST /api/chat with the `ai` package's AbstractChat (what useChat wraps)
// through a sub-agent's client-side tool passed up (as_tool(pass_approvals=True)):
// onToolCall answers the sub call the stream shows (addToolOutput, not awaited, as the
// AI SDK asks), then the page sends the continuation itself (sendMessage() with no
// message), or (with "auto", below) the chat does.
//
//   node sub_client_chat.mjs '{"url": "http://127.0.0.1:PORT", "chatId": "s",
//                              "tool": "locate", "output": {...}}'
//
// With "auto": the chat is given sendAutomaticallyWhen:
// lastAssistantMessageIsCompleteWithToolCalls and the script sends no continuation: the
// chat must send it itself once addToolOutput answered the sub call; the script waits
// for "requests" requests (2 by default) or a chat that stays ready. With "ai": a file
// URL of another copy of the package (ai@6), that one is used. With "reload": after the
// first request a new chat is made from the stored session (GET /api/sessions/{id}
// ?view=ui, a reloaded page's messages) and answers the call it shows.
//
// Prints one JSON object: the tool calls onToolCall got, the request bodies sent, the
// chat's final messages, its status and error (if any).

const config = JSON.parse(process.argv[2]);
const { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithToolCalls } =
  await import(config.ai ?? "ai");
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
const options = {
  id: config.chatId,
  transport,
  ...(config.auto ? { sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls } : {}),
};
let chat = new Chat({
  ...options,
  onToolCall: ({ toolCall }) => {
    calls.push(toolCall);
    if (toolCall.toolName === config.tool && !config.reload) {
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
if (config.reload) {
  // a reloaded page: a new chat from the stored session, answering the call it shows
  const stored = await (await fetch(`${config.url}/api/sessions/${config.chatId}?view=ui`)).json();
  chat = new Chat({ ...options, messages: stored.ui_messages });
  const call = chat.messages.at(-1).parts.find(
    (p) => p.type === `tool-${config.tool}` && p.state === "input-available",
  );
  chat.addToolOutput({ tool: config.tool, toolCallId: call.toolCallId, output: config.output });
}
if (!config.auto) await chat.sendMessage();
await settle(config.requests ?? 2);
console.log(
  JSON.stringify({
    calls,
    bodies,
    messages: chat.messages,
    status: chat.status,
    error: chat.error ? String(chat.error.message) : null,
  }),
);
