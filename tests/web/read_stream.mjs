// Reads Axon's POST /api/chat with the `ai` package's own client code, as useChat does:
// DefaultChatTransport sends the useChat request body and parses the SSE response against
// uiMessageChunkSchema; readUIMessageStream builds the UI message from the chunks. The
// stored session's `ui_messages` must pass the package's validateUIMessages.
//
//   node read_stream.mjs '{"url": "http://127.0.0.1:PORT", "token": null,
//                          "requests": [{"chatId": "s1", "text": "hello"}]}'
//
// Prints one JSON array: per request the HTTP status, the stream headers, the chunk types
// in order, the final UI message, the stream's error (if any) and the validated history.
//
//   node read_stream.mjs '{"sse": "data: {...}\n\n..."}'
//
// parses an SSE body with the package's parseJsonEventStream and uiMessageChunkSchema and
// prints, per event, whether the schema accepted it; with "read": true, also the UI
// message readUIMessageStream builds from the accepted chunks, and its error.
import {
  DefaultChatTransport,
  UI_MESSAGE_STREAM_HEADERS,
  parseJsonEventStream,
  readUIMessageStream,
  uiMessageChunkSchema,
  validateUIMessages,
} from "ai";

const config = JSON.parse(process.argv[2]);

if (config.sse !== undefined) {
  const body = new Blob([config.sse]).stream();
  const parsed = [];
  for await (const result of parseJsonEventStream({ stream: body, schema: uiMessageChunkSchema })) {
    parsed.push(
      result.success
        ? { success: true, value: result.value }
        : { success: false, error: String(result.error && result.error.message) },
    );
  }
  if (config.read) {
    // and builds the UI message from the accepted chunks, as useChat does
    const chunks = parsed.filter((p) => p.success).map((p) => p.value);
    const stream = new ReadableStream({
      start(controller) {
        for (const chunk of chunks) controller.enqueue(chunk);
        controller.close();
      },
    });
    let message = null;
    let error = null;
    try {
      for await (const m of readUIMessageStream({ stream, terminateOnError: true })) message = m;
    } catch (e) {
      error = String((e && e.message) || e);
    }
    console.log(JSON.stringify({ parsed, message, error }));
    process.exit(0);
  }
  console.log(JSON.stringify(parsed));
  process.exit(0);
}

const auth = config.token ? { authorization: `Bearer ${config.token}` } : {};
const results = [];

for (const request of config.requests) {
  const result = { chatId: request.chatId, headers: {}, chunks: [], message: null, error: null };
  const transport = new DefaultChatTransport({
    api: `${config.url}/api/chat`,
    headers: auth,
    fetch: async (url, init) => {
      result.requestBody = JSON.parse(init.body);
      const response = await fetch(url, init);
      result.status = response.status;
      for (const name of Object.keys(UI_MESSAGE_STREAM_HEADERS)) {
        result.headers[name] = response.headers.get(name);
      }
      return response;
    },
  });
  try {
    const stream = await transport.sendMessages({
      chatId: request.chatId,
      trigger: "submit-message",
      messageId: undefined,
      messages: [
        { id: `user-${results.length}`, role: "user", parts: [{ type: "text", text: request.text }] },
      ],
      abortSignal: undefined,
    });
    const [forReader, forLog] = stream.tee();
    const logged = (async () => {
      for await (const chunk of forLog) result.chunks.push(chunk.type);
    })();
    for await (const message of readUIMessageStream({ stream: forReader, terminateOnError: true })) {
      result.message = message;
    }
    await logged;
  } catch (error) {
    result.error = String((error && error.message) || error);
  }
  const stored = await fetch(
    `${config.url}/api/sessions/${encodeURIComponent(request.chatId)}`,
    { headers: auth },
  );
  try {
    const body = await stored.json();
    result.stored = await validateUIMessages({ messages: body.ui_messages });
  } catch (error) {
    result.storedError = String((error && error.message) || error);
  }
  results.push(result);
}

console.log(JSON.stringify(results));
