// Claude Code through the Claude Agent SDK, on a leash: whatever way this host ends (a crash, a
// SIGKILL, the OOM killer, a closed laptop lid that never comes back), the Claude Code process
// and everything it started die with it: shells, dev servers, `setsid` and double-forked
// background tools included. The one change to an SDK host is `spawnClaudeCodeProcess`.
//
//   npm install @anthropic-ai/claude-agent-sdk ./clients/node     # leash-client, from a clone
//   node claude-agent-sdk.ts "Run the tests"      # Node 22.18 or later runs TypeScript as is;
//                                                 # older: compile it with tsc first
//
// It needs the leash daemon (sudo systemctl start leash); LEASH_SOCKET names another socket.
// LEASH_OPTIONAL=1 runs Claude Code without a leash, with a warning, when no daemon is there.

import { query } from "@anthropic-ai/claude-agent-sdk";
import { Lease, claudeCodeSpawner, type TreeId } from "leash-client";

// The lease must exist before query(): the SDK calls spawnClaudeCodeProcess synchronously. It
// ends when this process does, and the daemon then kills every tree spawned under it.
const lease = await Lease.connect({
  // A refused connection is an error with the daemon's words (how to start it), not a Claude
  // Code that exits 1 later. Running unleashed is an explicit choice, and it is warned about.
  optional: process.env.LEASH_OPTIONAL === "1",
  // On the host's death the agent gets SIGTERM, then SIGKILL after this grace: time for Claude
  // Code's own shutdown. Nothing new starts in it: a SessionEnd hook, a process of its own,
  // is killed as it is forked (docs/HOSTS.md, "Choosing a grace period").
  graceMs: 2000,
});

// The tree Claude Code runs in, to stop or inspect this agent (null when running unleashed).
let claudeTree: TreeId | null = null;

const conversation = query({
  prompt: process.argv[2] ?? "List the files in this directory.",
  options: {
    cwd: process.cwd(),
    // MCP servers' env and headers go over stdin, not on Claude Code's command line (which
    // every local user can read); the SDK asks hosts with their own spawner to choose.
    mcpServersDelivery: "initialize",
    // query()'s own `stderr` option is ignored once a spawner is given: Claude Code's stderr
    // is the spawner's to route (inherited if not said).
    spawnClaudeCodeProcess: claudeCodeSpawner(lease, {
      stderr: (text) => process.stderr.write(`[claude] ${text}`),
      onTree: (tree) => {
        claudeTree = tree;
      },
    }),
  },
});

// Ctrl-C stops the agent and everything it started, not only the Claude Code process.
process.once("SIGINT", async () => {
  if (claudeTree !== null) {
    const { terminated, elapsedMs } = await lease.kill(claudeTree, { graceMs: 500 });
    console.error(`stopped Claude Code and everything it started (${terminated} processes) in ${elapsedMs} ms`);
  }
  process.exit(130);
});

try {
  for await (const message of conversation) {
    if (message.type === "assistant") {
      for (const block of message.message.content) {
        if (block.type === "text") console.log(block.text);
        if (block.type === "tool_use") console.log(`[${block.name}]`, JSON.stringify(block.input));
      }
    } else if (message.type === "result") {
      console.log(message.subtype === "success" ? message.result : `ended: ${message.subtype}`);
    }
  }
} finally {
  // A clean exit: kill whatever the agent left running (background tools), then end the lease.
  await lease.close();
}
