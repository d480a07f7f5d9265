// Errors a host meets, in the daemon's words: no daemon, no binary, a refused spawn (the
// tree limit), and the explicit opt-in fallback that spawns unleashed with a warning.

import assert from "node:assert/strict";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { Lease, LeashError } from "../src/index.js";
import { Cgroup, alive, exited, jsonLines, runAs, stop, tempDir, testEnv, waitFor } from "./helpers.js";

const packageDir = fileURLToPath(new URL("..", import.meta.url));
const limitHost = fileURLToPath(new URL("./fixtures/limit-host.js", import.meta.url));

function unavailable(pattern) {
  return (error) => {
    assert.ok(error instanceof LeashError, `a LeashError: ${error}`);
    assert.equal(error.code, "unavailable");
    assert.match(error.message, pattern);
    return true;
  };
}

test("no daemon: connect rejects with 'unavailable', saying how to start one", async (t) => {
  const dir = tempDir("nodaemon");
  t.after(dir.remove);
  const socket = `${dir.path}/leash.sock`;
  await assert.rejects(Lease.connect({ socket, leash: testEnv.leash }), (error) => {
    unavailable(/sudo systemctl start leash.*sudo leash daemon.*LEASH_SOCKET/)(error);
    assert.ok(error.message.includes(socket), error.message);
    return true;
  });
});

test("no leash binary: connect rejects with 'unavailable', naming LEASH_BIN", async () => {
  await assert.rejects(
    Lease.connect({ socket: testEnv.socket, leash: "/nonexistent/leash" }),
    unavailable(/\/nonexistent\/leash.*LEASH_BIN/),
  );
  const saved = { PATH: process.env.PATH, LEASH_BIN: process.env.LEASH_BIN };
  try {
    process.env.PATH = "/nonexistent";
    delete process.env.LEASH_BIN;
    // Every place it looked: LEASH_BIN and PATH, and no platform package (this checkout's
    // package.json names none), so LEASH_BIN comes first.
    await assert.rejects(
      Lease.connect({ socket: testEnv.socket }),
      unavailable(/^no leash binary: set LEASH_BIN.*on PATH \(\/nonexistent\).*names no leash-client-linux-/),
    );
  } finally {
    Object.assign(process.env, saved);
  }
});

test("optional: true spawns unleashed, with a warning, when there is no daemon", async (t) => {
  const dir = tempDir("optional");
  t.after(dir.remove);
  const warned = once(process, "warning");
  const lease = await Lease.connect({ socket: `${dir.path}/leash.sock`, optional: true });
  t.after(() => lease.close());
  const [warning] = await warned;
  assert.equal(warning.name, "LeashWarning");
  assert.equal(warning.code, "LEASH_UNLEASHED");
  assert.match(warning.message, /NOT on a leash.*sudo systemctl start leash/);
  assert.equal(lease.leashed, false);
  assert.equal(lease.id, null);

  const child = lease.spawn("sh", ["-c", "echo $$"], { graceMs: 100 });
  let stdout = "";
  child.stdout.setEncoding("utf8").on("data", (d) => (stdout += d));
  assert.deepEqual(await exited(child), [0, null]);
  assert.equal(stdout, `${child.pid}\n`);
  assert.equal(await lease.treeOf(child), null);
  assert.deepEqual(await lease.trees(), []);
  await assert.rejects(lease.kill(1), unavailable(/not on a leash/));
});

test("optional: true changes nothing when the daemon is there", async (t) => {
  const lease = await Lease.connect({ optional: true });
  t.after(() => lease.close());
  assert.equal(lease.leashed, true);
  const child = lease.spawn("true");
  assert.equal(typeof (await lease.treeOf(child)), "number");
});

test("at the tree limit: the spawn is an 'error' event with limit_reached, nothing runs", async (t) => {
  const max = testEnv.maxTrees;
  const cgroup = new Cgroup("limit");
  t.after(() => cgroup.remove());
  const host = runAs(testEnv.user, cgroup, process.execPath, [limitHost, `${max}`, `${process.pid}`], {
    cwd: packageDir,
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, LEASH_SOCKET: testEnv.limitedSocket, LEASH_BIN: testEnv.leash },
  });
  t.after(() => stop(host));
  const lines = jsonLines(host.stdout);
  const report = await lines.next("the host's report", (m) => m.refused);

  assert.equal(report.held.length, max);
  const { refused } = report;
  assert.deepEqual(refused.events, ["error", "close"], "'error' first, no 'spawn' nor 'exit'");
  assert.ok(refused.isLeashError);
  assert.equal(refused.code, "limit_reached");
  assert.match(refused.message, new RegExp(`uid ${testEnv.user} holds ${max} trees`));
  assert.ok(refused.treeOfRejectsWithIt, "treeOf rejects with the same error");
  assert.ok(!alive(refused.pid), "the refused command is not running");
  assert.equal(report.adopt.code, "permission_denied", `a process the host may not signal: ${report.adopt.message}`);

  // Nothing runs beyond the host and the trees it holds.
  const expected = [host.pid, ...report.held.map((h) => h.pid)].sort((a, b) => a - b);
  assert.deepEqual(cgroup.procs(), expected, cgroup.describe());

  host.stdin.end();
  await lines.next("the lease closed", (m) => m.closed);
  assert.deepEqual(await exited(host), [0, null]);
  await cgroup.waitEmpty();
});
