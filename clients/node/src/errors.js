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
 * The connection to the daemon ended under a host that still held it.
 * @param {string} socket
 * @param {string} [detail]
 */
export function connectionLost(socket, detail) {
  return new LeashError(
    "unavailable",
    `lost the connection to the leash daemon at ${socket}${detail ? ` (${detail})` : ""}: ` +
      "the daemon stopped, restarted or handed over. The trees already registered stay " +
      "enforced by the daemon that takes over (and die if this host dies); the next call " +
      `reconnects with a new lease. If no daemon comes back, ${START_THE_DAEMON}`,
  );
}

/**
 * @typedef {Error & { errno: number | undefined, code: string, syscall: string, path: string,
 *   spawnargs: readonly string[], detail?: string }} ExecError
 */

const ERRNO_NAMES = new Map(Object.entries(constants.errno).map(([name, n]) => [n, name]));

/**
 * The error node's own spawn gives when the program cannot be executed (`spawn prog ENOENT`),
 * from the errno the `leash exec` shim reports: code and syscall as node's, errno negative as
 * libuv's.
 * @param {string} file
 * @param {readonly string[]} spawnargs
 * @param {number | null | undefined} errno
 * @param {string} [detail]
 */
export function execFailed(file, spawnargs, errno, detail) {
  const code = (errno != null && ERRNO_NAMES.get(errno)) || "UNKNOWN";
  const error = /** @type {ExecError} */ (new Error(`spawn ${file} ${code}`));
  error.errno = errno != null ? -errno : undefined;
  error.code = code;
  error.syscall = `spawn ${file}`;
  error.path = file;
  error.spawnargs = spawnargs;
  if (detail) error.detail = detail;
  return error;
}
