#!/usr/bin/env node
// An ACP-daemon-like host: a long-lived process that starts one ACP agent per session and
// relays between its client (stdin/stdout, one JSON-RPC message a line) and the agents. Each
// agent is spawned on the leash, so whatever it starts, even tools in process groups or
// sessions of their own, dies with it, and everything dies with this host, however it dies.
//
//   node examples/acp-daemon.js [--policy allow|reject|cancel]     (or: bun examples/acp-daemon.js)
//   {"id":1,"method":"session/new"}
//   {"id":2,"method":"session/prompt","params":{"sessionId":1,"prompt":[{"type":"text","text":"sleep 5"}]}}
//   {"id":3,"method":"shutdown"}
//
// To each agent this host is an ACP client: it sends `initialize` and `session/new`, relays
// prompts, relays the agent's session/update notifications to its own client (with its own
// session id), and answers the agent's session/request_permission itself, with its permission
// policy (below): by default it allows every tool call and logs it on stderr.
//
// The agent is examples/acp-agent.js (each text block of a prompt is a shell command it asks
// to run) unless session/new names another command ("params":{"command":["claude-agent-acp"]}).
// LEASH_SOCKET and LEASH_BIN are honoured; LEASH_OPTIONAL=1 runs the agents unleashed (with a
// warning) when leash is not installed.

import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { Lease } from "../src/index.js";

/** The first option of the first kind in `kinds` that the agent offers, selected; else cancelled. */
function select(options, kinds) {
  for (const kind of kinds) {
    const option = options.find((o) => o.kind === kind);
    if (option) return { outcome: "selected", optionId: option.optionId };
  }
  return { outcome: "cancelled" };
}

/** What a tool call is, for the log: its title and, for a shell tool, its command. */
const describe = (toolCall) =>
  `${JSON.stringify(toolCall.title ?? toolCall.toolCallId)}: ${toolCall.rawInput?.command ?? "(no command)"}`;

/**
 * Permission policies: the outcome this host answers an agent's session/request_permission
 * with. Each gets the request's params ({sessionId, toolCall, options}) and this host's own id
 * of the session. A desktop app would ask its user here; a daemon may decide by rule.
 */
const POLICIES = {
  /** The default: allow the call (once, or always if that is all that is offered), and log it. */
  allow: ({ toolCall, options }, sessionId) => {
    const outcome = select(options, ["allow_once", "allow_always"]);
    console.error(`acp-daemon: session ${sessionId}: ${outcome.optionId ?? "cancelled"} ${describe(toolCall)}`);
    return outcome;
  },
  /** Deny: the agent must not run the tool (the turn goes on without it). */
  reject: ({ toolCall, options }, sessionId) => {
    console.error(`acp-daemon: session ${sessionId}: rejected ${describe(toolCall)}`);
    return select(options, ["reject_once", "reject_always"]);
  },
  /** Cancel: what a client answers while it cancels the turn (after session/cancel). */
  cancel: () => ({ outcome: "cancelled" }),
};

const { values: flags } = parseArgs({ options: { policy: { type: "string", default: "allow" } } });
const permissionPolicy = POLICIES[flags.policy];
if (!permissionPolicy) {
  console.error(`acp-daemon: --policy must be one of ${Object.keys(POLICIES).join(", ")}`);
  process.exit(2);
}

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
  const session = { agent, agentSessionId: null, ready: null, pending: new Map(), nextId: 1 };
  sessions.set(sessionId, session);
  // A refused spawn is an 'error' (and no 'exit'): treeOf below rejects with it.
  agent.on("error", () => sessions.delete(sessionId));
  agent.on("exit", (code, signal) => {
    sessions.delete(sessionId);
    for (const { reject } of session.pending.values()) reject(new Error(`the agent exited (${signal ?? code})`));
    send({ method: "agent/exited", params: { sessionId, code, signal } });
  });
  createInterface({ input: agent.stdout }).on("line", (line) => fromAgent(sessionId, session, JSON.parse(line)));
  // The agent's own session, opened before any prompt is relayed (see handle).
  session.ready = (async () => {
    // The tree id, or the error that kept the agent from starting (no daemon, over the limit).
    const tree = await lease.treeOf(agent);
    await toAgent(session, "initialize", {
      protocolVersion: 1,
      clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
    });
    const { sessionId: agentSessionId } = await toAgent(session, "session/new", {
      cwd: params.cwd ?? process.cwd(),
      mcpServers: [],
    });
    session.agentSessionId = agentSessionId;
    return tree;
  })();
  return { sessionId, agentPid: agent.pid, tree: await session.ready };
}

/** A message from a session's agent: an answer, a request to this host, or a notification. */
function fromAgent(sessionId, session, message) {
  if (message.method === undefined) {
    const waiter = session.pending.get(message.id);
    if (!waiter) return;
    session.pending.delete(message.id);
    if (message.error) waiter.reject(new Error(message.error.message));
    else waiter.resolve(message.result);
  } else if (message.id !== undefined) {
    const reply =
      message.method === "session/request_permission"
        ? { result: { outcome: permissionPolicy(message.params, sessionId) } }
        : { error: { code: -32601, message: `method not found: ${message.method}` } };
    session.agent.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", id: message.id, ...reply })}\n`);
  } else {
    // A notification (session/update): relayed to the client, under this host's session id.
    send({ method: message.method, params: { ...message.params, sessionId } });
  }
}

function toAgent(session, method, params) {
  const id = session.nextId++;
  return new Promise((resolve, reject) => {
    session.pending.set(id, { resolve, reject });
    session.agent.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", id, method, params })}\n`);
  });
}

function sessionOf(params) {
  const session = sessions.get(params?.sessionId);
  if (!session) throw new Error(`no session ${params?.sessionId}`);
  return session;
}

async function handle({ method, params }) {
  switch (method) {
    case "session/new":
      return newSession(params);
    case "session/prompt": {
      const session = sessionOf(params);
      await session.ready;
      return toAgent(session, method, { ...params, sessionId: session.agentSessionId });
    }
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
  if (request.method === "session/cancel") {
    // A notification, relayed: the agent stops the turn's tools and answers it as cancelled.
    const session = sessions.get(request.params?.sessionId);
    const params = { sessionId: session?.agentSessionId };
    session?.agent.stdin.write(`${JSON.stringify({ jsonrpc: "2.0", method: "session/cancel", params })}\n`);
    return;
  }
  handle(request).then(
    (result) => send({ id: request.id, result }),
    (error) => send({ id: request.id, error: { code: -32000, message: error.message, data: error.code } }),
  );
});
