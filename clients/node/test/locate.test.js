// Where the library finds the `leash` binary: the option, then LEASH_BIN, then the binary of
// the platform package (leash-client-linux-x64 or -arm64, installed beside leash-client), then
// `leash` on PATH; where no platform package can be installed (a source checkout), the error
// says LEASH_BIN first. No daemon is needed: these look at files only.

import assert from "node:assert/strict";
import { chmodSync, cpSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { test } from "node:test";
import { LeashError } from "../src/index.js";
import { leashBinary, namesPlatformPackage, platformPackage } from "../src/locate.js";
import { tempDir } from "./helpers.js";

const sources = fileURLToPath(new URL("../src", import.meta.url));

/** An executable (or not) file at `path`. */
function fakeLeash(path, executable = true) {
  mkdirSync(join(path, ".."), { recursive: true });
  writeFileSync(path, "#!/bin/sh\nexit 0\n");
  chmodSync(path, executable ? 0o755 : 0o644);
  return path;
}

/** Runs `body` with PATH and LEASH_BIN set as given (undefined: unset), then restores them. */
function withEnv(env, body) {
  const saved = { PATH: process.env.PATH, LEASH_BIN: process.env.LEASH_BIN };
  try {
    for (const [name, value] of Object.entries(env)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
    return body();
  } finally {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  }
}

test("the option, then LEASH_BIN, then the platform package's binary, then PATH", (t) => {
  const dir = tempDir("locate");
  t.after(dir.remove);
  const option = fakeLeash(join(dir.path, "option/leash"));
  const fromEnv = fakeLeash(join(dir.path, "env/leash"));
  const packaged = fakeLeash(join(dir.path, "package/bin/leash"));
  const onPath = fakeLeash(join(dir.path, "path/leash"));
  const path = join(dir.path, "path");
  withEnv({ PATH: path, LEASH_BIN: fromEnv }, () => {
    assert.equal(leashBinary(option, packaged), option);
    assert.equal(leashBinary(undefined, packaged), fromEnv);
  });
  withEnv({ PATH: path, LEASH_BIN: undefined }, () => {
    assert.equal(leashBinary(undefined, packaged), packaged);
    assert.equal(leashBinary(undefined, null), onPath);
    // A packaged file without its executable bit is passed over.
    fakeLeash(packaged, false);
    assert.equal(leashBinary(undefined, packaged), onPath);
  });
  withEnv({ PATH: join(dir.path, "empty"), LEASH_BIN: undefined }, () => {
    assert.throws(
      () => leashBinary(undefined, packaged),
      (error) =>
        error instanceof LeashError &&
        error.code === "unavailable" &&
        error.message.includes(`${packaged} (of ${platformPackage()}) is not executable`) &&
        error.message.includes("LEASH_BIN is not set"),
    );
  });
});

test("the platform package is found where npm installs it, beside leash-client", async (t) => {
  const dir = tempDir("locate-npm");
  t.after(dir.remove);
  // node_modules/leash-client/src (a copy of this package's sources) and the platform package.
  const modules = join(dir.path, "node_modules");
  cpSync(sources, join(modules, "leash-client/src"), { recursive: true });
  writeFileSync(join(modules, "leash-client/package.json"), JSON.stringify({ type: "module" }));
  const platform = join(modules, platformPackage());
  mkdirSync(platform, { recursive: true });
  writeFileSync(join(platform, "package.json"), "{}");
  const binary = fakeLeash(join(platform, "bin/leash"));
  const installed = await import(pathToFileURL(join(modules, "leash-client/src/locate.js")).href);
  assert.equal(installed.packagedBinary(), binary);
  withEnv({ PATH: join(dir.path, "empty"), LEASH_BIN: undefined }, () => {
    assert.equal(installed.leashBinary(), binary);
  });
  // This checkout has no platform package installed.
  const { packagedBinary } = await import("../src/locate.js");
  assert.equal(packagedBinary(), null);
});

test("with no platform package to install, the error leads with LEASH_BIN", (t) => {
  const dir = tempDir("locate-none");
  t.after(dir.remove);
  // This checkout's package.json names no platform package: they are added when it is packed.
  assert.equal(namesPlatformPackage(), false);
  const unavailable = (named) => {
    try {
      withEnv({ PATH: join(dir.path, "empty"), LEASH_BIN: undefined }, () =>
        leashBinary(undefined, null, named),
      );
    } catch (error) {
      assert.ok(error instanceof LeashError && error.code === "unavailable", String(error));
      return error.message;
    }
    assert.fail("a leash binary was found");
  };
  const fromClone = unavailable(false);
  assert.match(fromClone, /^no leash binary: set LEASH_BIN to the path of one/);
  assert.ok(!fromClone.includes("optional"), fromClone);
  assert.ok(fromClone.includes(`names no ${platformPackage()} package`), fromClone);
  // A released leash-client installed without its optional dependencies says to add them.
  const released = unavailable(true);
  assert.ok(released.includes(`no ${platformPackage()} package is installed`), released);
  assert.ok(released.includes("not --omit=optional"), released);
});
