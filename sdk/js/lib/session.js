// The agent's side of one run: the channel, the position in the history and
// the chunk of it being replayed (pulled from the host as replay reaches its
// end, so memory stays bounded whatever the history's size), and the one
// answer the agent waits for (PROTOCOL.md §2.1: at most one is outstanding).

import { CancelledError, HostGone, NondeterminismError } from "./errors.js";
import { checkHostMessage, protocolVersion } from "./messages.js";
import { version } from "./version.js";
import { FrameDecoder, encodeFrame } from "./wire.js";

const sdkName = `cairn-js/${version}`;
const longestTimer = 2 ** 31 - 1; // setTimeout fires at once for more

export class Session {
  #socket;
  #decoder = new FrameDecoder();
  // What the agent waits for: { accepts(message), resolve, reject, cancellable, what }.
  #waiter = null;
  #chunk = { from: 0, steps: [] };
  #finished = false;
  #lost = null;
  #resolveLost;

  start = null; // the host's start message
  nextSeq = 0;
  cancelReason = null; // set when the host's cancel arrives
  nondeterminism = null; // the first mismatch's message; the run fails with it
  // Settles with the HostGone error once the host goes away or breaks the protocol.
  lost = new Promise((resolve) => (this.#resolveLost = resolve));

  // Takes over `socket` (a net.Socket on the channel).
  constructor(socket) {
    this.#socket = socket;
    socket.on("data", (bytes) => this.#receive(bytes));
    socket.on("end", () => this.#goneWith(new HostGone("the host closed the channel")));
    socket.on("error", (e) => this.#goneWith(new HostGone(`lost the channel to the host: ${e.message}`)));
  }

  // The handshake: resolves once the host's start is in; throws HostGone if
  // the host rejects the agent, speaks another version or breaks the channel.
  async open() {
    this.send(JSON.stringify({ t: "hello", v: protocolVersion, sdk: sdkName }));
    const reply = await this.#expect((m) => m.t === "start" || m.t === "reject", "start", false);
    if (reply.t === "reject") throw new HostGone(`the host rejected this agent: ${reply.error}`);
    if (reply.v !== protocolVersion)
      throw new HostGone(`the host speaks protocol v${reply.v}; this SDK (${sdkName}) speaks v${protocolVersion}`);
    this.start = reply;
  }

  // The HostGone error once the host went away or broke the protocol, else null.
  get gone() {
    return this.#lost;
  }

  get replaying() {
    return this.nextSeq < this.start.history_steps;
  }

  // The attempt number for the first attempt of the operation at `seq`.
  firstAttemptFor(seq) {
    return seq === this.start.history_steps ? this.start.next_step_attempt : 1;
  }

  // Throws what stops every journaled operation from starting: a lost host,
  // a cancel, an earlier non-determinism.
  checkUsable() {
    if (this.#lost) throw this.#lost;
    if (this.cancelReason !== null) throw new CancelledError(this.cancelReason);
    if (this.nondeterminism !== null) throw new NondeterminismError(this.nondeterminism);
  }

  // Sends the JSON object text `text` as one frame. After done/fail nothing
  // more goes out: a workflow may have left work running that it did not await.
  send(text) {
    if (this.#lost) throw this.#lost;
    if (this.#finished) return;
    this.#socket.write(encodeFrame(text));
  }

  // Sends done/fail and closes the channel; resolves once it is flushed.
  finish(text) {
    this.send(text);
    this.#finished = true;
    return new Promise((resolve) => this.#socket.end(resolve));
  }

  // The journaled record at the next position, or null once past the
  // history. A name or kind other than the journal's is non-determinism,
  // remembered so that the run fails even if the workflow catches it.
  async replayNext(name, kind) {
    if (this.nextSeq >= this.start.history_steps) return null;
    const at = await this.#nextRecorded();
    const r = this.#chunk.steps[at];
    if (r.name !== name || r.kind !== kind) {
      this.nondeterminism =
        `non-determinism at step ${this.nextSeq}: the journal has ${r.kind} '${r.name}' but the code now asks for ` +
        `${kind} '${name}'; the agent's code changed or branches on something not journaled`;
      throw new NondeterminismError(this.nondeterminism);
    }
    this.#consume(at);
    return r;
  }

  // While replaying: whether the next position holds patch marker `id`,
  // which is then consumed (PROTOCOL.md §4.1); any other record stays for
  // the next operation. null once past the history.
  async replayPatch(id) {
    if (this.nextSeq >= this.start.history_steps) return null;
    const at = await this.#nextRecorded();
    const r = this.#chunk.steps[at];
    if (r.kind !== "patch" || r.name !== id) return false;
    this.#consume(at);
    return true;
  }

  // The chunk's index of the record at nextSeq, pulled when the chunk ends before it.
  async #nextRecorded() {
    const at = this.nextSeq - this.#chunk.from;
    if (at < this.#chunk.steps.length) return at;
    await this.#pullHistory();
    return 0;
  }

  #consume(at) {
    this.#chunk.steps[at] = null; // the workflow holds it now; the chunk need not
    this.nextSeq++;
    if (!this.replaying) this.#chunk = { from: 0, steps: [] };
  }

  async #pullHistory() {
    const from = this.nextSeq;
    this.send(`{"t":"history","from":${from}}`);
    const chunk = await this.#expect((m) => m.t === "history", `the history from step ${from}`, false);
    if (chunk.from !== from || from + chunk.steps.length > this.start.history_steps) {
      const e = new HostGone(`the host sent history steps ${chunk.from} to ${chunk.from + chunk.steps.length - 1} ` +
        `when asked for the history from step ${from} (it holds ${this.start.history_steps})`);
      this.#goneWith(e);
      throw e;
    }
    this.#chunk = chunk;
  }

  // Waits for the host's answer to the outcome of step `seq` just sent:
  // null once it acknowledged the step (it is durable), else the retry it
  // decided on (only for a failed attempt, `ok` false).
  async report(seq, ok) {
    const reply = await this.#expect(
      (m) => (m.t === "ack" || (m.t === "retry" && !ok)) && m.seq === seq,
      `the ack or retry for step ${seq}`,
      false,
    );
    return reply.t === "ack" ? null : reply;
  }

  // Sends a request (`text`: tool, sleep, wait, child or join for `seq`) and
  // waits for its result, which must be of `kind`. After a cancel the host
  // answers no request but a tool call: waiting for any other one throws
  // CancelledError when the cancel arrives.
  request(text, seq, kind) {
    this.send(text);
    return this.#expect(
      (m) => m.t === "result" && m.seq === seq && m.kind === kind,
      `the result of ${kind} ${seq}`,
      kind !== "tool",
    );
  }

  // Waits `ms` (a retry's delay); throws CancelledError as soon as a cancel arrives.
  pause(ms) {
    if (this.#lost) return Promise.reject(this.#lost);
    if (this.cancelReason !== null) return Promise.reject(new CancelledError(this.cancelReason));
    return new Promise((resolve, reject) => {
      let timer;
      const arm = (left) => {
        timer = setTimeout(() => {
          if (left > longestTimer) return arm(left - longestTimer);
          this.#waiter = null;
          resolve();
        }, Math.min(left, longestTimer));
      };
      arm(ms);
      this.#waiter = {
        accepts: () => false,
        resolve,
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
        cancellable: true,
        what: "nothing during a retry's delay",
      };
    });
  }

  // Ends the session for a host whose answer makes no sense (`message` says
  // why); returns the error to throw.
  broken(message) {
    this.#goneWith(new HostGone(message));
    return this.#lost;
  }

  #expect(accepts, what, cancellable) {
    if (this.#lost) return Promise.reject(this.#lost);
    if (cancellable && this.cancelReason !== null) return Promise.reject(new CancelledError(this.cancelReason));
    return new Promise((resolve, reject) => {
      this.#waiter = { accepts, resolve, reject, cancellable, what };
    });
  }

  #receive(bytes) {
    if (this.#lost || this.#finished) return;
    try {
      for (const m of this.#decoder.feed(bytes)) this.#dispatch(checkHostMessage(m));
    } catch (e) {
      this.#goneWith(e instanceof HostGone ? e : new HostGone(`the host broke the protocol: ${e.message}`));
    }
  }

  #dispatch(m) {
    if (this.#lost) return;
    const w = this.#waiter;
    if (m.t === "cancel") {
      this.cancelReason ??= m.reason;
      if (w?.cancellable) {
        this.#waiter = null;
        w.reject(new CancelledError(this.cancelReason));
      }
      return;
    }
    if (w === null || !w.accepts(m))
      throw new HostGone(`the host sent '${m.t}' while the agent expected ${w ? w.what : "nothing"}`);
    this.#waiter = null;
    w.resolve(m);
  }

  #goneWith(error) {
    if (this.#lost || this.#finished) return;
    this.#lost = error;
    this.#socket.destroy();
    const w = this.#waiter;
    this.#waiter = null;
    w?.reject(error);
    this.#resolveLost(error);
  }
}
