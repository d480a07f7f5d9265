// child_process.spawn through the `leash exec` shim: the shim registers itself under the
// host's lease and execs the command, so the command's pid is the shim's and it is on the
// leash before it runs a single instruction. The lease token goes to the shim on a descriptor
// of its own, never on argv or in the environment; the shim reports on another descriptor.

import { spawn as nodeSpawn } from "node:child_process";
import { LeashError, execFailed } from "./errors.js";
import { holdLifecycle } from "./lifecycle.js";
import { outcomeOf, readReport } from "./status.js";

const noop = () => {};

/**
 * @typedef {import("node:child_process").ChildProcess} ChildProcess
 * @typedef {import("node:stream").Readable} Readable
 * @typedef {import("node:stream").Writable} Writable
 * @typedef {import("../index.js").LeashSpawnOptions} LeashSpawnOptions
 * @typedef {import("../index.js").TreeOptions} TreeOptions
 * @typedef {import("./status.js").Outcome} Outcome
 * @typedef {ReturnType<typeof holdLifecycle>} Lifecycle
 * @typedef {{ tree: number, root: number }} Registered
 * @typedef {Exclude<import("node:child_process").StdioOptions, string>[number]} StdioEntry
 */

/**
 * What the shims need of the lease: the binary, the daemon's socket, the lease token, and how
 * to turn a refusal into an error.
 * @typedef {{ leash: string, socket: string, token: string | null,
 *   refusal: (code: string, message: string) => Error }} Shim
 */

/**
 * child_process.spawn's arguments as node reads them: (command, [args], [options]).
 * @param {readonly string[] | LeashSpawnOptions | null} [args]
 * @param {LeashSpawnOptions} [options]
 * @returns {[string[], LeashSpawnOptions]}
 */
export function spawnArguments(args, options) {
  // (Array.isArray does not tell a readonly array apart to the checker.)
  if (args != null && !Array.isArray(args)) return [[], /** @type {LeashSpawnOptions} */ (args)];
  return [args ? [...args] : [], options ?? {}];
}

/**
 * The `stdio` option as an array of at least 3 entries, as node expands it.
 * @param {import("node:child_process").StdioOptions} [stdio]
 * @returns {StdioEntry[]}
 */
export function stdioEntries(stdio = "pipe") {
  if (typeof stdio === "string") {
    const entry = stdio === "overlapped" ? "pipe" : stdio;
    return [entry, entry, entry];
  }
  if (!Array.isArray(stdio)) {
    throw new TypeError(`The "options.stdio" property must be a string or an array: ${stdio}`);
  }
  const entries = [...stdio];
  while (entries.length < 3) entries.push(undefined);
  return entries.map((entry, i) => entry ?? (i < 3 ? "pipe" : "ignore"));
}

/**
 * The program and its arguments, with `shell` applied as node applies it.
 * @param {string} command
 * @param {readonly string[]} args
 * @param {boolean | string} [shell]
 * @returns {[string, readonly string[]]}
 */
export function shellApplied(command, args, shell) {
  if (!shell) return [command, args];
  const line = [command, ...args].join(" ");
  return [typeof shell === "string" ? shell : "/bin/sh", ["-c", line]];
}

/** The longest grace the daemon accepts (docs/PROTOCOL.md, `grace_ms`): 10 minutes. */
export const MAX_GRACE_MS = 600_000;

/**
 * A grace period in milliseconds, checked where the host gives it (the daemon would refuse it
 * only at the first spawn or kill that sends it).
 * @param {unknown} graceMs
 * @returns {number | undefined}
 */
export function validGrace(graceMs, what = "graceMs") {
  if (graceMs == null) return undefined;
  const range = `a whole number of milliseconds from 0 to ${MAX_GRACE_MS} (10 minutes)`;
  if (typeof graceMs !== "number") {
    throw new TypeError(`${what} must be ${range}, not a ${typeof graceMs}: ${String(graceMs)}`);
  }
  if (!Number.isInteger(graceMs) || graceMs < 0 || graceMs > MAX_GRACE_MS) {
    throw new RangeError(`${what} must be ${range}: ${graceMs}`);
  }
  return graceMs;
}

/**
 * Spawns `command` on the leash.
 * @param {Shim} shim
 * @param {string} command
 * @param {readonly string[]} args
 * @param {LeashSpawnOptions} options
 * @returns {{ child: ChildProcess, registration: Promise<Registered> }}
 */
export function spawnLeashed(shim, command, args, options) {
  const { graceMs, keepOnRootExit, argv0, shell, stdio, ...nodeOptions } = options;
  const grace = validGrace(graceMs);
  const [file, fileArgs] = shellApplied(command, args, shell);
  /** @type {StdioEntry[]} */
  const entries = [...stdioEntries(stdio), "pipe", "pipe"];
  const leaseFd = entries.length - 2;
  const statusFd = entries.length - 1;
  const shimArgs = ["--socket", shim.socket, "exec", "--lease-fd", `${leaseFd}`];
  shimArgs.push("--status-fd", `${statusFd}`);
  if (typeof argv0 === "string") shimArgs.push("--argv0", argv0);
  if (grace !== undefined) shimArgs.push("--grace", `${grace}ms`);
  if (keepOnRootExit) shimArgs.push("--keep-on-root-exit");
  shimArgs.push("--", file, ...fileArgs);

  const child = nodeSpawn(shim.leash, shimArgs, { ...nodeOptions, stdio: entries });
  const tokenStream = /** @type {Writable | null | undefined} */ (child.stdio[leaseFd]);
  const statusStream = /** @type {Readable | null | undefined} */ (child.stdio[statusFd]);
  // The host sees the stdio it asked for; these two are the shim's business.
  /** @type {unknown[]} */ (child.stdio).length = leaseFd;
  const done = () => {
    tokenStream?.destroy();
    statusStream?.destroy();
  };

  /** @type {Promise<Registered>} */
  let registration;
  if (!child.pid || !tokenStream || !statusStream) {
    // The shim itself could not be started (node emits its own 'error', e.g. ENOENT for a
    // leash binary removed since connect).
    done();
    registration = new Promise((_, reject) => child.once("error", reject));
  } else {
    const lifecycle = holdLifecycle(child);
    tokenStream.on("error", noop);
    tokenStream.end(`${shim.token}\n`);
    registration = readReport(statusStream).then(async (lines) => {
      done();
      const outcome = outcomeOf(lines);
      if (outcome.kind === "running") {
        lifecycle.run();
        return { tree: outcome.tree, root: outcome.root };
      }
      if (outcome.kind === "silent" && (child.killed || options.signal?.aborted)) {
        // Stopped by the host (kill(), signal, timeout) before the shim could register it:
        // what the host did, not a failure to report.
        lifecycle.run();
        throw new LeashError("failed", "the command was stopped before it was registered");
      }
      const error = await failure(outcome, lifecycle, shim, file, fileArgs);
      lifecycle.fail(error);
      throw error;
    });
  }
  registration.catch(noop);
  return { child, registration };
}

/**
 * @param {Outcome} outcome
 * @param {Lifecycle} lifecycle
 * @param {Shim} shim
 * @param {string} file
 * @param {readonly string[]} fileArgs
 * @returns {Promise<Error>}
 */
async function failure(outcome, lifecycle, shim, file, fileArgs) {
  switch (outcome.kind) {
    case "exec_failed":
      return execFailed(file, fileArgs, outcome.errno, outcome.message);
    case "refused":
      return shim.refusal(outcome.code, outcome.message);
    case "unreadable":
      return new LeashError(
        "failed",
        `leash exec (${shim.leash}) reported something unexpected: ${outcome.line}`,
      );
    default: {
      const [code, signal] = await lifecycle.exit;
      return new LeashError(
        "failed",
        `leash exec (${shim.leash}) ended (${signal ? `signal ${signal}` : `exit code ${code}`}) ` +
          "before saying whether the command was registered, so the command did not run; " +
          "its standard error may say why (a leash older than `exec --status-fd` exits 2)",
      );
    }
  }
}

/** The most of the adopt shim's standard error kept for an error message. */
const MAX_STDERR_CHARS = 4096;

/**
 * Registers the running process `pid` (a number of this process's pid namespace), with its
 * descendants, under the lease, through the `leash adopt` shim: the shim names the process to
 * the daemon by a pidfd, which is right in a container's pid namespace as a bare pid is not
 * (node cannot send a descriptor over a Unix socket itself). The token goes on a descriptor,
 * as for a spawn.
 * @param {Shim} shim as for spawnLeashed
 * @param {number} pid
 * @param {TreeOptions} options
 * @returns {Promise<Registered>}
 */
export async function adoptThroughShim(shim, pid, options) {
  if (!Number.isSafeInteger(pid) || pid <= 0) {
    throw new RangeError(`adopt: pid must be a whole number above 0: ${pid}`);
  }
  const grace = validGrace(options.graceMs);
  const shimArgs = ["--socket", shim.socket, "adopt", "--lease-fd", "3", "--status-fd", "4"];
  if (grace !== undefined) shimArgs.push("--grace", `${grace}ms`);
  if (options.keepOnRootExit) shimArgs.push("--keep-on-root-exit");
  shimArgs.push("--", `${pid}`);
  const child = nodeSpawn(shim.leash, shimArgs, {
    stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"],
  });
  /** @type {Promise<{ error?: Error, code?: number | null, signal?: NodeJS.Signals | null }>} */
  const ended = new Promise((resolve) => {
    child.once("error", (error) => resolve({ error }));
    child.once("close", (code, signal) => resolve({ code, signal }));
  });
  // Pipes, all three, when the shim started.
  const [, , stderr, tokenStream, statusStream] =
    /** @type {[unknown, unknown, Readable, Writable | undefined, Readable | undefined]} */ (
      child.stdio
    );
  if (!child.pid || !tokenStream || !statusStream) {
    const { error } = await ended;
    throw new LeashError("failed", `starting leash adopt (${shim.leash}): ${error?.message}`);
  }
  let said = "";
  stderr.setEncoding("utf8");
  stderr.on("data", (chunk) => {
    if (said.length < MAX_STDERR_CHARS) said += chunk;
  });
  tokenStream.on("error", noop);
  tokenStream.end(`${shim.token}\n`);
  const outcome = outcomeOf(await readReport(statusStream));
  const { code, signal } = await ended;
  if (outcome.kind === "running") return { tree: outcome.tree, root: outcome.root };
  if (outcome.kind === "refused") throw shim.refusal(outcome.code, outcome.message);
  const how = signal ? `signal ${signal}` : `exit code ${code}`;
  throw new LeashError(
    "failed",
    `leash adopt (${shim.leash}) ended (${how}) without saying whether ${pid} was registered ` +
      `(a leash older than \`adopt\` exits 2): ${said.trim()}`,
  );
}
