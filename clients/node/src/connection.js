// One connection to the daemon: JSON lines both ways, replies matched to their requests by id
// (they may come out of order: a kill is answered only when its tree is empty), events handed
// to a listener. The connection is the lease; it ends when the socket closes.
//
// An idle connection does not keep the process alive: the socket is unref'd while no reply is
// awaited and nobody reads events, so a host that forgets close() still exits (and the daemon,
// seeing the connection end, kills its trees), as a Python host does.

import { createConnection } from "node:net";
import { LeashError, connectionLost, daemonUnavailable, protocolError } from "./errors.js";

export const PROTOCOL_VERSION = 1;

/** No reply is near this (a `list` is at most about 250 KB): a longer line is not the daemon. */
const MAX_LINE_CHARS = 16 * 1024 * 1024;

/**
 * The daemon's answer to `hello` (docs/PROTOCOL.md), as far as the lease reads it.
 * @typedef {{ lease: { id: number, token: string }, daemon_version: string }} Hello
 * @typedef {import("./errors.js").ClosingReason} ClosingReason
 * What the lease hears of the connection: the events, its end, and how many trees it holds
 * (for the words of an error that ends it).
 * @typedef {{ onEvent: (event: Record<string, unknown>) => void,
 *   onClose: (error: LeashError) => void,
 *   trees: () => number }} Handlers
 */

export class Connection {
  /** @type {import("node:net").Socket} */
  #socket;
  /** @type {string} */
  #path;
  /** @type {Map<number, { resolve: (ok: any) => void, reject: (error: LeashError) => void }>} */
  #pending = new Map();
  #nextId = 1;
  #partial = "";
  #closed = false;
  /**
   * Why the daemon closed the connection, when it said so (a line without an id).
   * @type {LeashError | null}
   */
  #closeReason = null;
  /**
   * What the daemon's `closing` event said, the last line before it closes the connection.
   * @type {ClosingReason | null}
   */
  #closing = null;
  /** Whether someone reads events: the connection then keeps the process alive. */
  #listening = false;
  /** Whether close() waits for the socket to close: that keeps the process alive too. */
  #ending = false;
  /** @type {Handlers["onEvent"]} */
  #onEvent;
  /** @type {Handlers["onClose"]} */
  #onClose;
  /** @type {Handlers["trees"]} */
  #trees;
  /** @type {Promise<unknown>} */
  #whenClosed;

  /**
   * Connects to `path` and says hello. Resolves to [connection, hello reply].
   * @param {string} path
   * @param {Handlers} handlers
   * @returns {Promise<[Connection, Hello]>}
   */
  static async open(path, handlers) {
    /** @type {import("node:net").Socket} */
    const socket = await new Promise((resolve, reject) => {
      const socket = createConnection({ path });
      socket.once("connect", () => {
        socket.off("error", reject);
        resolve(socket);
      });
      socket.once("error", (error) => reject(daemonUnavailable(path, error)));
    });
    const connection = new Connection(socket, path, handlers);
    try {
      const reply = await connection.request({ op: "hello", protocol: PROTOCOL_VERSION });
      return [connection, reply.hello];
    } catch (error) {
      socket.destroy();
      throw error;
    }
  }

  /**
   * @param {import("node:net").Socket} socket
   * @param {string} path
   * @param {Handlers} handlers
   */
  constructor(socket, path, { onEvent, onClose, trees }) {
    this.#socket = socket;
    this.#path = path;
    this.#onEvent = onEvent;
    this.#onClose = onClose;
    this.#trees = trees;
    socket.setEncoding("utf8");
    socket.on("data", (/** @type {string} */ chunk) => this.#receive(chunk));
    // A reset or a broken pipe: 'close' follows and says the rest.
    socket.on("error", (/** @type {NodeJS.ErrnoException} */ error) => {
      this.#closeReason ??= connectionLost(path, this.#closing, error.code ?? error.message);
    });
    this.#whenClosed = new Promise((resolve) => socket.once("close", resolve));
    socket.once("close", () => this.#closedNow());
    this.#holdProcess();
  }

  get closed() {
    return this.#closed;
  }

  /**
   * Whether events are read: while they are, the connection keeps the process alive.
   * @param {boolean} listening
   */
  set listening(listening) {
    this.#listening = listening;
    this.#holdProcess();
  }

  /**
   * Refs the socket while a reply is awaited or events are read, and unrefs it otherwise:
   * only then does the lease keep the event loop alive.
   */
  #holdProcess() {
    if (this.#closed) return;
    if (this.#pending.size > 0 || this.#listening || this.#ending) this.#socket.ref();
    else this.#socket.unref();
  }

  /**
   * Sends one request; resolves to the reply's `ok` value, rejects with its error.
   * @param {object} body
   * @returns {Promise<any>} the `ok` of the request's reply (docs/PROTOCOL.md)
   */
  request(body) {
    if (this.#closed) {
      return Promise.reject(this.#closeReason ?? connectionLost(this.#path, this.#closing));
    }
    const id = this.#nextId++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      this.#holdProcess();
      this.#socket.write(`${JSON.stringify({ id, ...body })}\n`);
    });
  }

  /** Closes the connection (which ends the lease) and waits until it is closed. */
  async close() {
    if (!this.#closed) {
      this.#ending = true;
      this.#holdProcess();
      this.#socket.end();
    }
    await this.#whenClosed;
  }

  /** @param {string} chunk */
  #receive(chunk) {
    this.#partial += chunk;
    let newline;
    while ((newline = this.#partial.indexOf("\n")) !== -1) {
      const line = this.#partial.slice(0, newline);
      this.#partial = this.#partial.slice(newline + 1);
      if (line.trim()) this.#line(line);
    }
    if (this.#partial.length > MAX_LINE_CHARS) {
      this.#fail(`a line longer than ${MAX_LINE_CHARS} characters`, this.#partial);
    }
  }

  /** @param {string} line */
  #line(line) {
    let message;
    try {
      message = JSON.parse(line);
    } catch {
      return this.#fail("not JSON", line);
    }
    if (message?.event !== undefined) {
      const { event } = message;
      if (event === null || typeof event !== "object" || typeof event.kind !== "string") {
        return this.#fail("an event without a kind", line);
      }
      if (event.kind === "closing") this.#closing = event.reason ?? null;
      return this.#onEvent(event);
    }
    const waiter = typeof message?.id === "number" ? this.#pending.get(message.id) : undefined;
    if (waiter) {
      if (!("ok" in message) && !message.error) {
        return this.#fail("a reply with no ok nor error", line);
      }
      this.#pending.delete(message.id);
      this.#holdProcess();
      if (message.error) waiter.reject(new LeashError(message.error.code, message.error.message));
      else waiter.resolve(message.ok);
    } else if (message?.error && message.id == null) {
      // The daemon says why before it closes (e.g. too many connections for this uid); a bad
      // line of ours would get the same, but this library sends none.
      this.#closeReason = new LeashError(message.error.code, message.error.message);
    } else {
      this.#fail("a reply to no request of this lease's", line);
    }
  }

  /**
   * Ends the connection, and so the lease, on a line this library does not understand.
   * @param {string} what
   * @param {string} line
   */
  #fail(what, line) {
    this.#closeReason ??= protocolError(this.#path, what, line, this.#trees());
    this.#socket.destroy();
  }

  #closedNow() {
    this.#closed = true;
    const error = this.#closeReason ?? connectionLost(this.#path, this.#closing);
    for (const { reject } of this.#pending.values()) reject(error);
    this.#pending.clear();
    this.#onClose(error);
  }
}
