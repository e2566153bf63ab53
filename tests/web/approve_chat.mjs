// Drives Axon's POST /api/chat with the `ai` package's AbstractChat (what useChat wraps)
// through a tool approval: sendMessage, then addToolApprovalResponse, which sends the
// continuation itself (sendAutomaticallyWhen:
// lastAssistantMessageIsCompleteWithApprovalResponses). With "clientOutput", through a
// client-side tool instead: addToolOutput, sent with
// lastAssistantMessageIsCompleteWithToolCalls.
//
//   node approve_chat.mjs '{"url": "http://127.0.0.1:PORT", "chatId": "s",
//                           "approved": true, "reason": "ok"}'
//
// Prints one JSON object: the request bodies sent, the chat's final messages, its status
// and error (if any).
// With "ai": a file URL of another copy of the package (ai@6), that one is used. With
// "tamperSignature": the continuation's approval signature has its last two characters
// replaced by these (a forged answer, tests/test_approval_node.py). With "dropSignature":
// the continuation's approval carries no signature (what an `ai` before 6.0.221 sends).
// With "editedInput": the continuation's approved approval also carries it as
// `axonEditedInput` (Axon's extension, which the page adds and `ai` never sends).

const config = JSON.parse(process.argv[2]);
const {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
} = await import(config.ai ?? "ai");
const clientTool = config.clientOutput !== undefined;

const { chatClass } = await import("./chat_state.mjs");
const Chat = chatClass(AbstractChat);

const bodies = [];
const transport = new DefaultChatTransport({
  api: `${config.url}/api/chat`,
  fetch: async (url, init) => {
    let body = JSON.parse(init.body);
    if (config.dropSignature && body.messages.at(-1).role === "assistant") {
      for (const p of body.messages.at(-1).parts) {
        if (p.approval) delete p.approval.signature;
      }
      init = { ...init, body: JSON.stringify(body) };
    }
    if (config.editedInput !== undefined && body.messages.at(-1).role === "assistant") {
      for (const p of body.messages.at(-1).parts) {
        if (p.approval && p.approval.approved === true) p.approval.axonEditedInput = config.editedInput;
      }
      init = { ...init, body: JSON.stringify(body) };
    }
    if (config.tamperSignature && body.messages.at(-1).role === "assistant") {
      // a client that alters the signature it got (its last two characters)
      for (const p of body.messages.at(-1).parts) {
        if (p.approval && p.approval.signature) {
          const sig = p.approval.signature;
          const end = sig.slice(-2) === config.tamperSignature ? "BB" : config.tamperSignature;
          p.approval.signature = sig.slice(0, -2) + end;
        }
      }
      init = { ...init, body: JSON.stringify(body) };
    }
    bodies.push(body);
    return fetch(url, init);
  },
});
const chat = new Chat({
  id: config.chatId,
  transport,
  sendAutomaticallyWhen: clientTool
    ? lastAssistantMessageIsCompleteWithToolCalls
    : lastAssistantMessageIsCompleteWithApprovalResponses,
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
const asked = chat.messages
  .at(-1)
  .parts.find((p) => p.state === "approval-requested");
const call = chat.messages.at(-1).parts.find((p) => p.state === "input-available");
if (clientTool && call) {
  await chat.addToolOutput({
    tool: call.type.slice("tool-".length),
    toolCallId: call.toolCallId,
    output: config.clientOutput,
  });
  await settle(2);
} else if (asked) {
  await chat.addToolApprovalResponse({
    id: asked.approval.id,
    approved: config.approved,
    ...(config.reason ? { reason: config.reason } : {}),
  });
  await settle(2);
}
console.log(
  JSON.stringify({
    bodies,
    messages: chat.messages,
    status: chat.status,
    error: chat.error ? String(chat.error.message) : null,
  }),
);
