// The chat the test scripts drive: the `ai` package's AbstractChat (what useChat wraps)
// with the plain state object useChat keeps in React's. `AbstractChat` is passed in, as
// each script loads the `ai` it is told to (the pinned 7, or 6 from ./ai6).

export function chatClass(AbstractChat) {
  class State {
    status = "ready";
    error = undefined;
    messages = [];
    pushMessage(m) {
      this.messages = [...this.messages, m];
    }
    popMessage() {
      this.messages = this.messages.slice(0, -1);
    }
    replaceMessage(i, m) {
      this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)];
    }
    snapshot(x) {
      return structuredClone(x);
    }
  }

  return class Chat extends AbstractChat {
    constructor(init) {
      const state = new State();
      if (init.messages) state.messages = init.messages; // (a reloaded page's, as useChat's)
      super({ ...init, state });
    }
  };
}
