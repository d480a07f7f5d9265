// A lease: the host's connection to the daemon. Every tree registered under it is killed when
// the host dies or the connection closes, unless released. Requests go over the connection;
// commands are spawned through the `leash exec` shim with the lease's token.

import { spawn as nodeSpawn } from "node:child_process";
import { camelCase } from "./camel.js";
import { claudeCodeSpawner } from "./claude.js";
import { Connection } from "./connection.js";
import { LeashError, connectionLost, quoted } from "./errors.js";
import { EventReader } from "./events.js";
import { leashBinary, socketPath } from "./locate.js";
import { adoptThroughShim, spawnArguments, spawnLeashed, validGrace } from "./spawn.js";

const noop = () => {};
const CONNECT = Symbol("Lease.connect");

// `await using lease = await Lease.connect()` finds close() by Symbol.asyncDispose, which Node
// has from 18.18 and 20.4 (as Symbol.for("nodejs.asyncDispose")), and Bun has. A library leaves
// the global Symbol alone: on an older runtime close() is keyed by that registered symbol,
// node's own, so a host still reaches it (lease[Symbol.for("nodejs.asyncDispose")]()), and a
// polyfill that defines Symbol.asyncDispose as node does, whenever it runs, makes `await using`
// find it (a polyfill of another symbol must run before this module is imported). The type
// says the runtime's symbol, which it is wherever the runtime has one.
/** @type {typeof Symbol.asyncDispose} */
const asyncDispose = Symbol.asyncDispose ?? Symbol.for("nodejs.asyncDispose");

const closedError = () =>
  new LeashError("closed", "this lease is closed: connect a new one (Lease.connect())");
const unleashedError = () =>
  new LeashError(
    "unavailable",
    "this lease is not on a leash (Lease.connect({ optional: true }) found no daemon): " +
      "it has no trees",
  );
const noTreeError = () =>
  new LeashError(
    "unavailable",
    "treeOfLeashed: this child runs unleashed (Lease.connect({ optional: true }) found no " +
      "daemon), so it has no tree; where running unleashed is expected, use treeOf(child), " +
      "which resolves to null then",
  );

/**
 * @typedef {import("node:child_process").ChildProcess} ChildProcess
 * @typedef {import("../index.js").TreeId} TreeId
 * @typedef {import("../index.js").ConnectOptions} ConnectOptions
 * @typedef {import("../index.js").TreeOptions} TreeOptions
 * @typedef {import("../index.js").LeashSpawnOptions} LeashSpawnOptions
 * @typedef {import("../index.js").KillSummary} KillSummary
 * @typedef {import("../index.js").TreeInfo} TreeInfo
 * @typedef {import("../index.js").EventsOptions} EventsOptions
 * @typedef {import("../index.js").ClaudeCodeSpawnerOptions} ClaudeCodeSpawnerOptions
 * @typedef {import("../index.js").SpawnOptions} SpawnOptions
 * @typedef {import("../index.js").SpawnedProcess} SpawnedProcess
 * @typedef {import("./errors.js").ClosingReason} ClosingReason
 * A tree as the daemon lists it, as far as the lease reads it (docs/PROTOCOL.md).
 * @typedef {{ tree: TreeId, lease: number, host_pid: number }} ListedTree
 * What index.d.ts says a lease is, which this class must be.
 * @typedef {import("../index.js").Lease} DeclaredLease
 */

/** @implements {DeclaredLease} */
export class Lease {
  /** @type {string} */
  #socket;
  /** @type {string | null} */
  #leash = null;
  /** @type {number | undefined} */
  #graceMs;
  #leashed = true;
  /**
   * "open", "closing" (killing its trees) or "closed".
   * @type {"open" | "closing" | "closed"}
   */
  #state = "open";
  /** @type {Promise<void> | null} */
  #closing = null;
  /** @type {Connection | null} */
  #connection = null;
  /** @type {Promise<void> | null} */
  #connecting = null;
  /** @type {string | null} */
  #token = null;
  /** @type {number | null} */
  #id = null;
  /** @type {string | null} */
  #daemonVersion = null;
  /**
   * Trees registered here and not yet released, killed or seen to die with their root.
   * @type {Set<TreeId>}
   */
  #trees = new Set();
  /**
   * child -> Promise of its tree id (null when unleashed).
   * @type {WeakMap<ChildProcess, Promise<TreeId | null>>}
   */
  #registrations = new WeakMap();
  /** @type {Set<EventReader>} */
  #readers = new Set();
  /** @type {Promise<unknown> | null} */
  #subscription = null;
  /**
   * Why the last connection ended, as the daemon said (its `closing` event), for the words of
   * a spawn refused afterwards with the old token.
   * @type {LeashError | null}
   */
  #lostWith = null;
  /**
   * What the daemon's `closing` event said of the current connection, if it sent one.
   * @type {ClosingReason | null}
   */
  #closingReason = null;

  /**
   * Connects to the daemon and opens a lease.
   * @param {ConnectOptions} [options]
   * @returns {Promise<Lease>}
   */
  static async connect(options = {}) {
    const { socket, graceMs, leash, optional = false } = options;
    const lease = new Lease(CONNECT, socketPath(socket), validGrace(graceMs));
    try {
      lease.#leash = leashBinary(leash);
      await lease.#connect();
    } catch (error) {
      if (!optional || !(error instanceof LeashError) || error.code !== "unavailable") throw error;
      process.emitWarning(
        `leash is unavailable, so processes spawned through this lease are NOT on a leash: ` +
          `they can outlive this host. ${error.message}`,
        { type: "LeashWarning", code: "LEASH_UNLEASHED" },
      );
      lease.#leashed = false;
    }
    return lease;
  }

  /**
   * @param {symbol} key
   * @param {string} socket
   * @param {number | undefined} graceMs
   */
  constructor(key, socket, graceMs) {
    if (key !== CONNECT) throw new TypeError("use `await Lease.connect(options)`");
    this.#socket = socket;
    this.#graceMs = graceMs;
  }

  /** False when `optional: true` found no daemon: spawns then run unleashed. */
  get leashed() {
    return this.#leashed;
  }
  /** The lease's id (the daemon's; a new one after a reconnection), or null. */
  get id() {
    return this.#id;
  }
  get socket() {
    return this.#socket;
  }
  /** The absolute path of the `leash` binary spawns go through, or null if none was found. */
  get leash() {
    return this.#leash;
  }
  get daemonVersion() {
    return this.#daemonVersion;
  }

  /**
   * child_process.spawn on the leash: same arguments and result, plus the options `graceMs`
   * and `keepOnRootExit`. A refusal is an 'error' event on the child.
   * @param {string} command
   * @param {readonly string[] | LeashSpawnOptions | null} [args]
   * @param {LeashSpawnOptions} [options]
   * @returns {import("node:child_process").ChildProcessByStdio<any, any, any>} a ChildProcess;
   *   index.d.ts's overloads (node's own) say by `stdio` which of its streams are there
   */
  spawn(command, args, options) {
    [args, options] = spawnArguments(args, options);
    if (this.#state !== "open") throw closedError();
    const { graceMs, keepOnRootExit, ...nodeOptions } = options;
    validGrace(graceMs);
    if (!this.#leashed) {
      const child = nodeSpawn(command, args, nodeOptions);
      this.#registrations.set(child, Promise.resolve(null));
      return child;
    }
    // After a lost connection, this spawn fails (its token is gone); the next one finds the
    // lease reconnected.
    if (!this.#connection) this.#connected().catch(noop);
    const token = this.#token;
    const { child, registration } = spawnLeashed(
      {
        // Found at connect, or the lease would not be leashed.
        leash: /** @type {string} */ (this.#leash),
        socket: this.#socket,
        token,
        refusal: (code, message) => this.#refusal(token, code, message),
      },
      command,
      args,
      { ...options, graceMs: graceMs ?? this.#graceMs },
    );
    /** @type {TreeId | null} */
    let tree = null;
    let rootExited = false;
    child.once("exit", () => {
      rootExited = true;
      // The daemon kills the rest of the tree with its root: nothing left to kill at close.
      if (tree !== null && !keepOnRootExit) this.#trees.delete(tree);
    });
    const treeId = registration.then((registered) => {
      tree = registered.tree;
      if (keepOnRootExit || !rootExited) this.#trees.add(tree);
      return tree;
    });
    treeId.catch(noop);
    this.#registrations.set(child, treeId);
    return child;
  }

  /**
   * The tree id of a child this lease spawned (null when unleashed); rejects as it failed.
   * @param {ChildProcess} child
   * @returns {Promise<TreeId | null>}
   */
  treeOf(child) {
    return (
      this.#registrations.get(child) ??
      Promise.reject(new TypeError("treeOf: this child was not spawned by this lease"))
    );
  }

  /**
   * The tree id of a child this lease spawned; rejects if the lease is unleashed (the child
   * then has no tree) or as the spawn failed.
   * @param {ChildProcess} child
   * @returns {Promise<TreeId>}
   */
  async treeOfLeashed(child) {
    const tree = await this.treeOf(child);
    if (tree === null) throw noTreeError();
    return tree;
  }

  /**
   * Registers a running process, with the descendants it has, as the root of a new tree. The
   * process is named to the daemon by a pidfd, through the `leash adopt` shim: right in a
   * container's pid namespace too.
   * @param {number} pid
   * @param {TreeOptions} [options]
   * @returns {Promise<TreeId | null>}
   */
  async adopt(pid, options = {}) {
    if (!this.#leashed) return null;
    const graceMs = validGrace(options.graceMs) ?? this.#graceMs;
    // The token of the lease as it is now (a new one after a reconnection).
    await this.#connected();
    const token = this.#token;
    const { tree } = await adoptThroughShim(
      {
        leash: /** @type {string} */ (this.#leash),
        socket: this.#socket,
        token,
        refusal: (code, message) => this.#refusal(token, code, message),
      },
      pid,
      { graceMs, keepOnRootExit: options.keepOnRootExit },
    );
    this.#trees.add(tree);
    return tree;
  }

  /**
   * Kills a tree; resolves, with the daemon's summary, once it is empty.
   * @param {TreeId} tree
   * @param {{ graceMs?: number }} [options]
   * @returns {Promise<KillSummary>}
   */
  async kill(tree, options = {}) {
    const grace = validGrace(options.graceMs);
    /** @type {{ op: "kill", tree: TreeId, grace_ms?: number }} */
    const request = { op: "kill", tree };
    if (grace !== undefined) request.grace_ms = grace;
    const reply = await this.#request(request);
    this.#trees.delete(tree);
    return camelCase(reply.killed);
  }

  /**
   * Stops enforcing a tree: it is left alone from now on, even when this lease ends.
   * @param {TreeId} tree
   * @returns {Promise<void>}
   */
  async release(tree) {
    await this.#request({ op: "release", tree });
    this.#trees.delete(tree);
  }

  /**
   * This lease's trees, with their members, as the daemon lists them.
   * @returns {Promise<TreeInfo[]>}
   */
  async trees() {
    if (!this.#leashed) return [];
    /** @type {{ trees: ListedTree[] }} */
    const reply = await this.#request({ op: "list" });
    const mine = reply.trees.filter((t) => this.#isMine(t));
    // Forget the trees that are gone (an adopted root exited, a kept tree emptied).
    const listed = new Set(mine.map((t) => t.tree));
    for (const tree of this.#trees) if (!listed.has(tree)) this.#trees.delete(tree);
    return camelCase(mine);
  }

  /**
   * The daemon's events for the trees this host may see, as an async iterable (subscribes on
   * first use). At most `maxBuffered` wait unread; past that they are counted in a `dropped`
   * event. A lost connection ends it with the error.
   * @param {EventsOptions} [options]
   * @returns {EventReader}
   */
  events(options = {}) {
    const reader = new EventReader(options.maxBuffered, (r) => this.#dropReader(r));
    if (!this.#leashed || this.#state !== "open") {
      reader.end();
      return reader;
    }
    this.#readers.add(reader);
    this.#listen();
    this.#subscription ??= this.#request({ op: "subscribe" });
    this.#subscription.catch((error) => {
      this.#subscription = null;
      this.#dropReader(reader);
      reader.end(error);
    });
    return reader;
  }

  /** @param {EventReader} reader */
  #dropReader(reader) {
    this.#readers.delete(reader);
    this.#listen();
  }

  /** While events are read, the connection keeps the process alive; otherwise it does not. */
  #listen() {
    if (this.#connection) this.#connection.listening = this.#readers.size > 0;
  }

  /**
   * Kills every tree of this lease that was not released (with `graceMs`, else each tree's
   * own), waits until they are empty, then closes the connection (which ends the lease).
   * @param {{ graceMs?: number }} [options]
   * @returns {Promise<void>}
   */
  async close(options = {}) {
    const grace = validGrace(options.graceMs);
    this.#closing ??= this.#close(grace);
    return this.#closing;
  }

  /**
   * `await using lease = await Lease.connect()`: close() at the end of the scope. (There is no
   * Symbol.dispose: closing kills trees and waits until they are empty, which a synchronous
   * `using` could not wait for.)
   * @returns {Promise<void>}
   */
  [asyncDispose]() {
    return this.close();
  }

  /**
   * A function for the Claude Agent SDK's `spawnClaudeCodeProcess` option.
   * @param {ClaudeCodeSpawnerOptions} [options]
   * @returns {(options: SpawnOptions) => ChildProcess & SpawnedProcess}
   */
  claudeCodeSpawner(options = {}) {
    return claudeCodeSpawner(this, options);
  }

  /** @param {number | undefined} grace */
  async #close(grace) {
    if (this.#state !== "open") return;
    this.#state = "closing";
    /** @type {unknown[]} */
    const failures = [];
    try {
      if (this.#leashed && (this.#connection || this.#trees.size)) {
        const connection = await this.#connected();
        /** @type {{ trees: ListedTree[] }} */
        const { trees } = await connection.request({ op: "list" });
        const doomed = new Set(trees.filter((t) => this.#isMine(t)).map((t) => t.tree));
        const kill = (/** @type {TreeId} */ tree) => ({
          op: "kill",
          tree,
          ...(grace !== undefined && { grace_ms: grace }),
        });
        const kills = [...doomed].map((tree) => connection.request(kill(tree)));
        for (const result of await Promise.allSettled(kills)) {
          if (result.status === "rejected" && result.reason?.code !== "not_found") {
            failures.push(result.reason);
          }
        }
        this.#trees.clear();
      }
    } catch (error) {
      failures.push(error);
    } finally {
      this.#state = "closed";
      await this.#connection?.close();
      for (const reader of this.#readers) reader.end();
      this.#readers.clear();
      this.#listen();
    }
    if (failures.length) throw failures[0];
  }

  /**
   * Whether a listed tree is this lease's: registered under this connection, or before a
   * reconnection by this host (the daemon that took over holds those under a lease of its
   * own, with this process as host; ids of leases are a daemon's, not kept across daemons).
   * @param {ListedTree} tree
   */
  #isMine(tree) {
    return (
      tree.lease === this.#id || (this.#trees.has(tree.tree) && tree.host_pid === process.pid)
    );
  }

  /**
   * @param {object} body
   * @returns {Promise<any>} the reply's `ok`
   */
  async #request(body) {
    const connection = await this.#connected();
    return connection.request(body);
  }

  /**
   * The connection, reconnecting (a new lease) if it was lost.
   * @returns {Promise<Connection>}
   */
  async #connected() {
    if (this.#state === "closed") throw closedError();
    if (!this.#leashed) throw unleashedError();
    if (this.#connection) return this.#connection;
    this.#connecting ??= this.#connect().finally(() => {
      this.#connecting = null;
    });
    await this.#connecting;
    return this.#connection ?? Promise.reject(this.#lostWith ?? connectionLost(this.#socket));
  }

  async #connect() {
    /** @type {{ connection: Connection | null }} */
    const state = { connection: null };
    const [connection, hello] = await Connection.open(this.#socket, {
      onEvent: (event) => this.#event(event),
      onClose: (error) => this.#lost(state, error),
      trees: () => this.#trees.size,
    });
    state.connection = connection;
    if (this.#state === "closed") {
      await connection.close();
      throw closedError();
    }
    this.#connection = connection;
    this.#lostWith = null;
    this.#listen();
    this.#token = hello.lease.token;
    this.#id = hello.lease.id;
    this.#daemonVersion = hello.daemon_version;
  }

  /**
   * @param {{ connection: Connection | null }} state
   * @param {LeashError} error
   */
  #lost(state, error) {
    if (state.connection === null || this.#connection !== state.connection) return;
    this.#connection = null;
    this.#subscription = null;
    this.#lostWith = error;
    // Killed with the connection: none is left for close() to kill, and the ids are free for
    // the next daemon to give out again.
    if (this.#closingReason === "shutdown" || this.#closingReason === "not_reading") {
      this.#trees.clear();
    }
    this.#closingReason = null;
    for (const reader of this.#readers) reader.end(this.#state === "open" ? error : null);
    this.#readers.clear();
  }

  /** @param {Record<string, unknown>} event */
  #event(event) {
    if (event.kind === "refused") warnRefused(event);
    if (event.kind === "closing") {
      this.#closingReason = /** @type {{ reason?: ClosingReason }} */ (event).reason ?? null;
    }
    const converted = camelCase(event);
    for (const reader of this.#readers) reader.push(converted);
  }

  /**
   * A refusal reported by the shim, as an error; one due to a lost connection says so.
   * @param {string | null} token
   * @param {string} code
   * @param {string} message
   */
  #refusal(token, code, message) {
    const stale = token !== this.#token || !this.#connection;
    if (stale && ["not_found", "unavailable", "failed"].includes(code)) {
      return new LeashError(
        "unavailable",
        `${(this.#lostWith ?? connectionLost(this.#socket)).message} (this spawn: ${code}: ` +
          `${message})`,
      );
    }
    return new LeashError(code, message);
  }
}

/**
 * The daemon refused a request that another process sent on this lease's connection (one
 * that holds the socket: a child that inherited it, or one it was passed to). The lease goes
 * on; the host hears of it, as of other warnings, through process.emitWarning.
 * @param {{ pid?: unknown, code?: unknown, line?: unknown }} event
 */
function warnRefused({ pid, code, line }) {
  const who =
    typeof pid === "number" && pid > 0 ? `process ${pid}` : "a process this host cannot see";
  process.emitWarning(
    `the leash daemon refused a request that ${who} sent on this lease's connection ` +
      `(${code}); the lease goes on. The request: ${quoted(String(line ?? ""))}`,
    { type: "LeashWarning", code: "LEASH_REFUSED" },
  );
}
