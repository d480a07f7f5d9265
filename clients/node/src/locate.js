// Where the daemon and the `leash` binary are: the options first, then the environment, then
// what is installed (the binary of the platform package), then the defaults. Resolved once, at
// connect, so that every spawn runs the same shim against the same daemon whatever the host
// later does to its PATH or environment.

import { accessSync, constants, existsSync, readFileSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { delimiter, resolve } from "node:path";
import { LeashError } from "./errors.js";

export const DEFAULT_SOCKET = "/run/leash/leash.sock";

/**
 * The daemon's socket: the option, else LEASH_SOCKET, else the default.
 * @param {string} [option]
 * @returns {string}
 */
export function socketPath(option) {
  return option || process.env.LEASH_SOCKET || DEFAULT_SOCKET;
}

/** @param {string} path */
function isExecutableFile(path) {
  try {
    accessSync(path, constants.X_OK);
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/**
 * The package that carries the `leash` binary for this machine, `leash-client-linux-x64` or
 * `leash-client-linux-arm64`: an optional dependency of a released leash-client, installed only
 * where its `os` and `cpu` match.
 * @returns {string}
 */
export function platformPackage() {
  return `leash-client-${process.platform}-${process.arch}`;
}

/**
 * Whether this leash-client names a platform package for this machine among its optional
 * dependencies: a released one does, for linux-x64 and linux-arm64; a source checkout's
 * package.json names none (they are added when it is packed), and no other platform has one.
 * Where it names none, no install can bring the binary.
 * @returns {boolean}
 */
export function namesPlatformPackage() {
  try {
    const manifest = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
    return Object.prototype.hasOwnProperty.call(
      manifest.optionalDependencies ?? {},
      platformPackage(),
    );
  } catch {
    return false;
  }
}

/**
 * Where the platform package's binary is, if that package is installed (resolved as an import
 * of this package would, so wherever npm, pnpm or Bun put it); else null.
 * @returns {string | null}
 */
export function packagedBinary() {
  try {
    return createRequire(import.meta.url).resolve(`${platformPackage()}/bin/leash`);
  } catch {
    return null;
  }
}

/**
 * The absolute path of the `leash` binary: the option, else LEASH_BIN, else the one the
 * platform package carries, else `leash` on PATH. A name with a slash is a path (relative to
 * the working directory); a bare name is looked up on PATH.
 * @param {string} [option]
 * @param {string | null} [packaged] the platform package's binary (for the tests)
 * @param {boolean} [named] whether this package names a platform package (for the tests)
 * @returns {string}
 */
export function leashBinary(option, packaged = packagedBinary(), named = namesPlatformPackage()) {
  const chosen = option || process.env.LEASH_BIN;
  if (chosen) {
    const from = option ? "the leash option" : "LEASH_BIN";
    if (chosen.includes("/")) {
      const path = resolve(chosen);
      if (isExecutableFile(path)) return path;
      throw new LeashError(
        "unavailable",
        `the leash binary ${path} (from ${from}) is not an executable file: install leash, ` +
          "or set LEASH_BIN to its path",
      );
    }
    const found = onPath(chosen);
    if (found) return found;
    throw new LeashError(
      "unavailable",
      `no \`${chosen}\` executable on PATH (${process.env.PATH ?? ""}), as ${from} names it: ` +
        "install leash, or set LEASH_BIN to the path of its binary",
    );
  }
  if (packaged && isExecutableFile(packaged)) return packaged;
  const found = onPath("leash");
  if (found) return found;
  const pkg = platformPackage();
  if (!named && !packaged) {
    // A source checkout, or a platform with no package: LEASH_BIN or PATH it must be.
    throw new LeashError(
      "unavailable",
      "no leash binary: set LEASH_BIN to the path of one (from a clone, target/debug/leash " +
        "after `cargo build`), or install leash so that `leash` is on PATH " +
        `(${process.env.PATH ?? ""}); this leash-client names no ${pkg} package to carry it`,
    );
  }
  const packagedSays =
    packaged && existsSync(packaged)
      ? `${packaged} (of ${pkg}) is not executable`
      : `no ${pkg} package is installed (the optional dependency that carries it)`;
  throw new LeashError(
    "unavailable",
    `no leash binary: LEASH_BIN is not set, ${packagedSays}, and there is no \`leash\` ` +
      `executable on PATH (${process.env.PATH ?? ""}): install leash-client with its optional ` +
      "dependencies (not --omit=optional), install leash, or set LEASH_BIN to the path of its binary",
  );
}

/**
 * `name` in PATH's directories, as an absolute path, or null.
 * @param {string} name
 * @returns {string | null}
 */
function onPath(name) {
  const dirs = (process.env.PATH ?? "").split(delimiter).filter(Boolean);
  for (const dir of dirs) {
    const path = resolve(dir, name);
    if (isExecutableFile(path)) return path;
  }
  return null;
}
