// A lease whose daemon hands over (SIGHUP: it exits and leaves every tree tracked in its pins)
// and comes back: pending requests reject with 'unavailable', saying the trees stay enforced;
// the next call reconnects with a new lease, and the trees registered before are still on the
// leash. And one whose daemon shuts down (SIGTERM: it kills every tree): the calls reject
// saying so. The daemon says which it is in its last line (a `closing` event). This suite runs
// daemons of its own, on sockets and pins of their own.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { rmSync } from "node:fs";
import { createConnection } from "node:net";
import { test } from "node:test";
import { Lease, LeashError } from "../src/index.js";
import { alive, comm, exited, stop, tempDir, testEnv, waitFor } from "./helpers.js";

/** `leash daemon` on `socket` and `pins`, serving once this resolves. */
async function startDaemon(socket, pins, log) {
  const daemon = spawn(testEnv.leash, ["daemon", "--socket", socket, "--pin-dir", pins], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  daemon.stderr.setEncoding("utf8").on("data", (d) => log.push(d));
  const accepts = () =>
    new Promise((resolve) => {
      const probe = createConnection({ path: socket });
      probe.once("connect", () => resolve(probe.destroy() || true));
      probe.once("error", () => resolve(false));
    });
  await waitFor(async () => daemon.exitCode !== null || (await accepts()), {
    what: "the daemon to serve",
    detail: () => log.join(""),
  });
  assert.equal(daemon.exitCode, null, `the daemon exited: ${log.join("")}`);
  return daemon;
}

const isLost = (error) =>
  error instanceof LeashError &&
  error.code === "unavailable" &&
  /handed its trees over to the next daemon: they stay enforced .*; the next call connects again, with a new lease/.test(
    error.message,
  );

/**
 * A daemon of this test's own, on a socket and pins that are removed however it ends; its
 * `process` is the one stopped then, which a test may replace.
 */
async function ownDaemon(t, label) {
  const dir = tempDir(label, 0o700);
  t.after(dir.remove);
  const socket = `${dir.path}/leash.sock`;
  // Under the driver's pin root when it names one, so that it removes them however this ends.
  const pins = `${process.env.LEASH_TEST_PIN_ROOT || "/sys/fs/bpf"}/leash-node-test-${label}-${process.pid}`;
  const log = [];
  const daemon = { process: await startDaemon(socket, pins, log), socket, pins, log };
  t.after(async () => {
    await stop(daemon.process, "SIGTERM");
    rmSync(pins, { recursive: true, force: true });
  });
  return daemon;
}

test("a daemon shutdown: calls reject saying the daemon killed the lease's trees, as it did", async (t) => {
  const { process: daemon, socket, log } = await ownDaemon(t, "shutdown");
  const lease = await Lease.connect({ socket });
  t.after(() => lease.close({ graceMs: 0 }).catch(() => {}));
  const sleeper = lease.spawn("sleep", ["600"], { stdio: "ignore" });
  t.after(() => stop(sleeper));
  await lease.treeOfLeashed(sleeper);
  const events = lease.events();
  await lease.trees(); // subscribed: the daemon answers in order
  const ended = assert.rejects(
    async () => {
      for (;;) assert.ok(!(await events.next()).done, "the events ended without saying why");
    },
    (error) =>
      error instanceof LeashError &&
      error.code === "unavailable" &&
      /^the leash daemon at \S+ stopped \(shutdown\): it killed this lease's trees\. /.test(error.message),
  );

  daemon.kill("SIGTERM");
  await ended;
  assert.deepEqual(await exited(daemon), [0, null], log.join(""));
  const [, signal] = await exited(sleeper);
  assert.ok(signal === "SIGTERM" || signal === "SIGKILL", `the shutdown killed the tree: ${signal}`);
  await assert.rejects(lease.trees(), (e) => e.code === "unavailable");
});

test("a daemon hand-over: pending calls reject as unavailable, the next reconnects, trees stay on the leash", async (t) => {
  const own = await ownDaemon(t, "handover");
  const { socket, pins, log, process: daemon } = own;

  const lease = await Lease.connect({ socket });
  t.after(() => lease.close({ graceMs: 0 }).catch(() => {}));
  const sleeper = lease.spawn("sleep", ["600"], { stdio: "ignore" });
  t.after(() => stop(sleeper));
  // A member deaf to SIGTERM (ignored across exec) with a long grace: its kill is still
  // pending at the hand-over. It forks nothing: a doomed tree's members die as they fork.
  const deaf = lease.spawn("sh", ["-c", 'trap "" TERM; exec sleep 600'], {
    stdio: "ignore",
    graceMs: 600_000,
  });
  t.after(() => stop(deaf));
  const [sleeperTree, deafTree] = await Promise.all([lease.treeOf(sleeper), lease.treeOf(deaf)]);
  // Once it runs sleep, it ignores SIGTERM.
  await waitFor(() => comm(deaf.pid) === "sleep", { what: "the TERM-deaf shell to exec sleep" });
  const events = lease.events();
  const pendingKill = lease.kill(deafTree);
  // Handled from now on: they reject as soon as the daemon goes.
  const killLost = assert.rejects(pendingKill, isLost);
  const eventsLost = assert.rejects(async () => {
    for (;;) assert.ok(!(await events.next()).done, "the events ended without saying why");
  }, isLost);
  await waitFor(async () => (await lease.trees()).some((i) => i.tree === deafTree && i.state === "killing"), {
    what: "the kill to be under way",
  });

  daemon.kill("SIGHUP");
  assert.deepEqual(await exited(daemon), [0, null], log.join(""));
  await killLost;
  await eventsLost;

  // No daemon: a spawn fails (an 'error' event), and so does a call.
  const refused = lease.spawn("true");
  const [error] = await new Promise((resolve) => refused.once("error", (...args) => resolve(args)));
  assert.ok(isLost(error), `${error}`);
  await assert.rejects(lease.trees(), (e) => e.code === "unavailable");
  assert.ok(alive(sleeper.pid), "the daemon's absence kills nothing");
  assert.ok(alive(deaf.pid), "nor does it end the grace of a kill under way");

  own.process = await startDaemon(socket, pins, log);
  const trees = await lease.trees();
  assert.deepEqual(trees.map((i) => i.tree).sort(), [sleeperTree, deafTree].sort(), "still on the leash");
  for (const info of trees) {
    assert.equal(info.hostPid, process.pid, "held for this host by the daemon that took over");
    assert.notEqual(info.lease, lease.id, "under a lease of that daemon's, not the new connection's");
  }
  // The new daemon resumed the kill; asking again with no grace finishes it.
  const summary = await lease.kill(deafTree, { graceMs: 0 });
  assert.equal(summary.tree, deafTree);
  assert.deepEqual(await exited(deaf), [null, "SIGKILL"]);

  const after = lease.spawn("sleep", ["600"], { stdio: "ignore" });
  t.after(() => stop(after));
  assert.equal(typeof (await lease.treeOf(after)), "number", "spawns work again");
  await lease.close();
  assert.ok(!alive(sleeper.pid) && !alive(after.pid), "close killed the trees of both leases");
});
