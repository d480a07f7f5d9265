// Holds back a child's lifecycle events ('spawn', 'exit', 'close') until the shim has said
// whether the command runs, so that a refusal or an exec failure reaches the host as an
// 'error' event *before* 'exit' or 'close', as a failed spawn does in node.

const HELD = new Set(["spawn", "exit", "close"]);

/**
 * Starts holding `child`'s lifecycle events. Call `run()` once the command runs (the events
 * held are delivered in their order, and later ones pass), or `fail(error)` if it never ran
 * ('error' first; then 'close', while 'spawn' and 'exit' are dropped for good, since there
 * was no command to spawn or exit).
 */
export function holdLifecycle(child) {
  const hadOwnEmit = Object.hasOwn(child, "emit");
  const emit = child.emit;
  const held = [];
  let mode = "hold";
  let exited;
  const exit = new Promise((resolve) => {
    exited = resolve;
  });

  child.emit = function emitHeld(name, ...args) {
    if (mode === "hold" && HELD.has(name)) {
      held.push([name, args]);
      if (name === "exit") exited(args);
      return true;
    }
    if (mode === "failed" && (name === "spawn" || name === "exit")) return false;
    return emit.call(this, name, ...args);
  };

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
      else delete child.emit;
      flush(() => true);
    },
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
