// The real Claude Agent SDK and Claude Code CLI from npm, run by a host that spawns the CLI
// through `claudeCodeSpawner(lease, { stderr })`: when the host is SIGKILLed in the middle of a tool call,
// nothing the agent started may live on, and nothing may act once leash has started the kill.
//
// The model is played by fake-anthropic.js on 127.0.0.1. It makes the agent start a background
// writer with `setsid` (which outlives its host without leash), then run a foreground loop that
// acts (touches ACTED) once RELEASE exists. The test SIGKILLs the host while the loop waits,
// creates RELEASE as soon as the daemon has started killing the tree (on its own: the host's
// death is all it is told), and asks the host's cgroup, which the kernel keeps exact, whether
// every process of the tree is gone.
//
// Environment: what tests/tests/host_node.rs sets (helpers.js, testEnv), with
// LEASH_TEST_NODE_MODULES holding the SDK, the CLI, typescript and @types/node (`cargo xtask
// test` installs them), and for measurements:
//   LEASH_SDK_TRIALS=N     how many times to run the scenario (default 1)
//   LEASH_SDK_BASELINE=1   also run the same scenario without leash: a measurement, in which the
//                          agent is expected to outlive its host and act

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { startFakeAnthropic } from "./fake-anthropic.js";
import { Cgroup, comm, runAs, stop, tempDir, testEnv, waitFor } from "./helpers.js";

const INSTALL_HINT = "run `cargo xtask test`, which installs them";
// Generous: the first start of the CLI (a 400 MB binary) on a loaded 2-core machine is slow.
const SCENARIO_READY_MS = 120_000;
// The daemon's default grace is 2 s; the tree must be empty well within this.
const EMPTY_DEADLINE_MS = 30_000;
// How long the baseline waits for the unleashed agent to act.
const BASELINE_ACT_DEADLINE_MS = 30_000;

test("the real Claude Agent SDK under leash: the host SIGKILLed mid-tool leaves no process and no action", async (t) => {
  const results = await runTrials(t, "leash", { leashed: true }, (result) => {
    const line =
      `${result.processesBeforeKill} processes before the host's SIGKILL; ` +
      `tree doomed after ${formatMs(result.doomMs)} (${result.doomReason}), empty after ` +
      `${formatMs(result.emptyMs)} (the daemon: ${result.kill.terminated} sent SIGTERM, ` +
      `${result.kill.killed} SIGKILL); ${result.acted ? "ACTED" : "no action"}`;
    return result.acted ? `${line}\n  what the tree did once doomed: ${result.afterDoom}` : line;
  });

  // Asserted once every trial has run, so that a measurement (LEASH_SDK_TRIALS) reports them
  // all; a trial whose cgroup never emptied has failed the test already.
  for (const [i, result] of results.entries()) {
    const trial = `trial ${i + 1}`;
    assert.ok(result.writerInCgroup, `${trial}: the setsid background writer was not in the host's cgroup`);
    assert.ok(
      ["lease_ended", "root_exited"].includes(result.doomReason),
      `${trial}: the tree was killed for ${result.doomReason}, not for its host's death`,
    );
    assert.equal(
      result.acted,
      false,
      `${trial}: the agent acted (ACTED exists) after leash had started the kill; the tree's ` +
        `events from then on: ${result.afterDoom}`,
    );
  }
});

if (process.env.LEASH_SDK_BASELINE === "1") {
  test("baseline (a measurement): the same scenario without leash", async (t) => {
    await runTrials(
      t,
      "baseline (no leash)",
      { leashed: false },
      (result) =>
        `${result.processesBeforeKill} processes before the host's SIGKILL; ` +
        `${result.acted ? `ACTED after ${formatMs(result.actedMs)}` : "no action"}; ` +
        `survivors then: ${result.survivors.join(", ") || "none"}`,
    );
  });
}

/** Runs the scenario LEASH_SDK_TRIALS times, printing `describe(result)` for each trial and a
 * summary at the end; returns the results. */
async function runTrials(t, name, options, describe) {
  const config = readConfig();
  const trials = trialCount();
  const setup = prepareHostDir(config);
  t.after(setup.remove);
  const results = [];
  for (let i = 1; i <= trials; i++) {
    const result = await runTrial(config, setup, options);
    results.push(result);
    console.log(`${name} trial ${i}/${trials}: ${describe(result)}`);
  }
  const summary = summarize(name, results);
  console.log(summary);
  t.diagnostic(summary);
  return results;
}

test("the TypeScript example type-checks against the SDK's and leash-client's declarations", (t) => {
  const config = readConfig();
  const tsc = path.join(config.nodeModules, "typescript", "bin", "tsc");
  const nodeTypes = path.join(config.nodeModules, "@types", "node");
  for (const needed of [tsc, nodeTypes]) {
    if (!fs.existsSync(needed)) {
      throw new Error(`${needed} is missing (typescript and @types/node): ${INSTALL_HINT}`);
    }
  }
  // A project as an app would have it: the example beside a node_modules with the SDK and
  // leash-client. The SDK's optional peers (@anthropic-ai/sdk, MCP, zod) are not installed, so
  // skipLibCheck lets the types that come from them be `any`; the spawner's contract with the
  // SDK (SpawnOptions in, SpawnedProcess out) is checked in full.
  const project = tempDir("sdk-example");
  t.after(project.remove);
  const modules = path.join(project.path, "node_modules");
  fs.mkdirSync(path.join(modules, "@anthropic-ai"), { recursive: true });
  fs.mkdirSync(path.join(modules, "@types"));
  fs.symlinkSync(config.sdkDir, path.join(modules, "@anthropic-ai", "claude-agent-sdk"));
  fs.symlinkSync(nodeTypes, path.join(modules, "@types", "node"));
  fs.symlinkSync(config.clientDir, path.join(modules, config.clientName));
  const example = "claude-agent-sdk.ts";
  fs.copyFileSync(path.join(config.clientDir, "examples", example), path.join(project.path, example));
  fs.writeFileSync(path.join(project.path, "package.json"), JSON.stringify({ type: "module" }));
  const compilerOptions = {
    target: "es2022",
    module: "nodenext",
    moduleResolution: "nodenext",
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    // What Node's own type stripping runs as is.
    verbatimModuleSyntax: true,
    erasableSyntaxOnly: true,
    types: ["node"],
  };
  fs.writeFileSync(path.join(project.path, "tsconfig.json"), JSON.stringify({ compilerOptions, files: [example] }));
  const run = spawnSync(process.execPath, [tsc, "-p", project.path], { encoding: "utf8", timeout: 120_000 });
  assert.equal(run.status, 0, `tsc on examples/${example}:\n${run.stdout}${run.stderr}${run.error ?? ""}`);
});

/** The scenario once: start the host in a cgroup of its own, kill it mid-tool, watch. */
async function runTrial(config, setup, { leashed }) {
  const scratch = fs.mkdtempSync(path.join(setup.path, "trial-"));
  fs.chmodSync(scratch, 0o755);
  const work = path.join(scratch, "work");
  const home = path.join(scratch, "home");
  const tmp = path.join(home, "tmp");
  for (const dir of [work, home, tmp]) {
    fs.mkdirSync(dir, { mode: 0o755 });
    fs.chownSync(dir, config.uid, config.uid);
  }
  const file = (name) => path.join(work, name);
  const fake = await startFakeAnthropic({
    script: [
      // Detached from the agent's session and process group, with stdio of its own: what a
      // background tool looks like, and what nothing but leash follows.
      { bash: `setsid sh -c 'while :; do date +%s%N >> ${file("BG")}; sleep 0.2; done' >/dev/null 2>&1 </dev/null &` },
      { bash: `touch ${file("WAITING")}; until [ -e ${file("RELEASE")} ]; do sleep 0.2; done; touch ${file("ACTED")}` },
      { text: "The loop ended." },
    ],
  });
  let cgroup;
  let host;
  let daemon;
  let output = "";
  const hostSaid = () => `the host's output (last 8 KB):\n${output}`;
  try {
    cgroup = new Cgroup("sdk");
    // The daemon's events say when it dooms the host's tree (root sees every tree's).
    daemon = leashed ? await DaemonEvents.subscribe(config.socket) : null;
    host = runAs(config.uid, cgroup, process.execPath, [setup.hostScript], {
      cwd: setup.path,
      env: {
        PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin",
        LEASH_SOCKET: config.socket,
        LEASH_BIN: config.leash,
        HOST_MODE: leashed ? "leash" : "plain",
        CLAUDE_CODE_EXECUTABLE: config.cli,
        AGENT_WORKDIR: work,
        HOME: home,
        // Claude Code's scratch files, in the trial's directory rather than /tmp.
        TMPDIR: tmp,
        CLAUDE_CODE_TMPDIR: tmp,
        ANTHROPIC_BASE_URL: fake.url,
        ANTHROPIC_API_KEY: "not-a-real-key",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const keep = (chunk) => {
      output = (output + chunk).slice(-8192);
    };
    host.stdout.on("data", keep);
    host.stderr.on("data", keep);

    await waitFor(
      () => {
        if (host.exitCode !== null || host.signalCode !== null) {
          throw new Error(`the host ended (${host.signalCode ?? `exit code ${host.exitCode}`}) early; ${hostSaid()}`);
        }
        return fake.hasServed(1) && fs.existsSync(file("WAITING")) && lineCount(file("BG")) >= 2;
      },
      {
        what: "the agent to run the loop, with the background writer running",
        timeoutMs: SCENARIO_READY_MS,
        detail: hostSaid,
      },
    );
    const before = cgroup.procs();
    const result = {
      processesBeforeKill: before.length,
      writerInCgroup: before.some((pid) => cmdline(pid).includes(file("BG"))),
      survivors: [],
      acted: false,
      doomMs: null,
      doomReason: null,
      emptyMs: null,
      actedMs: null,
      afterDoom: null,
      kill: null,
    };

    const killedAt = performance.now();
    process.kill(host.pid, "SIGKILL");
    if (leashed) {
      // RELEASE appears once the daemon has started killing the tree on its own (the host's
      // death is all it is told): from then on nothing in the tree may act. In the few
      // milliseconds before, while the daemon learns of the death, an agent can still act,
      // and no test could tell that from a failure.
      const doom = await waitFor(() => daemon.killStarted(before), {
        what: "the daemon to start killing the host's tree",
        timeoutMs: EMPTY_DEADLINE_MS,
        intervalMs: 1,
        detail: () => `its events: ${JSON.stringify(daemon.events.slice(-20))}`,
      });
      result.doomMs = doom.at - killedAt;
      result.doomReason = doom.reason;
      fs.writeFileSync(file("RELEASE"), "");
      await cgroup.waitEmpty({ timeoutMs: EMPTY_DEADLINE_MS, intervalMs: 2 });
      result.emptyMs = performance.now() - killedAt;
      result.afterDoom = daemon.describeFrom(doom);
      // The daemon's account of the kill: how many members got SIGTERM, and how many SIGKILL
      // (those born after the doom at once, the others if the grace ran out).
      const empty = await waitFor(() => daemon.treeEmpty(doom.tree), {
        what: "the daemon's tree_empty event for the host's tree",
        timeoutMs: EMPTY_DEADLINE_MS,
        detail: () => `its events: ${JSON.stringify(daemon.events.slice(-20))}`,
      });
      result.kill = empty.kill;
    } else {
      fs.writeFileSync(file("RELEASE"), "");
      const acted = await waitFor(() => fs.existsSync(file("ACTED")), {
        timeoutMs: BASELINE_ACT_DEADLINE_MS,
        intervalMs: 2,
      }).catch(() => false);
      if (acted) result.actedMs = performance.now() - killedAt;
      result.survivors = cgroup.procs().map((pid) => `${pid} ${comm(pid)}`);
    }
    // Read once the cgroup is empty (with leash): nothing is left that could still write it.
    result.acted = fs.existsSync(file("ACTED"));
    return result;
  } finally {
    daemon?.close();
    if (host) await stop(host);
    await cgroup?.remove();
    await fake.close();
    fs.rmSync(scratch, { recursive: true, force: true });
  }
}

/**
 * A directory every user may read, holding the host script, a copy of the library (the test
 * user may not read where it is) and a link to the SDK, laid out as an app's node_modules.
 */
function prepareHostDir({ sdkDir, clientDir, clientName }) {
  const dir = tempDir("sdk-host");
  const modules = path.join(dir.path, "node_modules");
  fs.mkdirSync(path.join(modules, "@anthropic-ai"), { recursive: true });
  fs.cpSync(clientDir, path.join(modules, clientName), {
    recursive: true,
    filter: (source) => !source.split(path.sep).includes("node_modules"),
  });
  fs.symlinkSync(sdkDir, path.join(modules, "@anthropic-ai", "claude-agent-sdk"));
  const hostScript = path.join(dir.path, "host.mjs");
  fs.writeFileSync(hostScript, hostSource(clientName));
  makeWorldReadable(dir.path);
  return { ...dir, hostScript };
}

// The host: what a desktop app that opens Claude Code through the SDK does, with the one
// change leash asks for (HOST_MODE=plain is the same app without it, for the baseline).
function hostSource(clientName) {
  return `import { spawn } from "node:child_process";
import { query } from "@anthropic-ai/claude-agent-sdk";

let spawnClaudeCodeProcess;
if (process.env.HOST_MODE === "leash") {
  const { Lease, claudeCodeSpawner } = await import(${JSON.stringify(clientName)});
  const lease = await Lease.connect();
  // query()'s own stderr option is ignored once a spawner is given: it goes here.
  spawnClaudeCodeProcess = claudeCodeSpawner(lease, {
    stderr: (text) => process.stderr.write(\`claude stderr: \${text}\`),
  });
} else {
  spawnClaudeCodeProcess = (o) =>
    spawn(o.command, o.args, { cwd: o.cwd, env: o.env, signal: o.signal, stdio: ["pipe", "pipe", "inherit"] });
}

const conversation = query({
  prompt: "Run the two steps of the test script.",
  options: {
    pathToClaudeCodeExecutable: process.env.CLAUDE_CODE_EXECUTABLE,
    cwd: process.env.AGENT_WORKDIR,
    permissionMode: "bypassPermissions",
    allowDangerouslySkipPermissions: true,
    settingSources: [],
    persistSession: false,
    mcpServersDelivery: "initialize",
    spawnClaudeCodeProcess,
  },
});
for await (const message of conversation) {
  console.log("host: message", message.type, message.subtype ?? "");
}
console.log("host: the conversation ended");
`;
}

function readConfig() {
  if (process.getuid() !== 0) {
    throw new Error("this test runs as root: it makes cgroups and runs the host as LEASH_TEST_USER");
  }
  const nodeModules = testEnv.nodeModules;
  const sdkDir = path.join(nodeModules, "@anthropic-ai", "claude-agent-sdk");
  if (!fs.existsSync(path.join(sdkDir, "package.json"))) {
    throw new Error(`the Claude Agent SDK is not in ${nodeModules} (no ${sdkDir}): ${INSTALL_HINT}`);
  }
  const clientDir = fileURLToPath(new URL("..", import.meta.url));
  const clientName = JSON.parse(fs.readFileSync(path.join(clientDir, "package.json"), "utf8")).name;
  return {
    uid: testEnv.user,
    socket: testEnv.socket,
    leash: testEnv.leash,
    nodeModules,
    sdkDir,
    cli: claudeCodeExecutable(nodeModules),
    clientDir,
    clientName,
  };
}

/**
 * The CLI's native binary: @anthropic-ai/claude-code's bin/claude.exe once its install script
 * has put the binary there, else the platform package's `claude` that it copies.
 */
function claudeCodeExecutable(nodeModules) {
  const scope = path.join(nodeModules, "@anthropic-ai");
  const candidates = [
    path.join(scope, "claude-code", "bin", "claude.exe"),
    path.join(scope, `claude-code-linux-${process.arch}`, "claude"),
    path.join(scope, `claude-code-linux-${process.arch}-musl`, "claude"),
  ];
  for (const candidate of candidates) {
    // Until the install script runs, bin/claude.exe is a short shell script saying so.
    if (fs.statSync(candidate, { throwIfNoEntry: false })?.size > 1_000_000) return candidate;
  }
  throw new Error(`the Claude Code CLI is not in ${nodeModules} (none of ${candidates.join(", ")}): ${INSTALL_HINT}`);
}

function trialCount() {
  const raw = process.env.LEASH_SDK_TRIALS ?? "1";
  const trials = Number(raw);
  if (!Number.isInteger(trials) || trials < 1) {
    throw new Error(`LEASH_SDK_TRIALS must be a positive integer, not ${raw}`);
  }
  return trials;
}

function summarize(label, results) {
  const withSurvivors = results.filter((r) => r.survivors.length > 0).length;
  const acted = results.filter((r) => r.acted).length;
  let line = `${label}: ${results.length} trials, ${withSurvivors} with survivors, ${acted} ACTED`;
  const spread = (what, key) => {
    const times = results.map((r) => r[key]).filter((ms) => ms !== null).sort((a, b) => a - b);
    if (times.length === 0) return;
    line += `; ${what}: median ${formatMs(median(times))}, max ${formatMs(times[times.length - 1])}`;
    if (times.length < results.length) line += ` (${results.length - times.length} never)`;
  };
  spread("from the host's SIGKILL to the tree doomed", "doomMs");
  spread("to an empty cgroup", "emptyMs");
  spread("to ACTED", "actedMs");
  return line;
}

function median(sorted) {
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

function formatMs(ms) {
  return ms === null ? "never" : `${ms.toFixed(1)} ms`;
}

function lineCount(file) {
  try {
    return fs.readFileSync(file, "utf8").split("\n").filter(Boolean).length;
  } catch {
    return 0;
  }
}

function cmdline(pid) {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ");
  } catch {
    return "";
  }
}

function makeWorldReadable(dir) {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    if (entry.isSymbolicLink()) continue;
    if (entry.isDirectory()) {
      fs.chmodSync(full, 0o755);
      makeWorldReadable(full);
    } else {
      fs.chmodSync(full, fs.statSync(full).mode & 0o100 ? 0o755 : 0o644);
    }
  }
}

/**
 * The daemon's events, read with a client of the test's own (JSON lines, docs/PROTOCOL.md) so
 * that the referee does not depend on the library under test.
 */
class DaemonEvents {
  static async subscribe(socket) {
    const conn = net.createConnection(socket);
    await new Promise((resolve, reject) => {
      conn.once("connect", resolve);
      conn.once("error", (error) => reject(new Error(`connecting to the daemon at ${socket}: ${error.message}`)));
    });
    const events = new DaemonEvents(conn);
    conn.write(`${JSON.stringify({ id: 1, op: "subscribe" })}\n`);
    const reply = await waitFor(() => events.replies[0], { what: "the daemon's answer to subscribe" });
    if (!reply.ok) {
      conn.destroy();
      throw new Error(`the daemon refused to subscribe: ${JSON.stringify(reply)}`);
    }
    return events;
  }

  constructor(conn) {
    this.conn = conn;
    /** Events in arrival order, each with `at`: performance.now() when it was read. */
    this.events = [];
    this.replies = [];
    let buffered = "";
    conn.setEncoding("utf8");
    conn.on("data", (chunk) => {
      const at = performance.now();
      buffered += chunk;
      let newline;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const message = JSON.parse(buffered.slice(0, newline));
        buffered = buffered.slice(newline + 1);
        if (message.event) this.events.push({ at, ...message.event });
        else this.replies.push(message);
      }
    });
    // A lost connection shows as a missing event, which the wait for it names.
    conn.on("error", () => {});
  }

  /** The `kill_started` event of a tree whose root is one of `pids`, if it came. */
  killStarted(pids) {
    const trees = new Set(
      this.events.filter((e) => e.kind === "registered" && pids.includes(e.pid)).map((e) => e.tree),
    );
    return this.events.find((e) => e.kind === "kill_started" && trees.has(e.tree));
  }

  /** The `tree_empty` event of `tree`, if it came. */
  treeEmpty(tree) {
    return this.events.find((e) => e.kind === "tree_empty" && e.tree === tree);
  }

  /** The events of `from`'s tree from `from` on, briefly, for a failure's message. */
  describeFrom(from) {
    const start = this.events.indexOf(from);
    return this.events
      .slice(start)
      .filter((e) => e.tree === from.tree)
      .map((e) => [e.kind, e.pid, e.comm].filter((field) => field != null).join(" "))
      .join(", ");
  }

  close() {
    this.conn.destroy();
  }
}
