// The report of `leash exec --status-fd`: one JSON line saying whether the command was
// registered (and its tree), refused (the daemon's code and words), then, if the command could
// not be executed, a second line with its errno. End of file after "registered" means the
// command runs (the descriptor is close-on-exec).

/** A report is two short lines; anything longer is not the shim. */
const MAX_REPORT_CHARS = 64 * 1024;

/**
 * One line of the report, as JSON.parse makes it (or the line itself, if it is not JSON).
 * @typedef {{
 *   registered?: { tree: number, root: number },
 *   exec_failed?: { errno: number, message?: string },
 *   error?: { code: string, message: string },
 *   unreadable?: string,
 * }} ReportLine
 */

/**
 * What became of the command: see outcomeOf.
 * @typedef {{ kind: "running", tree: number, root: number }
 *   | { kind: "exec_failed", tree: number, root: number, errno: number, message?: string }
 *   | { kind: "refused", code: string, message: string }
 *   | { kind: "silent" }
 *   | { kind: "unreadable", line: string }} Outcome
 */

/**
 * Reads `stream` to its end; resolves to the report's lines, parsed.
 * @param {import("node:stream").Readable} stream
 * @returns {Promise<ReportLine[]>}
 */
export function readReport(stream) {
  return new Promise((resolve) => {
    let text = "";
    let settled = false;
    const settle = () => {
      if (settled) return;
      settled = true;
      resolve(parseReport(text));
    };
    stream.setEncoding("utf8");
    stream.on("data", (/** @type {string} */ chunk) => {
      text += chunk;
      if (text.length > MAX_REPORT_CHARS) settle();
    });
    stream.once("end", settle);
    stream.once("close", settle);
    // Reading a pipe whose writer is gone can fail (ECONNRESET); that is the end of it too.
    stream.on("error", settle);
  });
}

/**
 * @param {string} text
 * @returns {ReportLine[]}
 */
function parseReport(text) {
  return text
    .split("\n")
    .filter((line) => line.trim())
    .map((line) => {
      try {
        return JSON.parse(line);
      } catch {
        return { unreadable: line.slice(0, 200) };
      }
    });
}

/**
 * What became of the command, from the report's lines:
 *   { kind: "running", tree, root }
 *   { kind: "exec_failed", tree, root, errno, message }
 *   { kind: "refused", code, message }
 *   { kind: "silent" }                 (no line: the shim died before it could say)
 *   { kind: "unreadable", line }
 * @param {ReportLine[]} lines
 * @returns {Outcome}
 */
export function outcomeOf(lines) {
  const [first, second] = lines;
  if (!first) return { kind: "silent" };
  if (first.registered) {
    const { tree, root } = first.registered;
    if (second?.exec_failed) return { kind: "exec_failed", tree, root, ...second.exec_failed };
    return { kind: "running", tree, root };
  }
  if (first.error) return { kind: "refused", code: first.error.code, message: first.error.message };
  return { kind: "unreadable", line: first.unreadable ?? JSON.stringify(first).slice(0, 200) };
}
