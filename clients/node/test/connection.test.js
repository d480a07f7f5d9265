// The lease against a fake daemon (a Unix socket server in this test), for what a real one
// does only at its end or never: why it closed the connection (its `closing` event), a request
// another process sent on the lease's connection (a `refused` event), and lines this library
// does not understand. Also the grace a host gives, checked at connect.

import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer } from "node:net";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { Lease, LeashError } from "../src/index.js";
import { tempDir } from "./helpers.js";

const HELLO = { hello: { protocol: 1, daemon_version: "fake", lease: { id: 7, token: "t0k3n" } } };

/**
 * A daemon on a socket of its own that answers `hello`, then hands every other request to
 * `answer(request, client)`; `client.send(line)` writes a line (an object as JSON).
 */
async function fakeDaemon(t, answer) {
  const dir = tempDir("fake-daemon", 0o700);
  t.after(dir.remove);
  const socket = `${dir.path}/leash.sock`;
  const clients = new Set();
  const server = createServer((connection) => {
    clients.add(connection);
    connection.on("error", () => {});
    connection.on("close", () => clients.delete(connection));
    const client = {
      send: (line) => connection.write(`${typeof line === "string" ? line : JSON.stringify(line)}\n`),
      end: () => connection.end(),
    };
    createInterface({ input: connection }).on("line", (line) => {
      const request = JSON.parse(line);
      if (request.op === "hello") client.send({ id: request.id, ok: HELLO });
      else answer(request, client);
    });
  });
  server.listen(socket);
  await once(server, "listening");
  t.after(() => {
    for (const connection of clients) connection.destroy();
    server.close();
  });
  // Any executable file does for the binary: nothing here spawns.
  const lease = await Lease.connect({ socket, leash: process.execPath });
  t.after(() => lease.close().catch(() => {}));
  return { socket, lease };
}

/** The daemon answers a `list` with its `closing` event (if `reason`), then closes. */
async function closedBy(t, reason) {
  const { socket, lease } = await fakeDaemon(t, (request, client) => {
    if (request.op !== "list") return client.send({ id: request.id, ok: {} });
    if (reason) client.send({ event: { kind: "closing", tree: 0, lease: 7, reason } });
    client.end();
  });
  const error = await lease.trees().then(
    () => assert.fail("trees() resolved on a connection the daemon closed"),
    (e) => e,
  );
  assert.ok(error instanceof LeashError, `${error}`);
  assert.equal(error.code, "unavailable");
  assert.ok(error.message.includes(socket), error.message);
  return error.message;
}

test("closed for a shutdown: the error says the daemon killed the lease's trees", async (t) => {
  const message = await closedBy(t, "shutdown");
  assert.match(message, /^the leash daemon at \S+ stopped \(shutdown\): it killed this lease's trees\. /);
  assert.match(message, /The next call connects again, with a new lease/);
  assert.doesNotMatch(message, /stay enforced/);
});

test("closed for a hand-over: the error says the trees stay enforced by the next daemon", async (t) => {
  const message = await closedBy(t, "hand_over");
  assert.match(
    message,
    /^the leash daemon at \S+ handed its trees over to the next daemon: they stay enforced .*; the next call connects again, with a new lease$/,
  );
});

test("closed for not reading: the error says what the host left unread and that its trees died", async (t) => {
  const message = await closedBy(t, "not_reading");
  assert.match(message, /ended this lease \(not_reading\): this host left more than 128 KiB .* unread/);
  assert.match(message, /the daemon killed the lease's trees/);
});

test("closed without a reason: the error says it cannot tell what became of the trees", async (t) => {
  const message = await closedBy(t, null);
  assert.match(
    message,
    /^the connection to the leash daemon at \S+ closed without a reason: the daemon kills a lease's trees when its connection ends, unless it handed them over\. The next call connects again/,
  );
});

test("after a closing event, the events iterators end with the same error", async (t) => {
  const { lease } = await fakeDaemon(t, (request, client) => {
    client.send({ id: request.id, ok: {} });
    if (request.op === "subscribe") {
      client.send({ event: { kind: "closing", tree: 0, lease: 7, reason: "shutdown" } });
      client.end();
    }
  });
  const seen = [];
  await assert.rejects(
    async () => {
      for await (const event of lease.events()) seen.push(event.kind);
    },
    (e) => e.code === "unavailable" && /stopped \(shutdown\)/.test(e.message),
  );
  assert.deepEqual(seen, ["closing"]);
});

test("a refused event: a warning with the pid and the line, and the lease goes on", async (t) => {
  const refused = '{"id":2,"op":"release","tree":3}';
  const { lease } = await fakeDaemon(t, (request, client) => {
    if (request.op === "list") {
      client.send({ event: { kind: "refused", tree: 0, lease: 7, pid: 4300, code: "permission_denied", line: refused } });
      client.send({ id: request.id, ok: { trees: [] } });
    } else {
      client.send({ id: request.id, ok: {} });
    }
  });
  const warned = once(process, "warning");
  assert.deepEqual(await lease.trees(), [], "the request after the refusal is answered");
  const [warning] = await warned;
  assert.equal(warning.name, "LeashWarning");
  assert.equal(warning.code, "LEASH_REFUSED");
  assert.match(warning.message, /refused a request that process 4300 sent on this lease's connection \(permission_denied\); the lease goes on/);
  assert.ok(warning.message.endsWith(`The request: ${refused}`), warning.message);
  assert.deepEqual(await lease.trees(), [], "and so is the next");
});

/** The daemon answers a `list` with `line`; the error it ends the lease with. */
async function protocolErrorFor(t, line) {
  const { lease } = await fakeDaemon(t, (request, client) => {
    client.send(typeof line === "function" ? line(request) : line);
  });
  const error = await lease.trees().then(
    () => assert.fail("trees() resolved after a line this library does not understand"),
    (e) => e,
  );
  assert.ok(error instanceof LeashError, `${error}`);
  assert.equal(error.code, "protocol");
  assert.match(error.message, /The lease ends, to be safe: the daemon kills this lease's 0 trees, since the lease ended/);
  return error.message;
}

test("a line that is not JSON ends the lease: the error quotes it", async (t) => {
  const message = await protocolErrorFor(t, "hello, this is not JSON");
  assert.match(message, /sent a line this library does not understand \(not JSON\)\. /);
  assert.ok(message.endsWith("The line: hello, this is not JSON"), message);
});

test("a reply to no request ends the lease: the error quotes at most 200 bytes of it", async (t) => {
  // 2-byte characters, so that 200 bytes fall in the middle of one: cut before it.
  const line = JSON.stringify({ id: 99, ok: { note: "é".repeat(300) } });
  const message = await protocolErrorFor(t, line);
  assert.match(message, /\(a reply to no request of this lease's\)\. /);
  const quoted = /The line: (.*)\.\.\.$/.exec(message)?.[1];
  assert.ok(quoted, message);
  assert.ok(line.startsWith(quoted), "the first bytes of the line");
  assert.equal(Buffer.byteLength(quoted), 199, "200 bytes, less the half character");
});

test("an event without a kind, or a reply with neither ok nor error, ends the lease", async (t) => {
  assert.match(await protocolErrorFor(t, '{"event":{"tree":1}}'), /\(an event without a kind\)\. .*The line: \{"event":\{"tree":1\}\}$/);
  const message = await protocolErrorFor(t, (request) => JSON.stringify({ id: request.id, answer: 42 }));
  assert.match(message, /\(a reply with no ok nor error\)\. .*The line: \{"id":\d+,"answer":42\}$/);
});

test("graceMs out of range is refused at connect, naming the range", async () => {
  const range = /graceMs must be a whole number of milliseconds from 0 to 600000 \(10 minutes\)/;
  for (const graceMs of [-1, 1.5, Number.NaN, Infinity, 600_001, 1e12]) {
    await assert.rejects(
      // No daemon needed: it is refused before any connection.
      Lease.connect({ socket: "/nonexistent/leash.sock", graceMs }),
      (e) => e instanceof RangeError && range.test(e.message) && e.message.endsWith(`: ${graceMs}`),
      `graceMs: ${graceMs}`,
    );
  }
  await assert.rejects(
    Lease.connect({ socket: "/nonexistent/leash.sock", graceMs: /** @type {any} */ ("2000") }),
    (e) => e instanceof TypeError && /not a string: 2000/.test(e.message),
  );
  // The bounds themselves pass the check (and the connection then fails, for want of a daemon).
  for (const graceMs of [0, 600_000]) {
    await assert.rejects(
      Lease.connect({ socket: "/nonexistent/leash.sock", leash: process.execPath, graceMs }),
      (e) => e instanceof LeashError && e.code === "unavailable",
    );
  }
});

test("graceMs out of range is refused by spawn, kill and close too, before the daemon hears of it", async (t) => {
  const { lease } = await fakeDaemon(t, (request, client) => client.send({ id: request.id, ok: {} }));
  assert.throws(() => lease.spawn("true", [], { graceMs: 600_001 }), RangeError);
  await assert.rejects(lease.kill(1, { graceMs: -5 }), RangeError);
  await assert.rejects(lease.adopt(process.pid, { graceMs: 0.5 }), RangeError);
  await assert.rejects(lease.close({ graceMs: Infinity }), RangeError);
});
