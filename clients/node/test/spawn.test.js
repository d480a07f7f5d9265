// lease.spawn as a drop-in for child_process.spawn, against the real daemon: the same
// arguments give the same child, now on a leash. The host is this test process (root).

import assert from "node:assert/strict";
import { spawn as nodeSpawn } from "node:child_process";
import { once } from "node:events";
import { readFileSync, readlinkSync, writeFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { Lease, LeashError } from "../src/index.js";
import { Cgroup, alive, comm, exited, procStat, stop, tempDir, testEnv, waitFor } from "./helpers.js";

let lease;

before(async () => {
  // From the environment, as a host would: LEASH_SOCKET and LEASH_BIN.
  testEnv.socket;
  testEnv.leash;
  lease = await Lease.connect();
});

after(() => lease?.close());

/** Runs `child` to its 'close': its output, exit and the lifecycle events in their order. */
function outcome(child, input) {
  const events = [];
  let stdout = "";
  let stderr = "";
  child.stdout?.setEncoding("utf8").on("data", (d) => (stdout += d));
  child.stderr?.setEncoding("utf8").on("data", (d) => (stderr += d));
  let error = null;
  child.on("error", (e) => {
    error = e;
  });
  for (const name of ["spawn", "exit", "close", "error"]) child.on(name, () => events.push(name));
  if (input !== undefined) child.stdin.end(input);
  return new Promise((resolve) => {
    child.on("close", (code, signal) => resolve({ stdout, stderr, code, signal, events, error }));
  });
}

/** A command spawned for a test, stopped however the test ends. */
function spawned(t, ...args) {
  const child = lease.spawn(...args);
  t.after(() => stop(child));
  return child;
}

test("pipes both ways, the exit code, and the pid is the command's own", async () => {
  const child = lease.spawn("sh", ["-c", 'read line; echo "got $line in $$"; echo oops >&2; exit 3']);
  assert.ok(child.pid > 0, "the pid is there at once, as with child_process.spawn");
  const result = outcome(child, "hello\n");
  const tree = await lease.treeOf(child);
  assert.equal(typeof tree, "number");
  const { stdout, stderr, code, signal, events } = await result;
  assert.equal(stdout, `got hello in ${child.pid}\n`, "the shell's $$ is child.pid");
  assert.equal(stderr, "oops\n");
  assert.equal(code, 3);
  assert.equal(signal, null);
  assert.deepEqual(events, ["spawn", "exit", "close"]);
  assert.equal(child.stdio.length, 3, "the shim's two descriptors are not the host's business");
});

test("the tree is the command's: listed with it as root, and the command holds no token", async (t) => {
  const child = spawned(t, "sleep", ["600"]);
  const tree = await lease.treeOf(child);
  const listed = (await lease.trees()).find((info) => info.tree === tree);
  assert.ok(listed, "the tree is among this lease's");
  assert.equal(listed.root, child.pid);
  assert.equal(listed.lease, lease.id);
  assert.deepEqual(
    listed.members.map((m) => [m.pid, m.comm]),
    [[child.pid, "sleep"]],
  );
  assert.equal(readFileSync(`/proc/${child.pid}/cmdline`, "utf8"), "sleep\x00600\x00");
  // The command holds its stdio and whatever this process leaves open to every child (what it
  // inherited without close-on-exec), as a child of node's own spawn does: nothing more. A
  // shell lists its own descriptors (a program just exec'd may still hold its libraries').
  const listFds = ["-c", "ls /proc/$$/fd"];
  const stdio = ["ignore", "pipe", "ignore"];
  const ours = await outcome(lease.spawn("sh", listFds, { stdio }));
  const theirs = await outcome(nodeSpawn("sh", listFds, { stdio }));
  assert.equal(ours.stdout, theirs.stdout, "no descriptor (the token's, the report's) left");
  assert.ok(!readFileSync(`/proc/${child.pid}/environ`, "utf8").includes("LEASH_LEASE"));
});

test("cwd and env are the command's", async (t) => {
  const dir = tempDir("cwd");
  t.after(dir.remove);
  const child = lease.spawn("sh", ["-c", 'pwd; echo "$GREETING"; echo "${LEASH_LEASE-none}"'], {
    cwd: dir.path,
    env: { GREETING: "hi there", PATH: process.env.PATH },
  });
  const { stdout, code } = await outcome(child);
  assert.equal(stdout, `${dir.path}\nhi there\nnone\n`);
  assert.equal(code, 0);
});

test("detached: the command leads a session and a process group of its own", async (t) => {
  const detached = spawned(t, "sleep", ["600"], { detached: true, stdio: "ignore" });
  const attached = spawned(t, "sleep", ["600"], { stdio: "ignore" });
  const [detachedTree] = await Promise.all([lease.treeOf(detached), lease.treeOf(attached)]);
  const own = procStat(process.pid);
  assert.deepEqual(
    [procStat(detached.pid).sid, procStat(detached.pid).pgid],
    [detached.pid, detached.pid],
  );
  assert.equal(procStat(attached.pid).sid, own.sid, "not detached: this process's session");
  const summary = await lease.kill(detachedTree, { graceMs: 0 });
  assert.equal(summary.tree, detachedTree);
  assert.equal(summary.reason, "request");
  assert.deepEqual(await exited(detached), [null, "SIGKILL"]);
});

test("stdio 'ignore', 'inherit' and extra entries", async () => {
  const child = lease.spawn("sh", ["-c", "readlink /proc/$$/fd/0 /proc/$$/fd/2 >&3; echo done >&4"], {
    stdio: ["ignore", "inherit", "inherit", "pipe", "pipe"],
  });
  assert.equal(child.stdin, null);
  assert.equal(child.stdout, null);
  assert.equal(child.stdio.length, 5);
  let three = "";
  let four = "";
  child.stdio[3].setEncoding("utf8").on("data", (d) => (three += d));
  child.stdio[4].setEncoding("utf8").on("data", (d) => (four += d));
  const { code } = await outcome(child);
  assert.equal(code, 0);
  assert.equal(three, `/dev/null\n${readlinkSync("/proc/self/fd/2")}\n`, "stdin ignored, stderr ours");
  assert.equal(four, "done\n");
});

test("stdio 'ipc': messages pass through the shim, as with fork", async () => {
  const script = 'process.on("message", (m) => { process.send(`echo ${m}`); process.disconnect(); })';
  const child = lease.spawn(process.execPath, ["-e", script], { stdio: ["ignore", "ignore", "inherit", "ipc"] });
  const reply = once(child, "message");
  child.send("hi");
  const [message] = await reply;
  assert.equal(message, "echo hi");
  assert.equal(typeof (await lease.treeOf(child)), "number");
  assert.deepEqual(await exited(child), [0, null]);
});

test("shell, as node runs it (/bin/sh -c, argv[0] the shell)", async () => {
  const { stdout, code } = await outcome(lease.spawn('echo $((6 * 7)) "$0"', { shell: true }));
  assert.equal(stdout, "42 /bin/sh\n");
  assert.equal(code, 0);
  const withArgs = await outcome(lease.spawn("echo", ["$GREETING", "world"], { shell: "sh", env: { GREETING: "hello" } }));
  assert.equal(withArgs.stdout, "hello world\n");
});

test("argv0 names the command without changing what runs", async () => {
  const { stdout } = await outcome(lease.spawn("sh", ["-c", 'echo "$0"'], { argv0: "my-agent" }));
  assert.equal(stdout, "my-agent\n");
});

test("uid and gid: the command runs as that user", async () => {
  const user = testEnv.user;
  const { stdout, code } = await outcome(lease.spawn("sh", ["-c", "id -u; id -g; id -G"], { uid: user, gid: user }));
  assert.equal(code, 0);
  assert.equal(stdout, `${user}\n${user}\n${user}\n`);
});

test("a command that cannot be executed: node's 'error' (ENOENT, EACCES), before 'close', no 'exit'", async (t) => {
  const missing = "/nonexistent/leash-node-test-program";
  const theirs = await outcome(nodeSpawn(missing, ["a", "b"]));
  const child = lease.spawn(missing, ["a", "b"]);
  const ours = await outcome(child);
  assert.deepEqual(ours.events, ["error", "close"]);
  for (const key of ["code", "errno", "syscall", "path", "spawnargs"]) {
    assert.deepEqual(ours.error[key], theirs.error[key], `err.${key} as the runtime's own`);
  }
  // Node's words (Bun words its own error differently), then plain ones.
  assert.equal(ours.error.message, `spawn ${missing} ENOENT: ${missing}: command not found`);
  assert.equal(ours.error.code, "ENOENT");
  await assert.rejects(lease.treeOf(child), (e) => e === ours.error);

  // A bare name that is on no directory of PATH.
  const unknown = await outcome(lease.spawn("leash-node-test-no-such-command"));
  assert.equal(unknown.error.code, "ENOENT");
  assert.equal(
    unknown.error.message,
    "spawn leash-node-test-no-such-command ENOENT: leash-node-test-no-such-command: command not found",
  );
  assert.deepEqual(unknown.events, ["error", "close"]);

  const dir = tempDir("noexec");
  t.after(dir.remove);
  const script = `${dir.path}/not-executable`;
  writeFileSync(script, "#!/bin/sh\n", { mode: 0o644 });
  const denied = await outcome(lease.spawn(script));
  assert.equal(denied.error.code, "EACCES");
  assert.equal(denied.error.errno, -13);
  assert.equal(denied.error.syscall, `spawn ${script}`);
  assert.equal(denied.error.message, `spawn ${script} EACCES: ${script}: not executable (permission denied)`);
  assert.deepEqual(denied.events, ["error", "close"]);
});

test("timeout and killSignal", async () => {
  const { code, signal } = await outcome(lease.spawn("sleep", ["600"], { timeout: 100, killSignal: "SIGKILL" }));
  assert.deepEqual([code, signal], [null, "SIGKILL"]);
});

test("an AbortSignal kills the command, with node's AbortError", async () => {
  const controller = new AbortController();
  const child = lease.spawn("sleep", ["600"], { signal: controller.signal });
  const result = outcome(child);
  await lease.treeOf(child);
  controller.abort();
  const { error, signal } = await result;
  assert.equal(error.name, "AbortError");
  assert.equal(signal, "SIGTERM");
});

test("kill resolves when the tree is empty, setsid'd members and TERM-deaf ones included", async (t) => {
  const cgroup = new Cgroup("kill");
  t.after(() => cgroup.remove());
  // A sleep in a session of its own that ignores SIGTERM (the disposition survives exec), a
  // sleep in the background, and the root become a sleep.
  const script = `echo $$ > ${cgroup.path}/cgroup.procs
    setsid sh -c 'trap "" TERM; exec sleep 600' &
    sleep 600 &
    exec sleep 600`;
  const root = spawned(t, "sh", ["-c", script], { stdio: "ignore" });
  const tree = await lease.treeOf(root);
  await waitFor(() => cgroup.procs().length === 3 && cgroup.procs().every((pid) => comm(pid) === "sleep"), {
    what: "the tree's three sleeps",
    detail: () => cgroup.describe(),
  });
  const summary = await lease.kill(tree, { graceMs: 200 });
  assert.ok(!cgroup.populated(), `kill resolved with ${cgroup.describe()} left`);
  assert.equal(summary.reason, "request");
  assert.equal(summary.terminated, 3, "SIGTERM to the three");
  assert.equal(summary.killed, 1, "SIGKILL to the one that ignores SIGTERM");
  assert.ok(!(await lease.trees()).some((info) => info.tree === tree));
});

test("adopt registers a running process", async (t) => {
  const sleeper = nodeSpawn("sleep", ["600"], { stdio: "ignore" });
  t.after(() => stop(sleeper));
  const tree = await lease.adopt(sleeper.pid, { graceMs: 0 });
  const listed = (await lease.trees()).find((info) => info.tree === tree);
  assert.equal(listed.root, sleeper.pid);
  assert.equal(listed.graceMs, 0);
  await lease.kill(tree);
  assert.deepEqual(await exited(sleeper), [null, "SIGKILL"]);
});

test("events: registered, then tree_empty with the kill's summary", async (t) => {
  const events = lease.events();
  t.after(() => events.return());
  const child = spawned(t, "sleep", ["600"], { stdio: "ignore" });
  const tree = await lease.treeOf(child);
  const seen = [];
  const until = async (predicate, what) => {
    const timer = setTimeout(() => events.return(), 60_000);
    try {
      for (;;) {
        const { value, done } = await events.next();
        assert.ok(!done, `the events ended before ${what}; seen ${JSON.stringify(seen)}`);
        seen.push(value);
        if (predicate(value)) return value;
      }
    } finally {
      clearTimeout(timer);
    }
  };
  const registered = await until((e) => e.kind === "registered" && e.tree === tree, "registered");
  assert.equal(registered.pid, child.pid);
  assert.equal(registered.lease, lease.id);
  await lease.kill(tree, { graceMs: 0 });
  const empty = await until((e) => e.kind === "tree_empty" && e.tree === tree, "tree_empty");
  assert.equal(empty.kill.reason, "request");
});

test("release: a released tree outlives the lease, the others die with it before close resolves", async (t) => {
  const other = await Lease.connect();
  t.after(() => other.close());
  const released = other.spawn("sleep", ["600"], { stdio: "ignore" });
  t.after(() => stop(released));
  const kept = other.spawn("sleep", ["600"], { stdio: "ignore" });
  t.after(() => stop(kept));
  const [releasedTree, keptTree] = await Promise.all([other.treeOf(released), other.treeOf(kept)]);
  await other.release(releasedTree);
  assert.deepEqual((await other.trees()).map((info) => info.tree), [keptTree]);
  await other.close();
  assert.ok(!alive(kept.pid), "close resolved: the tree not released is dead");
  assert.ok(alive(released.pid), "the released tree is left alone");
  await assert.rejects(other.trees(), (e) => e instanceof LeashError && e.code === "closed");
  assert.throws(() => other.spawn("true"), (e) => e.code === "closed");
});

test("close kills every tree of the lease, waits until they are empty, and ends the lease", async (t) => {
  const other = await Lease.connect();
  t.after(() => other.close());
  const cgroup = new Cgroup("close");
  t.after(() => cgroup.remove());
  const script = `echo $$ > ${cgroup.path}/cgroup.procs; setsid sleep 600 & exec sleep 600`;
  const children = [0, 1].map(() => other.spawn("sh", ["-c", script], { stdio: "ignore", detached: true }));
  for (const child of children) t.after(() => stop(child));
  await Promise.all(children.map((child) => other.treeOf(child)));
  await waitFor(() => cgroup.procs().length === 4, { what: "four sleeps", detail: () => cgroup.describe() });
  await other.close();
  assert.ok(!cgroup.populated(), `close resolved with ${cgroup.describe()} left`);
});
