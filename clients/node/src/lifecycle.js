// Holds back a child's lifecycle events ('spawn', 'exit', 'close') until the shim has said
// whether the command runs, so that a refusal or an exec failure reaches the host as an
// 'error' event *before* 'exit' or 'close', as a failed spawn does in node.

/** @type {Set<string | symbol>} */
const HELD = new Set(["spawn", "exit", "close"]);

/**
 * Starts holding `child`'s lifecycle events. Call `run()` once the command runs (the events
 * held are delivered in their order, and later ones pass), or `fail(error)` if it never ran
 * ('error' first; then 'close', while 'spawn' and 'exit' are dropped for good, since there
 * was no command to spawn or exit).
 * @param {import("node:child_process").ChildProcess} child
 */
export function holdLifecycle(child) {
  const hadOwnEmit = Object.hasOwn(child, "emit");
  /** @type {(this: unknown, name: string | symbol, ...args: any[]) => boolean} */
  const emit = child.emit;
  /** @type {[string | symbol, any[]][]} */
  const held = [];
  let mode = "hold";
  /** @type {(value: [number | null, NodeJS.Signals | null]) => void} */
  let exited;
  /** @type {Promise<[number | null, NodeJS.Signals | null]>} */
  const exit = new Promise((resolve) => {
    exited = resolve;
  });

  // One signature for every event: node's overloads, per event, are what it passes on.
  child.emit = /** @type {typeof child.emit} */ (
    /**
     * @this {unknown}
     * @param {string | symbol} name
     * @param {...any} args
     */
    function emitHeld(name, ...args) {
      if (mode === "hold" && HELD.has(name)) {
        held.push([name, args]);
        if (name === "exit") exited(/** @type {[number | null, NodeJS.Signals | null]} */ (args));
        return true;
      }
      if (mode === "failed" && (name === "spawn" || name === "exit")) return false;
      return emit.call(this, name, ...args);
    }
  );

  /** @param {(name: string | symbol) => boolean} keep */
  const flush = (keep) => {
    for (const [name, args] of held.splice(0)) {
      if (keep(name)) emit.call(child, name, ...args);
    }
  };

  return {
    /** Resolves to [code, signal] when the shim (or the command) exits. */
    exit,
    run() {
      if (mode !== "hold") return;
      mode = "run";
      if (hadOwnEmit) child.emit = emit;
      // The child's own emit came from its prototype: remove the one put over it.
      else delete /** @type {{ emit?: unknown }} */ (child).emit;
      flush(() => true);
    },
    /** @param {unknown} error */
    fail(error) {
      if (mode !== "hold") return;
      mode = "failed";
      try {
        emit.call(child, "error", error);
      } finally {
        flush((name) => name === "close");
      }
    },
  };
}
