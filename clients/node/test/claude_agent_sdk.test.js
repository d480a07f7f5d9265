// The real Claude Agent SDK and Claude Code CLI from npm, run by a host that spawns the CLI
// through `lease.claudeCodeSpawner()`: when the host is SIGKILLed in the middle of a tool call,
// nothing the agent started may live on, and nothing may act afterwards.
//
// The model is played by fake-anthropic.js on 127.0.0.1. It makes the agent start a background
// writer with `setsid` (which outlives its host without leash), then run a foreground loop that
// acts (touches ACTED) once RELEASE exists. The test SIGKILLs the host while the loop waits,
// creates RELEASE, and asks the host's cgroup, which the kernel keeps exact, whether every
// process of the tree is gone.
//
// Environment (the Rust driver tests/tests/host_node.rs sets the first four):
//   LEASH_SOCKET             the daemon's socket
//   LEASH_BIN                a leash binary every user may execute (the shim)
//   LEASH_TEST_USER          the unprivileged uid the host runs as (as root the CLI refuses to
//                            skip permission prompts, and a desktop host is no root either)
//   LEASH_TEST_NODE_MODULES  node_modules holding the SDK and the CLI (`cargo xtask test`)
//   LEASH_SDK_TRIALS=N       how many times to run the scenario (default 1)
//   LEASH_SDK_BASELINE=1     also run the same scenario without leash: a measurement, in which
//                            the agent is expected to survive its host and act

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';

import { startFakeAnthropic } from './fake-anthropic.js';

const INSTALL_HINT = 'run `cargo xtask test`, which installs them';
// Generous: the first start of the CLI (a 400 MB binary) on a loaded 2-core machine is slow.
const SCENARIO_READY_MS = 120_000;
// The daemon's default grace is 2 s; the tree must be empty well within this.
const EMPTY_DEADLINE_MS = 30_000;
// How long the baseline waits for the unleashed agent to act.
const BASELINE_ACT_DEADLINE_MS = 30_000;

const config = readConfig();

test('the real Claude Agent SDK under leash: the host SIGKILLed mid-tool leaves no process and no action', async (t) => {
  const trials = trialCount();
  const setup = prepareHostDir(config);
  t.after(() => fs.rmSync(setup.dir, { recursive: true, force: true }));

  const results = [];
  for (let i = 1; i <= trials; i++) {
    const result = await runTrial(setup, { leashed: true });
    results.push(result);
    console.log(
      `leash trial ${i}/${trials}: ${result.processesBeforeKill} processes before the host's SIGKILL; ` +
        `tree doomed after ${formatMs(result.doomMs)} (${result.doomReason}), empty after ` +
        `${formatMs(result.emptyMs)}; ${result.survivors.length} survivors; ${result.acted ? 'ACTED' : 'no action'}`,
    );
  }
  const summary = summarize('leash', results);
  console.log(summary);
  t.diagnostic(summary);

  for (const [i, r] of results.entries()) {
    const trial = `trial ${i + 1}`;
    assert.ok(r.writerInCgroup, `${trial}: the setsid background writer was not in the host's cgroup before the kill`);
    assert.ok(
      ['lease_ended', 'root_exited'].includes(r.doomReason),
      `${trial}: the tree was killed for ${r.doomReason}, not for its host's death`,
    );
    assert.deepEqual(r.survivors, [], `${trial}: processes outlived the host by ${EMPTY_DEADLINE_MS} ms`);
    assert.equal(r.acted, false, `${trial}: the agent acted (ACTED exists) after its host was killed`);
  }
});

if (process.env.LEASH_SDK_BASELINE === '1') {
  test('baseline (measurement): the same scenario without leash', async (t) => {
    const trials = trialCount();
    const setup = prepareHostDir(config);
    t.after(() => fs.rmSync(setup.dir, { recursive: true, force: true }));

    const results = [];
    for (let i = 1; i <= trials; i++) {
      const result = await runTrial(setup, { leashed: false });
      results.push(result);
      console.log(
        `baseline trial ${i}/${trials}: ${result.processesBeforeKill} processes before the host's SIGKILL, ` +
          `${result.survivors.length} survivors (${result.survivors.join(', ')}), ` +
          `${result.acted ? `ACTED after ${formatMs(result.actedMs)}` : 'no action'}`,
      );
    }
    const summary = summarize('baseline (no leash)', results);
    console.log(summary);
    t.diagnostic(summary);
  });
}

test('the TypeScript example type-checks against the SDK and leash-client declarations', (t) => {
  const tsc = path.join(config.nodeModules, 'typescript', 'bin', 'tsc');
  const nodeTypes = path.join(config.nodeModules, '@types', 'node');
  for (const needed of [tsc, nodeTypes]) {
    if (!fs.existsSync(needed)) {
      throw new Error(`${needed} is missing (typescript and @types/node): ${INSTALL_HINT}`);
    }
  }
  // A project as an app would have it: the example beside a node_modules with the SDK and
  // leash-client. The SDK's optional peers (@anthropic-ai/sdk, MCP, zod) are not installed,
  // so skipLibCheck lets the types that come from them be `any`; the spawner's contract with
  // the SDK (SpawnOptions in, SpawnedProcess out) is checked in full.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leash-sdk-example-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const modules = path.join(dir, 'node_modules');
  fs.mkdirSync(path.join(modules, '@anthropic-ai'), { recursive: true });
  fs.mkdirSync(path.join(modules, '@types'), { recursive: true });
  fs.symlinkSync(config.sdkDir, path.join(modules, '@anthropic-ai', 'claude-agent-sdk'));
  fs.symlinkSync(nodeTypes, path.join(modules, '@types', 'node'));
  fs.symlinkSync(config.clientDir, path.join(modules, ...config.clientName.split('/')));
  fs.copyFileSync(path.join(config.clientDir, 'examples', 'claude-agent-sdk.ts'), path.join(dir, 'claude-agent-sdk.ts'));
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ type: 'module' }));
  fs.writeFileSync(
    path.join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        target: 'es2022',
        module: 'nodenext',
        moduleResolution: 'nodenext',
        strict: true,
        noEmit: true,
        skipLibCheck: true,
        // What Node's own type stripping can run as is.
        verbatimModuleSyntax: true,
        erasableSyntaxOnly: true,
        types: ['node'],
      },
      files: ['claude-agent-sdk.ts'],
    }),
  );
  const run = spawnSync(process.execPath, [tsc, '-p', dir], { encoding: 'utf8', timeout: 120_000 });
  assert.equal(run.status, 0, `tsc found errors in examples/claude-agent-sdk.ts:\n${run.stdout}${run.stderr}`);
});

/** The scenario once: start the host in a cgroup of its own, kill it mid-tool, watch. */
async function runTrial(setup, { leashed }) {
  const scratch = fs.mkdtempSync(path.join(setup.dir, 'trial-'));
  fs.chmodSync(scratch, 0o755);
  const work = path.join(scratch, 'work');
  const home = path.join(scratch, 'home');
  const tmp = path.join(home, 'tmp');
  for (const dir of [work, home, tmp]) {
    fs.mkdirSync(dir, { mode: 0o755 });
    fs.chownSync(dir, config.uid, config.uid);
  }
  const file = (name) => path.join(work, name);
  const fake = await startFakeAnthropic({
    script: [
      // Detached from the agent's session and process group, with its own stdio: what a
      // background tool looks like, and what nothing but leash follows.
      { bash: `setsid sh -c 'while :; do date +%s%N >> ${file('BG')}; sleep 0.2; done' >/dev/null 2>&1 </dev/null &` },
      { bash: `touch ${file('WAITING')}; until [ -e ${file('RELEASE')} ]; do sleep 0.2; done; touch ${file('ACTED')}` },
      { text: 'The loop ended.' },
    ],
  });
  let cgroup;
  let host;
  let daemon;
  try {
    cgroup = Cgroup.create(`leash-test-sdk-${process.pid}-${path.basename(scratch)}`);
    // The daemon's events say when it dooms the host's tree (root sees every tree's).
    daemon = leashed ? await DaemonEvents.subscribe(config.socket) : null;
    host = startHost(setup, cgroup, {
      leashed,
      env: {
        HOME: home,
        TMPDIR: tmp,
        CLAUDE_CODE_TMPDIR: tmp,
        AGENT_WORKDIR: work,
        ANTHROPIC_BASE_URL: fake.url,
        ANTHROPIC_API_KEY: 'not-a-real-key',
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
      },
    });

    await waitFor(
      () => fake.hasServed(1) && fs.existsSync(file('WAITING')) && lineCount(file('BG')) >= 2,
      SCENARIO_READY_MS,
      () => `the agent to be running the loop with the background writer alive (${host.describe()})`,
      () => host.exited,
    );
    const before = cgroup.processes();
    const writerInCgroup = before.some((p) => p.cmdline.includes(file('BG')));
    const result = {
      processesBeforeKill: before.length,
      writerInCgroup,
      survivors: [],
      acted: false,
      doomMs: null,
      doomReason: null,
      emptyMs: null,
      actedMs: null,
    };

    const killedAt = performance.now();
    process.kill(host.pid, 'SIGKILL');
    if (leashed) {
      // RELEASE appears once the daemon has started killing the tree on its own (the host's
      // death is all it is told): from then on nothing in the tree may act. Before that, an
      // agent may act in the few milliseconds the daemon takes to notice, which no test can
      // tell from a failure.
      const trees = new Set();
      const pids = new Set(before.map((p) => p.pid));
      let doom;
      await waitFor(
        () => {
          for (const e of daemon.events) {
            if (e.kind === 'registered' && pids.has(e.pid)) trees.add(e.tree);
          }
          doom = daemon.events.find((e) => e.kind === 'kill_started' && trees.has(e.tree));
          return doom !== undefined;
        },
        EMPTY_DEADLINE_MS,
        () =>
          `the daemon to start killing the host's tree (trees registered from the host's cgroup: ` +
          `${[...trees].join(', ') || 'none'}; events: ${JSON.stringify(daemon.events.slice(-20))})`,
      );
      result.doomMs = doom.at - killedAt;
      result.doomReason = doom.reason;
      fs.writeFileSync(file('RELEASE'), '');
      const emptied = await waitUntil(() => !cgroup.populated(), EMPTY_DEADLINE_MS, 2);
      if (emptied) result.emptyMs = performance.now() - killedAt;
    } else {
      fs.writeFileSync(file('RELEASE'), '');
      const acted = await waitUntil(() => fs.existsSync(file('ACTED')), BASELINE_ACT_DEADLINE_MS, 5);
      if (acted) result.actedMs = performance.now() - killedAt;
    }
    result.survivors = cgroup.processes().map(describeProcess);
    // Read once the cgroup is empty (leash) or the agent acted (baseline): in the first case
    // nothing is left that could still write ACTED.
    result.acted = fs.existsSync(file('ACTED'));
    return result;
  } finally {
    try {
      daemon?.close();
      if (host && !host.exited) host.kill();
      await cgroup?.destroy();
    } finally {
      await fake.close();
      fs.rmSync(scratch, { recursive: true, force: true });
    }
  }
}

/** Starts the host as the test user inside `cgroup`: in it before it runs anything. */
function startHost(setup, cgroup, { leashed, env }) {
  const child = spawn(
    '/bin/sh',
    [
      '-c',
      'echo $$ > "$1" && shift && exec "$@"',
      'sh',
      cgroup.procsFile,
      'setpriv',
      `--reuid=${config.uid}`,
      `--regid=${config.uid}`,
      '--clear-groups',
      '--',
      process.execPath,
      setup.hostScript,
    ],
    {
      cwd: setup.dir,
      env: {
        PATH: process.env.PATH ?? '/usr/local/bin:/usr/bin:/bin',
        LEASH_SOCKET: config.socket,
        LEASH_BIN: config.leashBin,
        HOST_MODE: leashed ? 'leash' : 'plain',
        CLAUDE_CODE_EXECUTABLE: config.cli,
        ...env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let output = '';
  const keep = (chunk) => {
    // The last few KB are enough to say what went wrong.
    output = (output + chunk.toString()).slice(-8192);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const host = {
    pid: child.pid,
    exited: false,
    exitStatus: null,
    kill: () => child.kill('SIGKILL'),
    describe: () =>
      host.exited
        ? `the host exited early with ${host.exitStatus}; its output:\n${output}`
        : `the host is running; its output so far:\n${output}`,
  };
  child.on('exit', (code, signal) => {
    host.exited = true;
    host.exitStatus = signal ?? `code ${code}`;
  });
  return host;
}

/**
 * A directory every user may read, holding the host script, a copy of the library (the test user
 * cannot read the clone) and a link to the SDK, laid out as an app's node_modules would be.
 */
function prepareHostDir({ sdkDir, clientDir, clientName }) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leash-sdk-test-'));
  fs.chmodSync(dir, 0o755);
  const modules = path.join(dir, 'node_modules');
  const client = path.join(modules, ...clientName.split('/'));
  fs.mkdirSync(path.dirname(client), { recursive: true });
  fs.cpSync(clientDir, client, {
    recursive: true,
    filter: (src) => !src.split(path.sep).includes('node_modules'),
  });
  fs.mkdirSync(path.join(modules, '@anthropic-ai'), { recursive: true });
  fs.symlinkSync(sdkDir, path.join(modules, '@anthropic-ai', 'claude-agent-sdk'));
  const hostScript = path.join(dir, 'host.mjs');
  fs.writeFileSync(hostScript, hostSource(clientName));
  makeWorldReadable(dir);
  return { dir, hostScript };
}

// The host: what a desktop app that opens Claude Code through the SDK does, with the one-line
// change leash asks for (HOST_MODE=plain is the same app without it, for the baseline).
function hostSource(clientName) {
  return `import { spawn } from 'node:child_process';
import { query } from '@anthropic-ai/claude-agent-sdk';

let spawnClaudeCodeProcess;
if (process.env.HOST_MODE === 'leash') {
  const { Lease } = await import(${JSON.stringify(clientName)});
  const lease = await Lease.connect();
  spawnClaudeCodeProcess = lease.claudeCodeSpawner();
} else {
  spawnClaudeCodeProcess = (o) =>
    spawn(o.command, o.args, { cwd: o.cwd, env: o.env, signal: o.signal, stdio: ['pipe', 'pipe', 'inherit'] });
}

const conversation = query({
  prompt: 'Run the two steps of the test script.',
  options: {
    pathToClaudeCodeExecutable: process.env.CLAUDE_CODE_EXECUTABLE,
    cwd: process.env.AGENT_WORKDIR,
    permissionMode: 'bypassPermissions',
    allowDangerouslySkipPermissions: true,
    settingSources: [],
    persistSession: false,
    mcpServersDelivery: 'initialize',
    spawnClaudeCodeProcess,
  },
});
for await (const message of conversation) {
  console.log('host: message', message.type, message.subtype ?? '');
}
console.log('host: the conversation ended');
`;
}

function readConfig() {
  const missing = ['LEASH_SOCKET', 'LEASH_BIN', 'LEASH_TEST_USER', 'LEASH_TEST_NODE_MODULES'].filter(
    (name) => !process.env[name],
  );
  if (missing.length > 0) {
    throw new Error(
      `${missing.join(', ')} not set: this test runs under tests/tests/host_node.rs ` +
        `(cargo test -p leash-tests --test host_node); for the SDK and the CLI, ${INSTALL_HINT}`,
    );
  }
  if (process.getuid() !== 0) {
    throw new Error('this test runs as root: it makes cgroups and runs the host as LEASH_TEST_USER');
  }
  const uid = Number(process.env.LEASH_TEST_USER);
  if (!Number.isInteger(uid) || uid <= 0) {
    throw new Error(`LEASH_TEST_USER must be a non-root uid, not ${process.env.LEASH_TEST_USER}`);
  }
  const nodeModules = process.env.LEASH_TEST_NODE_MODULES;
  const sdkDir = path.join(nodeModules, '@anthropic-ai', 'claude-agent-sdk');
  if (!fs.existsSync(path.join(sdkDir, 'package.json'))) {
    throw new Error(`the Claude Agent SDK is not in ${nodeModules} (no ${sdkDir}): ${INSTALL_HINT}`);
  }
  const clientDir = fileURLToPath(new URL('..', import.meta.url));
  const clientName = JSON.parse(fs.readFileSync(path.join(clientDir, 'package.json'), 'utf8')).name;
  return {
    uid,
    nodeModules,
    socket: process.env.LEASH_SOCKET,
    leashBin: process.env.LEASH_BIN,
    sdkDir,
    cli: claudeCodeExecutable(nodeModules),
    clientDir,
    clientName,
  };
}

/**
 * The CLI's native binary: @anthropic-ai/claude-code's bin/claude.exe once its install script has
 * put the binary there, else the platform package's `claude` it would have copied.
 */
function claudeCodeExecutable(nodeModules) {
  const stub = path.join(nodeModules, '@anthropic-ai', 'claude-code', 'bin', 'claude.exe');
  const candidates = [
    stub,
    path.join(nodeModules, '@anthropic-ai', `claude-code-linux-${process.arch}`, 'claude'),
    path.join(nodeModules, '@anthropic-ai', `claude-code-linux-${process.arch}-musl`, 'claude'),
  ];
  for (const candidate of candidates) {
    // The placeholder bin/claude.exe is a short shell script; the binary is hundreds of MB.
    if (fs.statSync(candidate, { throwIfNoEntry: false })?.size > 1_000_000) return candidate;
  }
  throw new Error(
    `the Claude Code CLI binary is not in ${nodeModules} (looked for ${candidates.join(', ')}): ${INSTALL_HINT}`,
  );
}

function trialCount() {
  const raw = process.env.LEASH_SDK_TRIALS ?? '1';
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
  spread("host's SIGKILL to the tree doomed", 'doomMs');
  spread("host's SIGKILL to an empty cgroup", 'emptyMs');
  spread("host's SIGKILL to ACTED", 'actedMs');
  return line;
}

function median(sorted) {
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

function formatMs(ms) {
  return ms === null ? 'never' : `${ms.toFixed(1)} ms`;
}

function lineCount(file) {
  try {
    return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).length;
  } catch {
    return 0;
  }
}

function describeProcess(p) {
  return `${p.pid} ${p.comm}`;
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

/** Polls `condition` every `intervalMs` until it holds (true) or `timeoutMs` passes (false). */
async function waitUntil(condition, timeoutMs, intervalMs = 20) {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (condition()) return true;
    if (performance.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** Like waitUntil, but throws saying what it waited for; `gaveUp` ends the wait early. */
async function waitFor(condition, timeoutMs, what, gaveUp = () => false) {
  const met = await waitUntil(() => condition() || gaveUp(), timeoutMs);
  if (!met || !condition()) {
    throw new Error(`gave up waiting for ${what()}`);
  }
}

/**
 * A subscription to the daemon's events, read with a client of the test's own (JSON lines, as in
 * docs/PROTOCOL.md), so that the referee does not depend on the library under test.
 */
class DaemonEvents {
  static async subscribe(socket) {
    const conn = net.createConnection(socket);
    await new Promise((resolve, reject) => {
      conn.once('connect', resolve);
      conn.once('error', (err) => reject(new Error(`connecting to the daemon at ${socket}: ${err.message}`)));
    });
    const events = new DaemonEvents(conn);
    conn.write(`${JSON.stringify({ id: 1, op: 'subscribe' })}\n`);
    await waitFor(() => events.replies.length > 0, 10_000, () => `the daemon's answer to subscribe`);
    if (!events.replies[0].ok) {
      conn.destroy();
      throw new Error(`the daemon refused subscribe: ${JSON.stringify(events.replies[0])}`);
    }
    return events;
  }

  constructor(conn) {
    this.conn = conn;
    /** Events in arrival order, each with `at` (performance.now() when it was read). */
    this.events = [];
    this.replies = [];
    let buffered = '';
    conn.setEncoding('utf8');
    conn.on('data', (chunk) => {
      const at = performance.now();
      buffered += chunk;
      let newline;
      while ((newline = buffered.indexOf('\n')) >= 0) {
        const message = JSON.parse(buffered.slice(0, newline));
        buffered = buffered.slice(newline + 1);
        if (message.event) this.events.push({ at, ...message.event });
        else this.replies.push(message);
      }
    });
    conn.on('error', () => {}); // a lost connection shows as missing events, which the test names
  }

  close() {
    this.conn.destroy();
  }
}

/** A cgroup v2 group of the test's own: the kernel's exact list of the host's processes. */
class Cgroup {
  static create(name) {
    const dir = path.join(cgroup2Root(), name);
    fs.mkdirSync(dir);
    return new Cgroup(dir);
  }

  constructor(dir) {
    this.dir = dir;
    this.procsFile = path.join(dir, 'cgroup.procs');
  }

  /** Whether any thread is left (cgroup.events; a process whose main thread exited counts). */
  populated() {
    return /^populated 1$/m.test(fs.readFileSync(path.join(this.dir, 'cgroup.events'), 'utf8'));
  }

  /**
   * The processes in the group, with their command lines: cgroup.procs, and the processes of the
   * threads in cgroup.threads (some kernels leave a process whose main thread has exited out of
   * cgroup.procs while its other threads run).
   */
  processes() {
    const pids = new Set(readPids(path.join(this.dir, 'cgroup.procs')));
    for (const tid of readPids(path.join(this.dir, 'cgroup.threads'))) {
      pids.add(processOfThread(tid) ?? tid);
    }
    return [...pids].map((pid) => ({ pid, comm: readComm(pid), cmdline: readCmdline(pid) }));
  }

  /** Kills whatever is left and removes the group. */
  async destroy() {
    if (!fs.existsSync(this.dir)) return;
    fs.writeFileSync(path.join(this.dir, 'cgroup.kill'), '1');
    // cgroup.kill is asynchronous: the group can be removed once its last task has gone.
    if (!(await waitUntil(() => !this.populated(), 10_000))) {
      throw new Error(`cgroup ${this.dir} still has ${JSON.stringify(this.processes())} after cgroup.kill`);
    }
    fs.rmdirSync(this.dir);
  }
}

function readPids(file) {
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map(Number);
}

function processOfThread(tid) {
  try {
    const match = /^Tgid:\s+(\d+)$/m.exec(fs.readFileSync(`/proc/${tid}/status`, 'utf8'));
    return match ? Number(match[1]) : null;
  } catch {
    return null; // gone meanwhile
  }
}

function readComm(pid) {
  try {
    return fs.readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return '(gone)';
  }
}

function readCmdline(pid) {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ');
  } catch {
    return '';
  }
}

/** Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts). */
function cgroup2Root() {
  for (const line of fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const [before, after] = line.split(' - ');
    if (after && after.split(' ')[0] === 'cgroup2') return before.split(' ')[4];
  }
  throw new Error('no cgroup2 file system is mounted: the test uses cgroup v2 as its referee');
}
