// A reader of the daemon's events: an async iterator with a bounded buffer. The daemon never
// waits for a slow subscriber, and neither does this: past the bound, events are counted and
// reported in their place as a `dropped` event, as the daemon itself does.

export const DEFAULT_MAX_BUFFERED = 10_000;

/**
 * @typedef {import("../index.js").LeashEvent} LeashEvent
 * @typedef {IteratorResult<LeashEvent, undefined>} Next
 */

/** @implements {AsyncIterableIterator<LeashEvent, undefined>} */
export class EventReader {
  /** @type {LeashEvent[]} */
  #queue = [];
  #dropped = 0;
  /** @type {number} */
  #max;
  /**
   * A pending next(): [resolve, reject].
   * @type {[(next: Next) => void, (error: unknown) => void] | null}
   */
  #waiter = null;
  #done = false;
  /** @type {unknown} */
  #error = null;
  /** @type {(reader: EventReader) => void} */
  #onReturn;

  /**
   * @param {number} [maxBuffered]
   * @param {(reader: EventReader) => void} [onReturn] called when the reader is returned
   */
  constructor(maxBuffered = DEFAULT_MAX_BUFFERED, onReturn = () => {}) {
    if (!Number.isInteger(maxBuffered) || maxBuffered < 1) {
      throw new RangeError(`maxBuffered must be a whole number, 1 or more: ${maxBuffered}`);
    }
    this.#max = maxBuffered;
    this.#onReturn = onReturn;
  }

  /**
   * An event from the daemon (its keys already in camelCase).
   * @param {LeashEvent} event
   */
  push(event) {
    if (this.#done) return;
    if (this.#waiter) {
      const [resolve] = this.#waiter;
      this.#waiter = null;
      return resolve({ value: event, done: false });
    }
    if (this.#queue.length >= this.#max) {
      this.#dropped += 1;
      return;
    }
    if (this.#dropped) {
      this.#queue.push({ kind: "dropped", tree: 0, lease: 0, count: this.#dropped });
      this.#dropped = 0;
    }
    this.#queue.push(event);
  }

  /**
   * Ends the stream: with `error` after the buffered events, or plainly if none.
   * @param {unknown} [error]
   */
  end(error = null) {
    if (this.#done) return;
    this.#done = true;
    this.#error = error;
    if (this.#waiter) {
      const [resolve, reject] = this.#waiter;
      this.#waiter = null;
      this.#settleEnd(resolve, reject);
    }
  }

  /** @returns {Promise<Next>} */
  next() {
    if (this.#queue.length) {
      const value = /** @type {LeashEvent} */ (this.#queue.shift());
      return Promise.resolve({ value, done: false });
    }
    if (this.#dropped) {
      const count = this.#dropped;
      this.#dropped = 0;
      return Promise.resolve({ value: { kind: "dropped", tree: 0, lease: 0, count }, done: false });
    }
    if (this.#done) return new Promise((resolve, reject) => this.#settleEnd(resolve, reject));
    if (this.#waiter) return Promise.reject(new Error("events(): one next() at a time"));
    return new Promise((resolve, reject) => {
      this.#waiter = [resolve, reject];
    });
  }

  /** @returns {Promise<Next>} */
  return() {
    this.#queue.length = 0;
    this.end();
    this.#onReturn(this);
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  /**
   * @param {(next: Next) => void} resolve
   * @param {(error: unknown) => void} reject
   */
  #settleEnd(resolve, reject) {
    const error = this.#error;
    this.#error = null;
    if (error) reject(error);
    else resolve({ value: undefined, done: true });
  }
}
