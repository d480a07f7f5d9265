// A stand-in for a coding agent spoken to over ACP-style JSON-RPC on stdin/stdout: each
// prompt names shell commands (its "tools"), and the agent runs each in a process group of
// its own (detached), as agents do so that they can stop one tool's whole group. The turn ends
// when every tool has exited. Used by examples/acp-daemon.js.

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

const send = (message) => process.stdout.write(`${JSON.stringify({ jsonrpc: "2.0", ...message })}\n`);

async function prompt(id, { sessionId, tools = [] }) {
  const finished = tools.map((command, index) => {
    const tool = spawn("sh", ["-c", command], { detached: true, stdio: "ignore" });
    send({
      method: "session/update",
      params: { sessionId, update: { kind: "tool_call", toolCallId: index, command, pid: tool.pid } },
    });
    return new Promise((resolve) => tool.on("exit", resolve));
  });
  await Promise.all(finished);
  send({ id, result: { stopReason: "end_turn" } });
}

createInterface({ input: process.stdin }).on("line", (line) => {
  const { id, method, params } = JSON.parse(line);
  if (method === "session/prompt") prompt(id, params);
  else send({ id, error: { code: -32601, message: `no method ${method}` } });
});
