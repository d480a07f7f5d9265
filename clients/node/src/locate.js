// Where the daemon and the `leash` binary are: the options first, then the environment, then
// the defaults. Resolved once, at connect, so that every spawn runs the same shim against the
// same daemon whatever the host later does to its PATH or environment.

import { accessSync, constants, statSync } from "node:fs";
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
 * The absolute path of the `leash` binary: the option, else LEASH_BIN, else `leash` on PATH.
 * A name with a slash is a path (relative to the working directory); a bare name is looked up
 * on PATH.
 * @param {string} [option]
 * @returns {string}
 */
export function leashBinary(option) {
  const name = option || process.env.LEASH_BIN || "leash";
  const from = option ? "the leash option" : process.env.LEASH_BIN ? "LEASH_BIN" : "PATH";
  if (name.includes("/")) {
    const path = resolve(name);
    if (isExecutableFile(path)) return path;
    throw new LeashError(
      "unavailable",
      `the leash binary ${path} (from ${from}) is not an executable file: install leash, ` +
        "or set LEASH_BIN to its path",
    );
  }
  const dirs = (process.env.PATH ?? "").split(delimiter).filter(Boolean);
  for (const dir of dirs) {
    const path = resolve(dir, name);
    if (isExecutableFile(path)) return path;
  }
  throw new LeashError(
    "unavailable",
    `no \`${name}\` executable on PATH (${dirs.join(delimiter)}): install leash, or set ` +
      "LEASH_BIN to the path of its binary",
  );
}
