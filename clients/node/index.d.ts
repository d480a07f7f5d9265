// Type declarations of leash-client (src/index.js). Results and events carry the daemon's
// fields (docs/PROTOCOL.md) with their keys in camelCase.

import type {
  ChildProcess,
  ChildProcessByStdio,
  ChildProcessWithoutNullStreams,
  SpawnOptions as NodeSpawnOptions,
  SpawnOptionsWithStdioTuple,
  SpawnOptionsWithoutStdio,
  StdioNull,
  StdioPipe,
} from "node:child_process";
import type { Readable, Writable } from "node:stream";

/** The socket used when neither the `socket` option nor LEASH_SOCKET names one. */
export declare const DEFAULT_SOCKET: "/run/leash/leash.sock";
/** The protocol version this library speaks. */
export declare const PROTOCOL_VERSION: 1;

/**
 * `unavailable`: no daemon, no `leash` binary, or the connection was lost (the message says
 * what to do); `permission_denied`, `limit_reached`, `not_found`, `bad_request`, `too_long`,
 * `unsupported_version`, `kill_failed`, `internal`: the daemon's codes; `failed`: the shim
 * failed otherwise; `closed`: the lease is closed; `protocol`: the daemon sent a line this
 * library does not understand (the lease ends: the daemon kills its trees).
 */
export type LeashErrorCode =
  | "unavailable"
  | "permission_denied"
  | "limit_reached"
  | "not_found"
  | "bad_request"
  | "too_long"
  | "unsupported_version"
  | "kill_failed"
  | "internal"
  | "failed"
  | "closed"
  | "protocol"
  | (string & {});

export declare class LeashError extends Error {
  constructor(code: LeashErrorCode, message: string, options?: { cause?: unknown });
  readonly name: "LeashError";
  readonly code: LeashErrorCode;
}

export type TreeId = number;

export interface ConnectOptions {
  /** The daemon's socket; else LEASH_SOCKET, else /run/leash/leash.sock. */
  socket?: string;
  /**
   * Default time, in milliseconds, between SIGTERM and SIGKILL when a tree of this lease is
   * killed: a whole number from 0 to 600000 (10 minutes), else connect() rejects with a
   * RangeError. The daemon's default, 2000, if absent.
   */
  graceMs?: number;
  /**
   * The `leash` binary; else LEASH_BIN, else the one the platform package carries
   * (`leash-client-linux-x64` or `-arm64`, an optional dependency of a released leash-client),
   * else `leash` on PATH.
   */
  leash?: string;
  /**
   * When the daemon or the binary is unavailable, warn (a `LeashWarning`) and spawn unleashed
   * instead of rejecting: `leashed` is then false and `treeOf` resolves to null (and
   * `treeOfLeashed` rejects).
   */
  optional?: boolean;
}

export interface TreeOptions {
  /**
   * Milliseconds between SIGTERM and SIGKILL when the tree is killed, 0 to 600000 (the
   * lease's default if absent); another value throws a RangeError.
   */
  graceMs?: number;
  /** When the root exits, leave the rest of the tree running (it still dies with the lease). */
  keepOnRootExit?: boolean;
}

/** child_process.spawn's options, and the tree's. */
export interface LeashSpawnOptions extends NodeSpawnOptions, TreeOptions {}
/** Options without `stdio` (so every stream is a pipe), and the tree's. */
export interface LeashSpawnOptionsWithoutStdio extends SpawnOptionsWithoutStdio, TreeOptions {}
/** Options whose `stdio` says, entry by entry, which streams are pipes; and the tree's. */
export type LeashSpawnOptionsWithStdioTuple<
  Stdin extends StdioNull | StdioPipe,
  Stdout extends StdioNull | StdioPipe,
  Stderr extends StdioNull | StdioPipe,
> = SpawnOptionsWithStdioTuple<Stdin, Stdout, Stderr> & TreeOptions;

export interface KillSummary {
  tree: TreeId;
  /** Members sent SIGTERM. */
  terminated: number;
  /** SIGKILLs sent, over all rounds. */
  killed: number;
  rounds: number;
  /** From the start of the kill to an empty tree. */
  elapsedMs: number;
  reason:
    | "request"
    | "root_exited"
    | "lease_ended"
    | "untrackable"
    | "member_quota"
    | "enclosing_killed"
    | "shutdown"
    | "resumed"
    | (string & {});
}

export interface MemberInfo {
  pid: number;
  parent: number;
  startNs: number;
  /** What it runs now; null if it is gone. */
  comm: string | null;
}

export interface TreeInfo {
  tree: TreeId;
  lease: number;
  ownerUid: number;
  root: number;
  onRootExit: "kill" | "keep";
  graceMs: number;
  hostPid: number;
  hostComm: string | null;
  rootExited: boolean;
  state: "live" | "killing" | "unkillable" | (string & {});
  nestedIn?: TreeId;
  memberCount: number;
  membersTruncated?: boolean;
  members: MemberInfo[];
}

export interface LeashEvent {
  kind:
    | "registered"
    | "root_exited"
    | "kill_started"
    | "tree_empty"
    | "kill_failed"
    | "released"
    | "fork"
    | "exec"
    | "exit"
    | "dropped"
    | "closing"
    | "refused"
    | (string & {});
  tree: TreeId;
  lease: number;
  /**
   * The process the event is about; for `refused`, the one that sent the request (0 if this
   * host cannot see it).
   */
  pid?: number;
  parent?: number;
  comm?: string;
  /**
   * For `closing` (the daemon's last line before it closes the connection): `shutdown`,
   * `hand_over` or `not_reading`.
   */
  reason?: string;
  /** For `refused`: the error code that refused it. */
  code?: string;
  /** For `refused`: the request line, at most its first 200 bytes. */
  line?: string;
  /** For `tree_empty` after a kill. */
  kill?: KillSummary;
  /** For `dropped`: how many events were lost there. */
  count?: number;
}

export interface EventsOptions {
  /** Events kept unread at most before they are counted as `dropped` (default 10000). */
  maxBuffered?: number;
}

/** What the Claude Agent SDK passes to `spawnClaudeCodeProcess`. */
export interface SpawnOptions {
  command: string;
  args: string[];
  cwd?: string;
  env: { [name: string]: string | undefined };
  signal: AbortSignal;
}

/** What the Claude Agent SDK expects back (a ChildProcess is one). */
export interface SpawnedProcess {
  stdin: Writable;
  stdout: Readable;
  readonly killed: boolean;
  readonly exitCode: number | null;
  readonly signalCode?: NodeJS.Signals | null;
  kill(signal: NodeJS.Signals): boolean;
  on(event: "exit", listener: (code: number | null, signal: NodeJS.Signals | null) => void): void;
  on(event: "error", listener: (error: Error) => void): void;
  once(event: "exit", listener: (code: number | null, signal: NodeJS.Signals | null) => void): void;
  once(event: "error", listener: (error: Error) => void): void;
  off(event: "exit", listener: (code: number | null, signal: NodeJS.Signals | null) => void): void;
  off(event: "error", listener: (error: Error) => void): void;
}

export interface ClaudeCodeSpawnerOptions extends TreeOptions {
  /**
   * Claude Code's stderr: a stdio value ("inherit", the default, "ignore", "pipe", a stream or
   * a descriptor), or a function that receives it as text. Give it here: the SDK ignores
   * query()'s own `stderr` option once a custom spawner is used.
   */
  stderr?: "inherit" | "ignore" | "pipe" | number | Readable | Writable | ((text: string) => void);
  /** Called once Claude Code is on the leash (tree null when the lease is unleashed). */
  onTree?: (tree: TreeId | null, child: ChildProcess) => void;
}

export declare class Lease {
  private constructor();
  /** Connects to the daemon and opens a lease (this connection). */
  static connect(options?: ConnectOptions): Promise<Lease>;
  /** False when `optional: true` found no daemon or binary: spawns run unleashed. */
  readonly leashed: boolean;
  /** The daemon's id of this lease (a new one after a reconnection); null when unleashed. */
  readonly id: number | null;
  readonly socket: string;
  /** The absolute path of the `leash` binary spawns run through; null if none was found. */
  readonly leash: string | null;
  readonly daemonVersion: string | null;
  /**
   * child_process.spawn on the leash. Returns at once; the command's pid is `child.pid`. A
   * refused registration is an 'error' event with a LeashError, an exec failure an 'error'
   * like node's (code ENOENT...), either before 'close' and with no 'exit'. Overloaded as
   * node's own: by `stdio`, the streams that are pipes are not null.
   */
  spawn(command: string, options?: LeashSpawnOptionsWithoutStdio): ChildProcessWithoutNullStreams;
  spawn(
    command: string,
    options: LeashSpawnOptionsWithStdioTuple<StdioPipe, StdioPipe, StdioPipe>,
  ): ChildProcessByStdio<Writable, Readable, Readable>;
  spawn(
    command: string,
    options: LeashSpawnOptionsWithStdioTuple<StdioPipe, StdioPipe, StdioNull>,
  ): ChildProcessByStdio<Writable, Readable, null>;
  spawn(
    command: string,
    options: LeashSpawnOptionsWithStdioTuple<StdioPipe, StdioNull, StdioPipe>,
  ): ChildProcessByStdio<Writable, null, Readable>;
  spawn(
    command: string,
    options: LeashSpawnOptionsWithStdioTuple<StdioNull, StdioPipe, StdioPipe>,
  ): ChildProcessByStdio<null, Readable, Readable>;
  spawn(
    command: string,
    options: LeashSpawnOptionsWithStdioTuple<StdioPipe, StdioNull, StdioNull>,
  ): ChildProcessByStdio<Writable, null, null>;
  spawn(
    command: string,
    options: LeashSpawnOptionsWithStdioTuple<StdioNull, StdioPipe, StdioNull>,
  ): ChildProcessByStdio<null, Readable, null>;
  spawn(
    command: string,
    options: LeashSpawnOptionsWithStdioTuple<StdioNull, StdioNull, StdioPipe>,
  ): ChildProcessByStdio<null, null, Readable>;
  spawn(
    command: string,
    options: LeashSpawnOptionsWithStdioTuple<StdioNull, StdioNull, StdioNull>,
  ): ChildProcessByStdio<null, null, null>;
  spawn(command: string, options: LeashSpawnOptions): ChildProcess;
  spawn(
    command: string,
    args?: readonly string[],
    options?: LeashSpawnOptionsWithoutStdio,
  ): ChildProcessWithoutNullStreams;
  spawn(
    command: string,
    args: readonly string[],
    options: LeashSpawnOptionsWithStdioTuple<StdioPipe, StdioPipe, StdioPipe>,
  ): ChildProcessByStdio<Writable, Readable, Readable>;
  spawn(
    command: string,
    args: readonly string[],
    options: LeashSpawnOptionsWithStdioTuple<StdioPipe, StdioPipe, StdioNull>,
  ): ChildProcessByStdio<Writable, Readable, null>;
  spawn(
    command: string,
    args: readonly string[],
    options: LeashSpawnOptionsWithStdioTuple<StdioPipe, StdioNull, StdioPipe>,
  ): ChildProcessByStdio<Writable, null, Readable>;
  spawn(
    command: string,
    args: readonly string[],
    options: LeashSpawnOptionsWithStdioTuple<StdioNull, StdioPipe, StdioPipe>,
  ): ChildProcessByStdio<null, Readable, Readable>;
  spawn(
    command: string,
    args: readonly string[],
    options: LeashSpawnOptionsWithStdioTuple<StdioPipe, StdioNull, StdioNull>,
  ): ChildProcessByStdio<Writable, null, null>;
  spawn(
    command: string,
    args: readonly string[],
    options: LeashSpawnOptionsWithStdioTuple<StdioNull, StdioPipe, StdioNull>,
  ): ChildProcessByStdio<null, Readable, null>;
  spawn(
    command: string,
    args: readonly string[],
    options: LeashSpawnOptionsWithStdioTuple<StdioNull, StdioNull, StdioPipe>,
  ): ChildProcessByStdio<null, null, Readable>;
  spawn(
    command: string,
    args: readonly string[],
    options: LeashSpawnOptionsWithStdioTuple<StdioNull, StdioNull, StdioNull>,
  ): ChildProcessByStdio<null, null, null>;
  spawn(command: string, args: readonly string[], options: LeashSpawnOptions): ChildProcess;
  /**
   * The tree of a child spawned by this lease, or null when the lease is unleashed
   * (`optional: true`); rejects with the error the child emitted.
   */
  treeOf(child: ChildProcess): Promise<TreeId | null>;
  /**
   * The tree of a child spawned by this lease, never null: rejects with a LeashError
   * (`unavailable`) when the lease is unleashed, and with the error the child emitted.
   */
  treeOfLeashed(child: ChildProcess): Promise<TreeId>;
  /**
   * Registers a running process, and the descendants it has, as a new tree. The process is
   * named by a pidfd (through `leash adopt`), right in a container's pid namespace too.
   */
  adopt(pid: number, options?: TreeOptions): Promise<TreeId | null>;
  /** Kills a tree: resolves once it is empty. */
  kill(tree: TreeId, options?: { graceMs?: number }): Promise<KillSummary>;
  /** Stops enforcing a tree. */
  release(tree: TreeId): Promise<void>;
  /** This lease's trees. */
  trees(): Promise<TreeInfo[]>;
  /** The daemon's events (subscribes on first use). */
  events(options?: EventsOptions): AsyncIterableIterator<LeashEvent>;
  /**
   * Kills every tree not released (with `graceMs`, else each tree's own grace), waits until
   * they are empty, and ends the lease.
   */
  close(options?: { graceMs?: number }): Promise<void>;
  /**
   * close(), for `await using lease = await Lease.connect()`. (No Symbol.dispose: a close
   * waits until the trees are empty, which a synchronous `using` cannot.) On a runtime without
   * Symbol.asyncDispose (Node before 18.18 and 20.4) the method is keyed by
   * `Symbol.for("nodejs.asyncDispose")`: the library defines no global.
   */
  [Symbol.asyncDispose](): Promise<void>;
  /** `claudeCodeSpawner(lease, options)`. */
  claudeCodeSpawner(
    options?: ClaudeCodeSpawnerOptions,
  ): (options: SpawnOptions) => ChildProcess & SpawnedProcess;
}

/**
 * A `spawnClaudeCodeProcess` for the Claude Agent SDK's query() options: it spawns Claude Code
 * on `lease`, with stdin and stdout piped. The SDK calls it synchronously, with only the
 * command, args, cwd, env and abort signal, so the lease must be connected before query(); and
 * the SDK ignores query()'s own `stderr` option once a custom spawner is used, so pass it here:
 * `claudeCodeSpawner(lease, { stderr })`.
 */
export declare function claudeCodeSpawner(
  lease: Lease,
  options?: ClaudeCodeSpawnerOptions,
): (options: SpawnOptions) => ChildProcess & SpawnedProcess;
