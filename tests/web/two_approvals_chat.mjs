// Drives Axon's POST /api/chat with the `ai` package's AbstractChat (what useChat wraps,
// sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses) through a
// step with two calls that need approval, decided one at a time across a reload: the
// first call is decided in the first chat (with "send": the page then sends it itself,
// sendMessage() with no message, and the server answers 202); the page is reloaded (a
// new chat from GET /api/sessions/{id}?view=ui) and the calls it shows waiting are
// decided there, the last decision sending the continuation itself.
//
//   node two_approvals_chat.mjs '{"url": "http://127.0.0.1:PORT", "chatId": "s",
//                                 "first": true, "second": false, "send": true}'
//
// With "ai": a file URL of another copy of the package (ai@6), that one is used. With
// "reloadUrl": the page is reloaded from that server (another front end of a worker
// deployment), and sends the rest there.
// Prints one JSON object: the request bodies sent and each response's status, the
// reloaded chat's messages, its status and error (if any).

const config = JSON.parse(process.argv[2]);
const { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithApprovalResponses } =
  await import(config.ai ?? "ai");
const { chatClass } = await import("./chat_state.mjs");
const Chat = chatClass(AbstractChat);

const bodies = [];
const statuses = [];
const transport = (base) =>
  new DefaultChatTransport({
    api: `${base}/api/chat`,
    fetch: async (url, init) => {
      bodies.push(JSON.parse(init.body));
      const response = await fetch(url, init);
      statuses.push(response.status);
      return response;
    },
  });
const options = (base) => ({
  id: config.chatId,
  transport: transport(base),
  sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
});
let chat = new Chat(options(config.url));

const settle = async (requests) => {
  for (let i = 0; i < 500; i++) {
    if (bodies.length >= requests && chat.status === "ready") return;
    if (chat.status === "error") return;
    await new Promise((r) => setTimeout(r, 20));
  }
};
const waiting = () => chat.messages.at(-1).parts.filter((p) => p.state === "approval-requested");

await chat.sendMessage({ text: "go" });
await settle(1);
const [first] = waiting();
await chat.addToolApprovalResponse({ id: first.approval.id, approved: config.first });
if (config.send) {
  await chat.sendMessage();
  await settle(2);
}
const firstError = chat.error ? String(chat.error.message) : null;
// the page reloaded: what the server stored, the calls it shows waiting decided
const base = config.reloadUrl ?? config.url;
const stored = await (await fetch(`${base}/api/sessions/${config.chatId}?view=ui`)).json();
chat = new Chat({ ...options(base), messages: stored.ui_messages });
const shown = waiting().map((p) => p.toolCallId);
const sent = bodies.length;
for (const part of waiting()) {
  const yes = part.toolCallId === first.toolCallId ? config.first : config.second;
  await chat.addToolApprovalResponse({ id: part.approval.id, approved: yes });
}
await settle(sent + 1);
console.log(
  JSON.stringify({
    bodies,
    statuses,
    shown,
    firstError,
    messages: chat.messages,
    status: chat.status,
    error: chat.error ? String(chat.error.message) : null,
  }),
);
