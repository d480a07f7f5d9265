// What `tsc -p clients/node` (run by `cargo xtask lint`) holds the library to: src/index.js
// exports what index.d.ts declares, no more and no less. The sources are typed in JSDoc with
// the types of index.d.ts and checked strictly (tsconfig.json), and Lease implements the
// declared Lease, so a declaration the code does not keep is a compile error. Never run.

import * as implementation from "./src/index.js";

/** @typedef {typeof import("./index.js")} Declared */

/**
 * Every declared export, from the implementation. Lease's constructor is left out: index.d.ts
 * keeps it private (leases come from `Lease.connect()`, and the constructor refuses others).
 * @type {Omit<Declared, "Lease"> & { Lease: Pick<Declared["Lease"], keyof Declared["Lease"]> }}
 */
export const declared = implementation;

/** @type {Record<Exclude<keyof typeof implementation, keyof Declared>, never>} */
export const undeclared = {};

// What a host's own code, checked with tsc --strict, may and may not do with the declared API.
// Each `@ts-expect-error` line must stay an error: tsc fails on one that no longer is.

/**
 * @param {import("./index.js").Lease} lease
 * @param {import("./index.js").TreeId} tree
 */
export async function asAHostWrites(lease, tree) {
  // Piped stdio, as child_process.spawn's overloads type it: those streams are not null.
  const agent = lease.spawn("my-agent", ["--acp"], { stdio: ["pipe", "pipe", "inherit"] });
  agent.stdout.setEncoding("utf8");
  agent.stdin.end("hello\n");
  /** @type {null} */
  const inherited = agent.stderr;
  // @ts-expect-error stderr is inherited: there is no stream to read
  agent.stderr.on("data", () => {});
  // No stdio option: every stream is a pipe, as in node.
  lease.spawn("true").stderr.setEncoding("utf8");
  lease.spawn("sh", ["-c", "exit 0"], { graceMs: 100, keepOnRootExit: true }).stdout.read();

  // A tree that is never null (the lease is leashed, or it rejects) for kill and release.
  const summary = await lease.kill(await lease.treeOfLeashed(agent), { graceMs: 0 });
  /** @type {number} */
  const elapsed = summary.elapsedMs;
  // @ts-expect-error treeOf resolves to null on an unleashed lease: kill needs a tree
  await lease.kill(await lease.treeOf(agent));
  await lease.release(tree);

  // The Claude Agent SDK's hook, from the named export, with Claude Code's stderr as text.
  const spawner = implementation.claudeCodeSpawner(lease, {
    stderr: (text) => process.stderr.write(text),
    onTree: (claudeTree) => claudeTree ?? "unleashed",
  });
  /** @type {import("node:stream").Readable} */
  const claudeOut = spawner({ command: "claude", args: [], env: {}, signal: AbortSignal.abort() })
    .stdout;

  // The lease is closed (its trees killed) when the scope ends.
  {
    await using scoped = await implementation.Lease.connect({ graceMs: 2000 });
    scoped.spawn("sleep", ["1"], { stdio: "ignore" });
  }
  return [inherited, elapsed, claudeOut];
}
