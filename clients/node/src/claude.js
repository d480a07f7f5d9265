// The Claude Agent SDK's `spawnClaudeCodeProcess` hook, on a lease. The SDK calls the hook
// synchronously from query() and talks to Claude Code over stdin and stdout (stream-json), so
// those are pipes; it does not read stderr from a custom spawner, so stderr is inherited
// unless the host asks otherwise.

/**
 * @param {import("./lease.js").Lease} lease
 * @param {{ stderr?: unknown, graceMs?: number, keepOnRootExit?: boolean,
 *   onTree?: (tree: number | null, child: import("node:child_process").ChildProcess) => void }} options
 */
export function claudeCodeSpawner(lease, options = {}) {
  const { stderr = "inherit", graceMs, keepOnRootExit, onTree } = options;
  const stderrReader = typeof stderr === "function" ? stderr : null;
  return function spawnClaudeCodeProcess({ command, args, cwd, env, signal }) {
    const child = lease.spawn(command, args, {
      cwd,
      env,
      signal,
      stdio: ["pipe", "pipe", stderrReader ? "pipe" : stderr],
      windowsHide: true,
      graceMs,
      keepOnRootExit,
    });
    if (stderrReader) {
      child.stderr.setEncoding("utf8");
      child.stderr.on("data", stderrReader);
    }
    // A failure reaches the SDK as the child's 'error' event; the callback hears of success.
    if (onTree) lease.treeOf(child).then((tree) => onTree(tree, child), () => {});
    return child;
  };
}
