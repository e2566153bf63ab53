// Runs Axon's POST /ag-ui with the official AG-UI client (HttpAgent), as an application
// would: one agent object across several runs of a thread. The client verifies the
// event sequence and strips (with a warning) anything its schemas do not describe;
// every event it hands on is also parsed with @ag-ui/core's EventSchema here.
//
// argv[2]: {"url", "token", "threadId", "runs": [{
//   "userText"?: a user message to add first,
//   "answerPending"?: {"content", "error"?}: a tool message for each call the last run
//                     left pending (pendingToolCallIds),
//   "approveAll"?: true|false: resume every pending interrupt with {approved},
//   "tools"?, "context"?: the run's RunAgentInput fields }]}
// stdout: {"results": [{types, events, outcome, error (thrown), runError (RUN_ERROR),
//                       schemaErrors, messages, pendingInterrupts}],
//          "warnings": [...]}
import { HttpAgent } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";

const config = JSON.parse(process.argv[2]);
const warnings = [];
console.warn = (...args) => warnings.push(args.map(String).join(" "));

const agent = new HttpAgent({
  url: config.url,
  headers: config.token ? { Authorization: `Bearer ${config.token}` } : {},
  threadId: config.threadId,
});

const results = [];
let pending = [];
for (const step of config.runs) {
  if (step.answerPending) {
    for (const toolCallId of pending) {
      agent.addMessage({
        id: crypto.randomUUID(),
        role: "tool",
        toolCallId,
        content: step.answerPending.content,
        ...(step.answerPending.error ? { error: step.answerPending.error } : {}),
      });
    }
  }
  if (step.userText) {
    agent.addMessage({ id: crypto.randomUUID(), role: "user", content: step.userText });
  }
  let resume;
  if (step.approveAll !== undefined) {
    resume = agent.pendingInterrupts.map((i) => ({
      interruptId: i.id,
      status: "resolved",
      payload: { approved: step.approveAll },
    }));
  }
  const events = [];
  const schemaErrors = [];
  let outcome = null;
  let error = null;
  let runError = null;
  try {
    await agent.runAgent(
      { tools: step.tools ?? [], context: step.context ?? [], resume },
      {
        onEvent({ event }) {
          events.push(event);
          const parsed = EventSchema.safeParse(event);
          if (!parsed.success) schemaErrors.push({ type: event.type, error: String(parsed.error) });
        },
        onRunErrorEvent({ event }) {
          runError = { message: event.message, code: event.code ?? null };
        },
        onRunFinishedEvent(params) {
          outcome = {
            type: params.outcome,
            pendingToolCallIds: params.pendingToolCallIds ?? null,
            interrupts: params.interrupts ?? null,
          };
        },
      },
    );
  } catch (e) {
    error = String(e?.message ?? e);
  }
  pending = outcome?.pendingToolCallIds ?? [];
  results.push({
    types: events.map((e) => e.type),
    events,
    outcome,
    error,
    runError,
    schemaErrors,
    messages: structuredClone(agent.messages),
    pendingInterrupts: structuredClone(agent.pendingInterrupts),
  });
}
process.stdout.write(JSON.stringify({ results, warnings }));
