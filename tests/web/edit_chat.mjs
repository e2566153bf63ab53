// Drives Axon's POST /api/chat with the `ai` package's AbstractChat (what useChat wraps)
// through an edit: sendMessage "one", sendMessage "two", then sendMessage({text, messageId})
// of the last user message ("two" becomes "two, edited").
//
//   node edit_chat.mjs '{"url": "http://127.0.0.1:PORT", "chatId": "s"}'
//
// Prints one JSON object: the request bodies sent, the chat's final messages, its status
// and error (if any).

const config = JSON.parse(process.argv[2]);
const { AbstractChat, DefaultChatTransport } = await import(config.ai ?? "ai");

const { chatClass } = await import("./chat_state.mjs");
const Chat = chatClass(AbstractChat);

const bodies = [];
const transport = new DefaultChatTransport({
  api: `${config.url}/api/chat`,
  fetch: async (url, init) => {
    bodies.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
const chat = new Chat({ id: config.chatId, transport });

await chat.sendMessage({ text: "one" });
await chat.sendMessage({ text: "two" });
const last = chat.messages.findLast((m) => m.role === "user");
await chat.sendMessage({ text: "two, edited", messageId: last.id });
console.log(
  JSON.stringify({
    bodies,
    messages: chat.messages,
    status: chat.status,
    error: chat.error ? String(chat.error.message) : null,
  }),
);
