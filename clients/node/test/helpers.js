// Shared pieces of the Node tests (and the Claude Agent SDK test): the environment the Rust
// driver (tests/tests/host_node.rs) sets, polling with a deadline, cgroup v2 groups as the
// ground truth for "every process", and running a command as another user inside a group.

import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync, chmodSync, rmdirSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { setTimeout as delay } from "node:timers/promises";

/** Generous: the tests must hold on a slow, loaded 2-core machine. */
export const DEADLINE_MS = 60_000;

function required(name, what) {
  const value = process.env[name];
  if (!value) {
    throw new Error(
      `${name} is not set: ${what}. These tests run against a real leash daemon; run them ` +
        "with `cargo test -p leash-tests --test host_node` (or `cargo xtask test`), which " +
        "starts one and sets it",
    );
  }
  return value;
}

/**
 * What the driver passes: the daemon's socket (LEASH_SOCKET), a leash binary any user may run
 * (LEASH_BIN), an unprivileged uid (LEASH_TEST_USER), a second daemon with a small tree limit
 * (LEASH_TEST_LIMITED_SOCKET, LEASH_TEST_MAX_TREES), and where the npm packages of the SDK
 * test are (LEASH_TEST_NODE_MODULES). Each is read when asked for, and fails saying so.
 * Optional: LEASH_TEST_CGROUP_PARENT (where Cgroup makes its groups) and LEASH_TEST_PIN_ROOT
 * (where a test pins a daemon it runs itself), both removed by the driver however tests end.
 */
export const testEnv = {
  get socket() {
    return required("LEASH_SOCKET", "the socket of the leash daemon under test");
  },
  get leash() {
    return required("LEASH_BIN", "a leash binary every user may execute");
  },
  get user() {
    return Number(required("LEASH_TEST_USER", "an unprivileged uid to run hosts as"));
  },
  get limitedSocket() {
    return required("LEASH_TEST_LIMITED_SOCKET", "a daemon with --max-trees-per-uid");
  },
  get maxTrees() {
    return Number(required("LEASH_TEST_MAX_TREES", "that daemon's --max-trees-per-uid"));
  },
  get nodeModules() {
    return required("LEASH_TEST_NODE_MODULES", "node_modules with the Claude Agent SDK");
  },
};

/**
 * Polls `condition` (sync or async) until it returns a truthy value, which it resolves to;
 * rejects after `timeoutMs` saying what it waited for (and `detail()`, if given).
 */
export async function waitFor(condition, { what = "a condition", timeoutMs = DEADLINE_MS, intervalMs = 10, detail } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await condition();
    if (value) return value;
    if (Date.now() >= deadline) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail ? `: ${detail()}` : ""}`);
    }
    await delay(intervalMs);
  }
}

/** Whether `pid` is a live process (not gone, not a zombie). */
export function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

/** Fields of /proc/PID/stat after the command: {state, ppid, pgid, sid}. */
export function procStat(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const [state, ppid, pgid, sid] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return { state, ppid: Number(ppid), pgid: Number(pgid), sid: Number(sid) };
}

let cgroupRootPath;
/** Where the cgroup v2 hierarchy is mounted (/proc/self/mountinfo says). */
export function cgroupRoot() {
  if (cgroupRootPath) return cgroupRootPath;
  for (const line of readFileSync("/proc/self/mountinfo", "utf8").split("\n")) {
    const [mount, fs] = line.split(" - ");
    if (fs?.split(" ")[0] === "cgroup2") {
      const point = mount.split(" ")[4].replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8)));
      return (cgroupRootPath = point);
    }
  }
  throw new Error("no cgroup2 file system is mounted: the tests use cgroup v2 as ground truth");
}

let nextGroup = 0;

/**
 * A cgroup v2 group of the test's own: the kernel's exact account of every process started
 * in it, however they detach. `remove()` kills what is left and removes it (call it from
 * t.after, so it runs however the test ends).
 */
export class Cgroup {
  constructor(label) {
    // Under the driver's group when it names one, so that it removes whatever a test left.
    const parent = process.env.LEASH_TEST_CGROUP_PARENT || cgroupRoot();
    this.path = join(parent, `leash-node-test-${label}-${process.pid}-${nextGroup++}`);
    mkdirSync(this.path);
  }

  /**
   * The pids of the processes in the group now: cgroup.procs, and the process of every thread
   * in cgroup.threads (a process whose main thread has exited while others run is listed
   * only there).
   */
  procs() {
    const read = (file) => {
      try {
        return readFileSync(join(this.path, file), "utf8").split("\n").filter(Boolean).map(Number);
      } catch {
        return [];
      }
    };
    const tgid = (tid) => {
      try {
        return Number(/^Tgid:\s+(\d+)/m.exec(readFileSync(`/proc/${tid}/status`, "utf8"))[1]);
      } catch {
        return null;
      }
    };
    const pids = new Set(read("cgroup.procs"));
    for (const tid of read("cgroup.threads")) {
      const pid = tgid(tid);
      if (pid !== null) pids.add(pid);
    }
    return [...pids].sort((a, b) => a - b);
  }

  populated() {
    try {
      return /populated 1/.test(readFileSync(join(this.path, "cgroup.events"), "utf8"));
    } catch {
      return false;
    }
  }

  /** Resolves once no process is left in the group. */
  waitEmpty(options = {}) {
    return waitFor(() => !this.populated(), {
      what: `cgroup ${this.path} to be empty`,
      detail: () => `it holds ${this.describe()}`,
      ...options,
    });
  }

  /** `pid (comm)` of each process in the group, for messages. */
  describe() {
    return this.procs().map((pid) => `${pid} (${comm(pid)})`).join(", ") || "nothing";
  }

  /** SIGKILLs everything in the group. */
  kill() {
    try {
      writeFileSync(join(this.path, "cgroup.kill"), "1");
    } catch {
      for (const pid of this.procs()) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {}
      }
    }
  }

  /** Kills what is left, waits until it is gone, and removes the group. */
  async remove() {
    this.kill();
    await this.waitEmpty({ timeoutMs: 20_000 }).catch(() => {});
    try {
      rmdirSync(this.path);
    } catch (error) {
      if (error.code !== "ENOENT") console.error(`could not remove ${this.path}: ${error.message}`);
    }
  }
}

export function comm(pid) {
  try {
    return readFileSync(`/proc/${pid}/comm`, "utf8").trim();
  } catch {
    return null;
  }
}

/**
 * Spawns `command args...` as `uid` (its own gid, no other groups) inside `cgroup`, joined
 * first by a root shell that then becomes the command (through setpriv): nothing of it runs
 * outside the group. Other spawn options are passed on.
 */
export function runAs(uid, cgroup, command, args = [], options = {}) {
  const script = 'echo $$ > "$0/cgroup.procs" && exec setpriv "$@"';
  const setpriv = [`--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", command, ...args];
  return spawn("sh", ["-c", script, cgroup.path, ...setpriv], options);
}

/** A temporary directory (mode `mode`) and its removal. */
export function tempDir(label, mode = 0o755) {
  const path = mkdtempSync(join(tmpdir(), `leash-node-${label}-`));
  chmodSync(path, mode);
  return { path, remove: () => rmSync(path, { recursive: true, force: true }) };
}

/**
 * The JSON lines a process writes on `stream`, to await one by one: `next(what, predicate)`
 * resolves to the first line not yet taken that matches.
 */
export function jsonLines(stream) {
  const seen = [];
  const waiters = new Set();
  let ended = false;
  const reader = createInterface({ input: stream });
  reader.on("line", (line) => {
    let value;
    try {
      value = JSON.parse(line);
    } catch {
      value = { unparsed: line };
    }
    seen.push(value);
    for (const waiter of waiters) waiter();
  });
  reader.on("close", () => {
    ended = true;
    for (const waiter of waiters) waiter();
  });
  return {
    seen,
    next(what, predicate = () => true, timeoutMs = DEADLINE_MS) {
      return new Promise((resolve, reject) => {
        const check = () => {
          const index = seen.findIndex((v) => !v.taken && predicate(v));
          if (index !== -1) {
            done();
            Object.defineProperty(seen[index], "taken", { value: true });
            resolve(seen[index]);
          } else if (ended) {
            done();
            reject(new Error(`the stream ended before ${what}; it said ${JSON.stringify(seen)}`));
          }
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; seen ${JSON.stringify(seen)}`));
        }, timeoutMs);
        const done = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      });
    },
  };
}

/**
 * Resolves to [code, signal] when `child` exits (at once if it has): its 'exit', or its
 * 'close' for a child that failed to spawn (which has no 'exit').
 */
export function exited(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) {
      return resolve([child.exitCode, child.signalCode]);
    }
    const done = (code, signal) => {
      child.off("exit", done);
      child.off("close", done);
      resolve([code, signal]);
    };
    child.on("exit", done);
    child.on("close", done);
  });
}

/** Sends `signal` (SIGKILL) to `child` if it still runs and waits for its exit: for t.after. */
export async function stop(child, signal = "SIGKILL") {
  if (child.exitCode === null && child.signalCode === null && child.pid) {
    child.kill(signal);
    await exited(child);
  }
}
