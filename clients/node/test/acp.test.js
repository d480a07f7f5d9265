// An ACP-daemon-like host (examples/acp-daemon.js), run as an unprivileged user inside a
// cgroup of the test's: the kernel's account of everything the host, its agents and their
// tools start, however they detach. Its agent (examples/acp-agent.js) asks permission for each
// tool (each text block of the prompt), which the host's default policy allows, and starts each
// tool in a session and process group of its own.

import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { Cgroup, alive, comm, exited, jsonLines, procStat, runAs, stop, testEnv, waitFor } from "./helpers.js";

const packageDir = fileURLToPath(new URL("..", import.meta.url));
const daemonScript = fileURLToPath(new URL("../examples/acp-daemon.js", import.meta.url));

/** Tools in different styles: a plain sleep, one that forks, one that also leaves its group. */
const TOOLS = ["exec sleep 600", "sleep 600 & exec sleep 600", "setsid sleep 600 & exec sleep 600"];

/** Starts the host in a new cgroup, a session, and a prompt whose tools all run. */
async function hostWithToolsRunning(t, label) {
  const cgroup = new Cgroup(label);
  t.after(() => cgroup.remove());
  const host = runAs(testEnv.user, cgroup, process.execPath, [daemonScript], {
    cwd: packageDir,
    stdio: ["pipe", "pipe", "inherit"],
    env: { ...process.env, LEASH_SOCKET: testEnv.socket, LEASH_BIN: testEnv.leash },
  });
  t.after(() => stop(host));
  const messages = jsonLines(host.stdout);
  const request = (id, method, params) => host.stdin.write(`${JSON.stringify({ id, method, params })}\n`);

  request(1, "session/new");
  const { result: session, error } = await messages.next("the session", (m) => m.id === 1);
  assert.equal(error, undefined, `the host could not start its agent: ${JSON.stringify(error)}`);
  assert.equal(typeof session.tree, "number", "the host knows its agent's tree");

  const prompt = TOOLS.map((text) => ({ type: "text", text }));
  request(2, "session/prompt", { sessionId: session.sessionId, prompt });
  const tools = [];
  for (const _ of TOOLS) {
    const running = (m) => m.method === "session/update" && m.params.update.status === "in_progress";
    const update = await messages.next("a tool call running", running);
    assert.equal(update.params.sessionId, session.sessionId, "relayed under the host's session id");
    tools.push(update.params.update._meta.pid);
  }
  // Every tool runs, and so do the processes they start (5 sleeps in all).
  const sleeps = () => cgroup.procs().filter((pid) => comm(pid) === "sleep");
  await waitFor(() => sleeps().length === 5, { what: "the tools' five sleeps", detail: () => cgroup.describe() });
  const agentGroup = procStat(session.agentPid).pgid;
  for (const pid of tools) {
    assert.equal(procStat(pid).pgid, pid, "each tool leads a process group of its own");
    assert.notEqual(procStat(pid).pgid, agentGroup);
  }
  return { cgroup, host, messages, request, session, tools, sleeps };
}

test("the agent SIGKILLed mid-tool: its tools die, the host lives on", async (t) => {
  const { cgroup, host, messages, request, session, tools } = await hostWithToolsRunning(t, "acp-agent");
  const others = cgroup.procs().filter((pid) => pid !== host.pid);
  assert.equal(others.length, 6, `the agent and its tools, five sleeps: ${cgroup.describe()}`);

  process.kill(session.agentPid, "SIGKILL");
  const exit = await messages.next("the agent's exit", (m) => m.method === "agent/exited");
  assert.equal(exit.params.signal, "SIGKILL");
  const turn = await messages.next("the prompt's answer", (m) => m.id === 2);
  assert.ok(turn.error, "the turn ended with the agent");
  // Everything the agent started is gone; the host alone is left in the group.
  await waitFor(() => cgroup.procs().every((pid) => pid === host.pid), {
    what: "the agent's tools to die",
    detail: () => cgroup.describe(),
  });
  for (const pid of [...tools, ...others]) assert.ok(!alive(pid), `${pid} outlived the agent`);
  assert.ok(alive(host.pid), "the host is untouched");

  request(3, "shutdown");
  await messages.next("the shutdown's answer", (m) => m.id === 3);
  assert.deepEqual(await exited(host), [0, null]);
  await cgroup.waitEmpty();
});

test("the host SIGKILLed mid-tool: its agent and every tool die with it", async (t) => {
  const { cgroup, host, session } = await hostWithToolsRunning(t, "acp-host");
  assert.ok(alive(session.agentPid));
  process.kill(host.pid, "SIGKILL");
  assert.deepEqual(await exited(host), [null, "SIGKILL"]);
  await cgroup.waitEmpty();
});

test("shutdown: lease.close() ends every session's tree before the host answers", async (t) => {
  const { cgroup, host, messages, request } = await hostWithToolsRunning(t, "acp-shutdown");
  request(3, "shutdown");
  await messages.next("the shutdown's answer", (m) => m.id === 3);
  // Answered after close() resolved: nothing but the host may be left.
  assert.deepEqual(
    cgroup.procs().filter((pid) => pid !== host.pid),
    [],
    `left after close(): ${cgroup.describe()}`,
  );
  assert.deepEqual(await exited(host), [0, null]);
});
