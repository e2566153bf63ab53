// Drives Axon's POST /api/chat with the `ai` package's AbstractChat (what useChat wraps)
// through a stop that overtakes an edit: sendMessage "one", then a stop naming the turn id
// the edit will carry (the body's `turnId`, set by `prepareSendMessagesRequest`), then
// sendMessage({text, messageId}) of that user message ("one" becomes "one, edited").
//
//   node stop_edit_chat.mjs '{"url": "http://127.0.0.1:PORT", "chatId": "s", "turnId": "t_edit"}'
//
// Prints one JSON object: the request bodies sent, the stop's status, the chat's final
// messages, its status and error (if any).

const config = JSON.parse(process.argv[2]);
const { AbstractChat, DefaultChatTransport } = await import(config.ai ?? "ai");

const { chatClass } = await import("./chat_state.mjs");
const Chat = chatClass(AbstractChat);

const bodies = [];
let turnId;
const transport = new DefaultChatTransport({
  api: `${config.url}/api/chat`,
  prepareSendMessagesRequest: ({ id, messages, trigger, messageId, body }) => ({
    body: { ...body, id, messages, trigger, messageId, ...(turnId ? { turnId } : {}) },
  }),
  fetch: async (url, init) => {
    bodies.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
const chat = new Chat({ id: config.chatId, transport });

await chat.sendMessage({ text: "one" });
turnId = config.turnId;
const stop = await fetch(`${config.url}/api/chat/${config.chatId}/stop`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ turnId }),
});
const last = chat.messages.findLast((m) => m.role === "user");
await chat.sendMessage({ text: "one, edited", messageId: last.id });
console.log(
  JSON.stringify({
    bodies,
    stop: stop.status,
    messages: chat.messages,
    status: chat.status,
    error: chat.error ? String(chat.error.message) : null,
  }),
);
