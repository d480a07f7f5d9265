// A scripted stand-in for the Anthropic Messages API on 127.0.0.1, so that the real Claude Code
// CLI can run tool calls offline. It plays the model: the agent conversation follows a script of
// turns, and every request is recorded for the test's assertions.
//
// What the CLI needs (and all this serves): `HEAD /` (a reachability check), then
// `POST /v1/messages` with `"stream": true`, answered with server-sent events (message_start,
// content_block_start, content_block_delta, content_block_stop, message_delta, message_stop).
// Requests whose `tools` carry no `Bash` tool are side requests (a session title, a summary):
// they get a short text and never advance the script.

import http from "node:http";

// Tool-use ids are ours and numbered by step, so a tool_result in a later request says which
// step the agent has finished, whatever else the conversation holds.
const TOOL_USE_PREFIX = "toolu_leash_step_";

// A request body larger than this is refused: the test's conversations are a few hundred KB.
const MAX_BODY_BYTES = 16 * 1024 * 1024;

/**
 * A turn of the script: `{ bash: 'COMMAND' }` makes the model call the Bash tool with that
 * command (and wait for its result), `{ text: '...' }` ends the model's turn with that text.
 * @typedef {{ bash: string } | { text: string }} Turn
 */

/**
 * Starts the fake on 127.0.0.1 at a port of the system's choosing.
 * @param {{ script: Turn[] }} options
 */
export async function startFakeAnthropic({ script }) {
  if (!Array.isArray(script) || script.length === 0) {
    throw new Error("startFakeAnthropic needs a non-empty script of turns");
  }
  const fake = new FakeAnthropic(script);
  await fake.listen();
  return fake;
}

class FakeAnthropic {
  /** @param {Turn[]} script */
  constructor(script) {
    this.script = script;
    /** Every request, in arrival order: {method, url, body} (body parsed when it is JSON). */
    this.requests = [];
    /** The steps of the script served so far, in order (a step served twice is a retry). */
    this.served = [];
    this.server = http.createServer((req, res) => this.handle(req, res));
    // The CLI keeps connections alive; close() must not wait for them.
    this.sockets = new Set();
    this.server.on("connection", (socket) => {
      this.sockets.add(socket);
      socket.on("close", () => this.sockets.delete(socket));
    });
  }

  listen() {
    return new Promise((resolve, reject) => {
      this.server.once("error", reject);
      this.server.listen(0, "127.0.0.1", () => {
        this.server.off("error", reject);
        const { port } = this.server.address();
        this.url = `http://127.0.0.1:${port}`;
        resolve();
      });
    });
  }

  /** Whether the model has asked for script step `step` (0-based) at least once. */
  hasServed(step) {
    return this.served.includes(step);
  }

  /** The agent conversation's requests (those offering the Bash tool). */
  agentRequests() {
    return this.requests.filter((r) => offersBash(r.body));
  }

  close() {
    for (const socket of this.sockets) socket.destroy();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  handle(req, res) {
    const chunks = [];
    let size = 0;
    req.on("data", (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      let body = text;
      try {
        body = text ? JSON.parse(text) : null;
      } catch {
        // Recorded as text: the assertions say what was expected.
      }
      this.requests.push({ method: req.method, url: req.url, body });
      this.respond(req, res, body);
    });
  }

  respond(req, res, body) {
    const path = req.url.split("?")[0];
    if (req.method === "HEAD" || (req.method === "GET" && path === "/")) {
      res.writeHead(200, { "content-type": "text/plain" });
      res.end();
      return;
    }
    if (req.method === "POST" && path === "/v1/messages/count_tokens") {
      sendJson(res, 200, { input_tokens: 1 });
      return;
    }
    if (req.method !== "POST" || path !== "/v1/messages" || typeof body !== "object" || !body) {
      sendJson(res, 404, {
        type: "error",
        error: { type: "not_found_error", message: `the fake serves no ${req.method} ${path}` },
      });
      return;
    }
    const model = typeof body.model === "string" ? body.model : "claude-fake";
    let content;
    let stopReason;
    if (offersBash(body)) {
      const step = stepsFinished(body.messages);
      const turn = this.script[Math.min(step, this.script.length - 1)];
      this.served.push(step);
      if ("bash" in turn && step < this.script.length) {
        content = {
          type: "tool_use",
          id: `${TOOL_USE_PREFIX}${step}`,
          name: "Bash",
          input: { command: turn.bash, description: `Step ${step} of the test's script` },
        };
        stopReason = "tool_use";
      } else {
        content = { type: "text", text: "text" in turn ? turn.text : "Done." };
        stopReason = "end_turn";
      }
    } else {
      content = { type: "text", text: "Leash test" };
      stopReason = "end_turn";
    }
    if (body.stream) {
      streamMessage(res, model, content, stopReason);
    } else {
      sendJson(res, 200, message(model, [content], stopReason));
    }
  }
}

function offersBash(body) {
  return (
    typeof body === "object" &&
    body !== null &&
    Array.isArray(body.tools) &&
    body.tools.some((tool) => tool && tool.name === "Bash")
  );
}

/** How many of the script's steps have a tool_result in the conversation so far. */
function stepsFinished(messages) {
  const answered = new Set();
  for (const msg of Array.isArray(messages) ? messages : []) {
    if (!msg || msg.role !== "user" || !Array.isArray(msg.content)) continue;
    for (const block of msg.content) {
      if (
        block &&
        block.type === "tool_result" &&
        typeof block.tool_use_id === "string" &&
        block.tool_use_id.startsWith(TOOL_USE_PREFIX)
      ) {
        answered.add(block.tool_use_id);
      }
    }
  }
  return answered.size;
}

let messageCount = 0;

function message(model, content, stopReason) {
  messageCount += 1;
  return {
    id: `msg_leash_${messageCount}`,
    type: "message",
    role: "assistant",
    model,
    content,
    stop_reason: stopReason,
    stop_sequence: null,
    usage: { input_tokens: 1, output_tokens: 1 },
  };
}

function streamMessage(res, model, block, stopReason) {
  res.writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    connection: "keep-alive",
  });
  const send = (type, data) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
  const start = message(model, [], null);
  start.stop_reason = null;
  send("message_start", { message: start });
  if (block.type === "tool_use") {
    send("content_block_start", {
      index: 0,
      content_block: { type: "tool_use", id: block.id, name: block.name, input: {} },
    });
    send("content_block_delta", {
      index: 0,
      delta: { type: "input_json_delta", partial_json: JSON.stringify(block.input) },
    });
  } else {
    send("content_block_start", { index: 0, content_block: { type: "text", text: "" } });
    send("content_block_delta", { index: 0, delta: { type: "text_delta", text: block.text } });
  }
  send("content_block_stop", { index: 0 });
  send("message_delta", {
    delta: { stop_reason: stopReason, stop_sequence: null },
    usage: { output_tokens: 1 },
  });
  send("message_stop", {});
  res.end();
}

function sendJson(res, status, value) {
  const text = JSON.stringify(value);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}
