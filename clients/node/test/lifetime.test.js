// How long a lease lives: a host that forgets close() still exits by itself (an idle lease
// does not keep its event loop alive), and `await using` closes the lease at the end of the
// scope, so the daemon kills its trees.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Lease } from "../src/index.js";
import { alive, exited, jsonLines, stop, tempDir, testEnv, waitFor } from "./helpers.js";

const idleHost = fileURLToPath(new URL("./fixtures/idle-host.js", import.meta.url));
const noAsyncDispose = fileURLToPath(new URL("./fixtures/no-async-dispose.js", import.meta.url));
/** A host must be done well within this once its script has ended. */
const EXIT_DEADLINE_MS = 20_000;

/**
 * Runs the idle host (`args`: [] or ["close"]); resolves to its report once it has exited by
 * itself, with status 0, within the deadline.
 */
async function idleHostRun(t, args) {
  const host = spawn(process.execPath, [idleHost, ...args], {
    stdio: ["ignore", "pipe", "inherit"],
    env: { ...process.env, LEASH_SOCKET: testEnv.socket, LEASH_BIN: testEnv.leash },
  });
  t.after(() => stop(host));
  const report = await jsonLines(host.stdout).next("the host's report", (m) => m.tree);
  t.after(() => {
    if (alive(report.background)) process.kill(report.background, "SIGKILL");
  });
  assert.deepEqual(report.trees, [report.tree], "the request made once the root was gone was answered");
  const ended = await Promise.race([
    exited(host),
    new Promise((resolve) => setTimeout(resolve, EXIT_DEADLINE_MS, "still running")),
  ]);
  assert.deepEqual(ended, [0, null], `the host's script has ended, yet after ${EXIT_DEADLINE_MS} ms: ${ended}`);
  return report;
}

test("a host that never calls close() exits by itself, and the daemon then kills its trees", async (t) => {
  const report = await idleHostRun(t, []);
  assert.equal(report.closed, false);
  // Its lease ended with it: the background process of its kept tree is killed.
  await waitFor(() => !alive(report.background), {
    what: `the background process ${report.background} of the host's tree to be killed`,
  });
});

test("a host whose last act is `await lease.close()` sees it resolve before it exits", async (t) => {
  const report = await idleHostRun(t, ["close"]);
  assert.equal(report.closed, true, "the report comes after close() resolved");
  assert.ok(!alive(report.background), "close() killed the tree before it resolved");
});

test("`await using` closes the lease at the end of the scope, killing its trees", async (t) => {
  assert.equal(typeof Lease.prototype[Symbol.asyncDispose], "function");
  const source = `
    import { Lease } from ${JSON.stringify(new URL("../src/index.js", import.meta.url).href)};
    export async function run(seen) {
      await using lease = await Lease.connect();
      const child = lease.spawn("sleep", ["600"], { stdio: "ignore" });
      seen(child, await lease.treeOfLeashed(child));
    }
  `;
  // Bun and Node 24 run \`await using\` as it is; Node 20 cannot parse it, so TypeScript
  // compiles it to what it means (a try/finally that calls lease[Symbol.asyncDispose]()), as
  // it does for a host written in TypeScript.
  let outputText = source;
  if (!parsesAwaitUsing()) {
    const ts = createRequire(join(testEnv.nodeModules, "package.json"))("typescript");
    ({ outputText } = ts.transpileModule(source, {
      compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ES2022 },
    }));
    assert.match(outputText, /__addDisposableResource/, "compiled as `await using`");
  }
  const dir = tempDir("await-using");
  t.after(dir.remove);
  const module = join(dir.path, "scope.mjs");
  writeFileSync(module, outputText);
  const { run } = await import(pathToFileURL(module).href);

  let child;
  let tree;
  await run((c, id) => {
    child = c;
    tree = id;
  });
  t.after(() => stop(child));
  assert.equal(typeof tree, "number");
  // close() resolved before the scope ended: the tree is empty already.
  assert.ok(!alive(child.pid), `the lease's tree ${tree} was killed when the scope ended`);
  assert.deepEqual(await exited(child), [null, "SIGTERM"]);
});

test("on a runtime without Symbol.asyncDispose, the library leaves Symbol alone and keys close() by node's symbol", async (t) => {
  const host = spawn(process.execPath, [noAsyncDispose], { stdio: ["ignore", "pipe", "inherit"] });
  t.after(() => stop(host));
  const report = await jsonLines(host.stdout).next("the report", (m) => m.defined);
  assert.deepEqual(report.defined, [], "nothing defined on the global Symbol");
  assert.ok(report.closes, 'lease[Symbol.for("nodejs.asyncDispose")]() is close()');
  assert.deepEqual(await exited(host), [0, null]);
});

/** Whether this runtime parses `await using` declarations itself. */
function parsesAwaitUsing() {
  const AsyncFunction = (async () => {}).constructor;
  try {
    new AsyncFunction("await using resource = null;");
    return true;
  } catch {
    return false;
  }
}
