// The Claude Agent SDK's `spawnClaudeCodeProcess` hook, on a lease. The SDK calls the hook
// synchronously from query(), with only { command, args, cwd, env, signal }, so the lease must
// exist before query(). It talks to Claude Code over stdin and stdout (stream-json), so those
// are pipes. It neither reads a custom spawner's stderr nor passes it its own `stderr` option
// (which it ignores once a custom spawner is given), so stderr is what this spawner's own
// `stderr` option says: inherited unless the host asks otherwise.

/**
 * @typedef {import("node:child_process").ChildProcess} ChildProcess
 * @typedef {import("../index.js").SpawnOptions} SpawnOptions
 * @typedef {import("../index.js").SpawnedProcess} SpawnedProcess
 */

/**
 * A `spawnClaudeCodeProcess` for query()'s options that spawns Claude Code on `lease`.
 * @param {import("../index.js").Lease} lease
 * @param {import("../index.js").ClaudeCodeSpawnerOptions} options
 * @returns {(options: SpawnOptions) => ChildProcess & SpawnedProcess}
 */
export function claudeCodeSpawner(lease, options = {}) {
  const { stderr = "inherit", graceMs, keepOnRootExit, onTree } = options;
  const stderrReader = typeof stderr === "function" ? stderr : null;
  return function spawnClaudeCodeProcess({ command, args, cwd, env, signal }) {
    const child = lease.spawn(command, args, {
      cwd,
      env,
      signal,
      stdio: [
        "pipe",
        "pipe",
        stderrReader ? "pipe" : /** @type {Exclude<typeof stderr, Function>} */ (stderr),
      ],
      windowsHide: true,
      graceMs,
      keepOnRootExit,
    });
    if (stderrReader) {
      const pipe = /** @type {import("node:stream").Readable} */ (child.stderr);
      pipe.setEncoding("utf8");
      pipe.on("data", stderrReader);
    }
    // A failure reaches the SDK as the child's 'error' event; the callback hears of success.
    if (onTree) lease.treeOf(child).then((tree) => onTree(tree, child), () => {});
    // Its stdin and stdout are pipes, which is what the SDK needs of a SpawnedProcess.
    return /** @type {ChildProcess & SpawnedProcess} */ (child);
  };
}
