#!/usr/bin/env node
// An ACP-daemon-like host: a long-lived process that starts one agent per session and relays
// JSON-RPC between its client (stdin/stdout, one message per line) and the agents. Each agent
// is spawned on the leash, so whatever it starts, even tools in process groups or sessions of
// their own, dies with it, and everything dies with this host, however it dies.
//
//   node examples/acp-daemon.js          (or: bun examples/acp-daemon.js)
//   {"id":1,"method":"session/new"}
//   {"id":2,"method":"session/prompt","params":{"sessionId":1,"tools":["sleep 5"]}}
//   {"id":3,"method":"shutdown"}
//
// The agent is examples/acp-agent.js unless the request names another command
// ("params":{"command":["my-agent","--acp"]}). LEASH_SOCKET and LEASH_BIN are honoured;
// LEASH_OPTIONAL=1 runs the agents unleashed (with a warning) when leash is not installed.

import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { Lease } from "../src/index.js";

const lease = await Lease.connect({ optional: process.env.LEASH_OPTIONAL === "1", graceMs: 2000 });
const sessions = new Map();
let nextSession = 1;

const send = (message) => process.stdout.write(`${JSON.stringify({ jsonrpc: "2.0", ...message })}\n`);

async function newSession(params = {}) {
  const sessionId = nextSession++;
  const [command, ...args] = params.command ?? [
    process.execPath,
    fileURLToPath(new URL("./acp-agent.js", import.meta.url)),
  ];
  const agent = lease.spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
  const session = { agent, pending: new Map(), nextId: 1 };
  sessions.set(sessionId, session);
  // A refused spawn is an 'error' (and no 'exit'): treeOf below rejects with it.
  agent.on("error", () => sessions.delete(sessionId));
  agent.on("exit", (code, signal) => {
    sessions.delete(sessionId);
    for (const { reject } of session.pending.values()) reject(new Error(`the agent exited (${signal ?? code})`));
    send({ method: "agent/exited", params: { sessionId, code, signal } });
  });
  createInterface({ input: agent.stdout }).on("line", (line) => {
    const message = JSON.parse(line);
    const waiter = message.id !== undefined && session.pending.get(message.id);
    if (waiter) {
      session.pending.delete(message.id);
      if (message.error) waiter.reject(new Error(message.error.message));
      else waiter.resolve(message.result);
    } else {
      send(message); // a notification (session/update): relayed to the client
    }
  });
  // The tree id, or the error that kept the agent from starting (no daemon, over the limit).
  const tree = await lease.treeOf(agent);
  return { sessionId, agentPid: agent.pid, tree };
}

function toAgent(sessionId, method, params) {
  const session = sessions.get(sessionId);
  if (!session) throw new Error(`no session ${sessionId}`);
  const id = session.nextId++;
  return new Promise((resolve, reject) => {
    session.pending.set(id, { resolve, reject });
    session.agent.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", id, method, params })}\n`);
  });
}

async function handle({ id, method, params }) {
  switch (method) {
    case "session/new":
      return newSession(params);
    case "session/prompt":
      return toAgent(params.sessionId, method, params);
    case "shutdown":
      // Kills every agent's tree and waits until they are all gone.
      await lease.close();
      setImmediate(() => process.exit(0));
      return {};
    default:
      throw new Error(`no method ${method}`);
  }
}

createInterface({ input: process.stdin }).on("line", (line) => {
  const request = JSON.parse(line);
  handle(request).then(
    (result) => send({ id: request.id, result }),
    (error) => send({ id: request.id, error: { code: -32000, message: error.message, data: error.code } }),
  );
});
