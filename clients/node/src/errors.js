// The errors a lease raises: LeashError carries the daemon's code and words, so a host can
// branch on `err.code` the way it does on node's own errors.

import { constants } from "node:os";

/** How to get a daemon running: said wherever one could not be reached. */
export const START_THE_DAEMON =
  "start it (sudo systemctl start leash, or sudo leash daemon), or set LEASH_SOCKET " +
  "to the socket of a daemon that runs";

export class LeashError extends Error {
  /**
   * A field rather than set in the constructor, so that its type is the literal index.d.ts
   * declares (a field is set right after super() returns, as the constructor's first line was).
   * @type {"LeashError"}
   */
  name = "LeashError";

  /**
   * @param {import("../index.js").LeashErrorCode} code the daemon's error code
   *   (`permission_denied`, `limit_reached`, `not_found`, ...), or one of this library's:
   *   `unavailable`, `failed`, `closed`, `protocol`
   * @param {string} message
   * @param {{ cause?: unknown }} [options]
   */
  constructor(code, message, options) {
    super(message, options);
    /** @readonly */
    this.code = code;
  }
}

/**
 * No daemon at `socket`: what happened and what to do about it.
 * @param {string} socket
 * @param {NodeJS.ErrnoException} cause
 */
export function daemonUnavailable(socket, cause) {
  const why = cause?.code ?? cause?.message ?? String(cause);
  return new LeashError(
    "unavailable",
    `cannot connect to the leash daemon at ${socket} (${why}): ${START_THE_DAEMON}`,
    { cause },
  );
}

/**
 * Why the daemon ended a connection itself, as its last line (a `closing` event) said:
 * `shutdown` (it stopped and killed every tree), `hand_over` (it stopped and left its trees to
 * the next daemon), `not_reading` (the host left too much unread); null when it said nothing.
 * @typedef {"shutdown" | "hand_over" | "not_reading" | (string & {})} ClosingReason
 */

/** Said by every error of a lost connection: the lease reconnects by itself. */
const RECONNECTS = "the next call connects again, with a new lease";

/**
 * The connection to the daemon ended under a host that still held it: what became of the
 * lease's trees, as far as the daemon said why.
 * @param {string} socket
 * @param {ClosingReason | null} [reason] the daemon's `closing` event, if it sent one
 * @param {string} [detail] what the host saw (ECONNRESET, a shim's refusal)
 */
export function connectionLost(socket, reason = null, detail) {
  const seen = detail ? ` (${detail})` : "";
  switch (reason) {
    case "shutdown":
      return new LeashError(
        "unavailable",
        `the leash daemon at ${socket} stopped (shutdown)${seen}: it killed this lease's ` +
          `trees. ${capitalized(RECONNECTS)}; if no daemon comes back, ${START_THE_DAEMON}`,
      );
    case "hand_over":
      return new LeashError(
        "unavailable",
        `the leash daemon at ${socket} handed its trees over to the next daemon${seen}: they ` +
          `stay enforced (and still die if this host dies); ${RECONNECTS}`,
      );
    case "not_reading":
      return new LeashError(
        "unavailable",
        `the leash daemon at ${socket} ended this lease (not_reading)${seen}: this host left ` +
          "more than 128 KiB of its replies and events unread (was its event loop blocked?), " +
          `so the daemon killed the lease's trees. ${capitalized(RECONNECTS)}`,
      );
    case null:
      return new LeashError(
        "unavailable",
        `the connection to the leash daemon at ${socket} closed without a reason${seen}: ` +
          "the daemon kills a lease's trees when its connection ends, unless it handed them " +
          `over. ${capitalized(RECONNECTS)}; if no daemon comes back, ${START_THE_DAEMON}`,
      );
    default:
      return new LeashError(
        "unavailable",
        `the leash daemon at ${socket} closed the connection for a reason this library does ` +
          `not know (${reason})${seen}: the daemon kills a lease's trees when its connection ` +
          `ends, unless it handed them over. ${capitalized(RECONNECTS)}`,
      );
  }
}

/** @param {string} text */
const capitalized = (text) => text[0].toUpperCase() + text.slice(1);

/** The most of a line an error quotes: as much as the daemon quotes of a refused request. */
export const MAX_QUOTED_BYTES = 200;

/**
 * The first `max` bytes of `line`'s UTF-8, cut at a character's boundary.
 * @param {string} line
 * @param {number} [max]
 */
export function quoted(line, max = MAX_QUOTED_BYTES) {
  const bytes = Buffer.from(line, "utf8");
  if (bytes.length <= max) return line;
  let end = max;
  // Back to the first byte of the character the cut falls in (continuations are 10xxxxxx).
  while (end > 0 && (bytes[end] & 0xc0) === 0x80) end--;
  return `${bytes.subarray(0, end).toString("utf8")}...`;
}

/**
 * The daemon sent a line this library does not understand: the lease ends (fail-safe), and
 * with it, on the daemon's side, the lease's trees.
 * @param {string} socket
 * @param {string} what what the line is (`not JSON`, `a reply to no request`...)
 * @param {string} line
 * @param {number} trees how many trees the lease holds
 */
export function protocolError(socket, what, line, trees) {
  const held = trees === 1 ? "1 tree" : `${trees} trees`;
  return new LeashError(
    "protocol",
    `the leash daemon at ${socket} sent a line this library does not understand (${what}). ` +
      `The lease ends, to be safe: the daemon kills this lease's ${held}, since the lease ` +
      `ended; ${RECONNECTS}. The line: ${quoted(line)}`,
  );
}

/**
 * @typedef {Error & { errno: number | undefined, code: string, syscall: string, path: string,
 *   spawnargs: readonly string[], detail?: string }} ExecError
 */

const ERRNO_NAMES = new Map(Object.entries(constants.errno).map(([name, n]) => [n, name]));

/** What an exec failure means, said after node's own words. */
const EXEC_WORDS = new Map([
  ["ENOENT", "command not found"],
  ["EACCES", "not executable (permission denied)"],
]);

/**
 * The error node's own spawn gives when the program cannot be executed (`spawn prog ENOENT`),
 * from the errno the `leash exec` shim reports: code and syscall as node's, errno negative as
 * libuv's. The message goes on to say it plainly (`spawn prog ENOENT: prog: command not
 * found`), since the shim's report is all the host hears of it.
 * @param {string} file
 * @param {readonly string[]} spawnargs
 * @param {number | null | undefined} errno
 * @param {string} [detail] the shim's words
 */
export function execFailed(file, spawnargs, errno, detail) {
  const code = (errno != null && ERRNO_NAMES.get(errno)) || "UNKNOWN";
  const said = EXEC_WORDS.get(code) ?? detail;
  const error = /** @type {ExecError} */ (
    new Error(`spawn ${file} ${code}${said ? `: ${file}: ${said}` : ""}`)
  );
  error.errno = errno != null ? -errno : undefined;
  error.code = code;
  error.syscall = `spawn ${file}`;
  error.path = file;
  error.spawnargs = spawnargs;
  if (detail) error.detail = detail;
  return error;
}
