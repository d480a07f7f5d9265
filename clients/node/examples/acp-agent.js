#!/usr/bin/env node
// A small ACP agent (Agent Client Protocol: JSON-RPC 2.0 on stdin/stdout, one message a line),
// to run the examples against without a model: examples/acp-daemon.js starts it by default,
// and the Python example runs it as `python3 acp_host.py -- node acp-agent.js`.
//
// Its one trick: each text block of a prompt is a shell command, a tool call of kind "execute".
// For each, as a real agent does, it reports the call (session/update `tool_call`, pending),
// asks the client (session/request_permission, with allow_once, allow_always and reject_once
// options), and only if an allow option is selected starts `sh -c COMMAND`, detached: in a
// session and process group of its own, as agents start tools so that they can stop one tool's
// whole group, and out of reach of any signal sent to the agent's group. It reports the tool's
// pid (`_meta.pid` of the in_progress update) and its end, and answers the prompt (stopReason
// end_turn, or cancelled) once every tool has ended. Node's core modules only.
//
//   node acp-agent.js
//   {"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}
//   {"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}
//   {"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"session-1",
//     "prompt":[{"type":"text","text":"touch ran; exec sleep 600"}]}}
//
// It exits when its stdin ends, as agents do, and leaves its tools running, as agents do.

import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

const PROTOCOL_VERSION = 1;
/** The choices offered for every tool call. */
const OPTIONS = [
  { optionId: "allow-once", name: "Allow", kind: "allow_once" },
  { optionId: "allow-always", name: "Always allow", kind: "allow_always" },
  { optionId: "reject-once", name: "Reject", kind: "reject_once" },
];

const write = (message) => process.stdout.write(`${JSON.stringify({ jsonrpc: "2.0", ...message })}\n`);
const update = (sessionId, fields) => write({ method: "session/update", params: { sessionId, update: fields } });
const say = (sessionId, text) =>
  update(sessionId, { sessionUpdate: "agent_message_chunk", content: { type: "text", text } });

/** Requests this agent sent the client, by id: their resolvers. */
const waiting = new Map();
let nextRequest = 1;
function request(method, params) {
  const id = `agent-${nextRequest++}`;
  write({ id, method, params });
  return new Promise((resolve, reject) => waiting.set(id, { resolve, reject }));
}

/** Sessions by id: the tools of the turn running in each, and whether it was cancelled. */
const sessions = new Map();
let nextSession = 1;
let nextToolCall = 1;

/** One tool call: asks, runs if allowed, reports. Resolves to "ran", "refused" or "cancelled". */
async function toolCall(sessionId, session, command) {
  const toolCallId = `call-${nextToolCall++}`;
  const title = `Run \`${command}\``;
  const call = { toolCallId, title, kind: "execute", status: "pending", rawInput: { command } };
  update(sessionId, { sessionUpdate: "tool_call", ...call });
  const { outcome } = await request("session/request_permission", { sessionId, toolCall: call, options: OPTIONS });
  const chosen = outcome?.outcome === "selected" && OPTIONS.find((o) => o.optionId === outcome.optionId);
  if (!chosen || !chosen.kind.startsWith("allow") || session.cancelled) {
    const why = outcome?.outcome === "cancelled" || session.cancelled ? "cancelled" : "refused";
    update(sessionId, {
      sessionUpdate: "tool_call_update",
      toolCallId,
      status: "failed",
      content: [{ type: "content", content: { type: "text", text: `not run: permission ${why}` } }],
    });
    return why;
  }
  const tool = spawn("sh", ["-c", command], { detached: true, stdio: "ignore" });
  const ended = new Promise((resolve) => {
    tool.on("error", (error) => resolve({ code: null, signal: null, error }));
    tool.on("exit", (code, signal) => resolve({ code, signal }));
  });
  if (tool.pid !== undefined) {
    session.tools.add(tool.pid);
    update(sessionId, { sessionUpdate: "tool_call_update", toolCallId, status: "in_progress", _meta: { pid: tool.pid } });
  }
  const { code, signal, error } = await ended;
  session.tools.delete(tool.pid);
  const text = error ? `could not start: ${error.message}` : `exited with ${signal ?? `status ${code}`}`;
  update(sessionId, {
    sessionUpdate: "tool_call_update",
    toolCallId,
    status: code === 0 ? "completed" : "failed",
    content: [{ type: "content", content: { type: "text", text } }],
  });
  return "ran";
}

async function prompt({ sessionId, prompt: blocks = [] }) {
  const session = sessions.get(sessionId);
  if (!session) throw Object.assign(new Error(`no session ${sessionId}`), { code: -32602 });
  session.cancelled = false;
  const commands = blocks.filter((b) => b.type === "text" && b.text.trim()).map((b) => b.text);
  if (commands.length === 0) say(sessionId, "Send shell commands as text, one a block, and I run them.");
  const results = await Promise.all(commands.map((command) => toolCall(sessionId, session, command)));
  if (session.cancelled || results.includes("cancelled")) return { stopReason: "cancelled" };
  const ran = results.filter((r) => r === "ran").length;
  say(sessionId, `Ran ${ran} of ${commands.length} tool call(s).`);
  return { stopReason: "end_turn" };
}

const methods = {
  initialize: () => ({
    protocolVersion: PROTOCOL_VERSION,
    agentCapabilities: { loadSession: false, promptCapabilities: { image: false, audio: false, embeddedContext: false } },
    authMethods: [],
  }),
  "session/new": () => {
    const sessionId = `session-${nextSession++}`;
    sessions.set(sessionId, { tools: new Set(), cancelled: false });
    return { sessionId };
  },
  "session/prompt": prompt,
};

/** session/cancel: the turn ends as cancelled; each running tool's group gets SIGTERM. */
function cancel({ sessionId }) {
  const session = sessions.get(sessionId);
  if (!session) return;
  session.cancelled = true;
  for (const pid of session.tools) {
    try {
      process.kill(-pid, "SIGTERM");
    } catch {
      // Gone already.
    }
  }
}

function answer(message) {
  const waiter = waiting.get(message.id);
  if (!waiter) return;
  waiting.delete(message.id);
  if (message.error) waiter.reject(new Error(`the client answered ${message.error.message}`));
  else waiter.resolve(message.result ?? {});
}

const input = createInterface({ input: process.stdin });
input.on("line", (line) => {
  let message;
  try {
    message = JSON.parse(line);
  } catch {
    write({ id: null, error: { code: -32700, message: "parse error" } });
    return;
  }
  const { id, method, params = {} } = message;
  if (method === undefined) return answer(message);
  if (method === "session/cancel") return cancel(params);
  if (id === undefined) return; // another notification: nothing to do
  const handler = methods[method];
  if (!handler) return write({ id, error: { code: -32601, message: `method not found: ${method}` } });
  Promise.resolve()
    .then(() => handler(params))
    .then(
      (result) => write({ id, result }),
      (error) => write({ id, error: { code: error.code ?? -32603, message: error.message } }),
    );
});
// Its client is gone: exit, leaving whatever tools run, as agents do (leash is what ends them).
input.on("close", () => process.exit(0));
