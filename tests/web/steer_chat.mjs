// Drives Axon's POST /api/chat with the `ai` package's AbstractChat (what useChat wraps)
// through a steer: sendMessage "first"; once its turn streams a call of the `hold` tool,
// sendMessage "also this" (the session's busy strategy is `steer`); then, with
// `"regenerate": true`, regenerate().
//
//   node steer_chat.mjs '{"url": "http://127.0.0.1:PORT", "chatId": "s"}'
//
// Optional: `"first"` (the first message's text), `"holdTool"` and `"holdCount"` (send
// once the answer shows that many calls of that tool: default one `hold`), `"urls"`
// (the n-th POST goes to `urls[n % urls.length]`: front ends of one worker deployment).
//
// Prints one JSON object: the request bodies sent, the chat's messages once both sends
// are over (`steered`) and at the end (`messages`), the data parts `onData` got, its
// status and error (if any).

const config = JSON.parse(process.argv[2]);
const { AbstractChat, DefaultChatTransport } = await import(config.ai ?? "ai");

const { chatClass } = await import("./chat_state.mjs");
const Chat = chatClass(AbstractChat);

const bodies = [];
const data = [];
const statuses = [];
const transport = new DefaultChatTransport({
  api: `${config.url}/api/chat`,
  fetch: async (url, init) => {
    bodies.push(JSON.parse(init.body));
    const urls = config.urls;
    const to = urls ? `${urls[(bodies.length - 1) % urls.length]}/api/chat` : url;
    return fetch(to, init);
  },
});
const chat = new Chat({
  id: config.chatId,
  transport,
  onData: (part) => data.push(part),
});

const holdType = `tool-${config.holdTool ?? "hold"}`;
const holding = () =>
  chat.messages.some(
    (m) =>
      m.role === "assistant" &&
      m.parts.filter((p) => p.type === holdType).length >= (config.holdCount ?? 1),
  );

const first = chat.sendMessage({ text: config.first ?? "first" });
while (!holding()) {
  await new Promise((resolve) => setTimeout(resolve, 5));
}
statuses.push(chat.status);
const steer = chat.sendMessage({ text: "also this" });
statuses.push(chat.status);
await Promise.all([first, steer]);
const steered = structuredClone(chat.messages);
statuses.push(chat.status);
const errors = [chat.error ? String(chat.error.message) : null];
if (config.regenerate) {
  await chat.regenerate();
  errors.push(chat.error ? String(chat.error.message) : null);
}
console.log(
  JSON.stringify({
    bodies,
    steered,
    messages: chat.messages,
    data,
    statuses,
    status: chat.status,
    errors,
  }),
);
